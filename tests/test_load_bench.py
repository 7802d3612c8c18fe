"""bench/load.py's figures from recorded passes: the speedup's interval over passes
(benchlib.speedup_ci), a row's speedup over its interleaved control's (benchlib.relative_ci)
and the table an earlier run's JSON prints (no model runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import relative_ci, speedup_ci  # noqa: E402
from load import row_ci  # noqa: E402


def test_the_interval_holds_the_ratio_of_sums_and_narrows_with_agreeing_passes():
    # eight passes, (method seconds, target-only seconds): Σ target / Σ method = 0.97
    noisy = [(1.0, 0.90), (1.0, 1.05), (1.0, 0.93), (1.0, 1.00),
             (1.0, 0.95), (1.0, 0.99), (1.0, 0.92), (1.0, 1.02)]
    lo, hi = speedup_ci(noisy)
    point = sum(t for _, t in noisy) / sum(m for m, _ in noisy)
    assert lo < point < hi and 0.9 <= lo and hi <= 1.05
    assert speedup_ci(noisy) == (lo, hi)              # seeded: the same passes, the same
    calm = [(1.0, 0.97 + 0.002 * (i % 2)) for i in range(8)]
    c_lo, c_hi = speedup_ci(calm)
    assert c_hi - c_lo < (hi - lo) / 5
    # a long pass weighs more: the ratio is of sums, not a mean of ratios
    lo2, hi2 = speedup_ci([(9.0, 9.0), (1.0, 0.5)] * 4)
    assert lo2 < 0.95 < hi2 <= 1.0
    assert speedup_ci([(1.0, 1.0)]) is None and speedup_ci([]) is None


def test_a_row_recorded_before_wall_times_were_kept_uses_its_pass_ratios():
    old = {"per_pass_speedup": [0.9, 1.0, 0.95, 0.97]}
    lo, hi = row_ci(old)
    assert 0.9 <= lo < 0.955 < hi <= 1.0
    new = dict(old, per_pass_wall_s=[[1.0, 0.9], [1.0, 1.0], [1.0, 0.95], [1.0, 0.97]])
    assert row_ci(new) == (lo, hi)      # the same passes, each weighing the same
    assert row_ci({"per_pass_speedup": [0.9]}) is None


def test_the_table_of_a_recorded_run_prints_each_rows_interval(tmp_path):
    row = {"workload": "bad", "variant": "default", "competitors": 0, "speedup": 0.97,
           "per_pass_speedup": [0.9, 1.0, 0.95, 0.97], "mean_acceptance_length": 1.0,
           "identical": 24, "inputs": 24, "loadavg_before": [1.0], "seconds": 60.0, "rc": 0}
    recorded = tmp_path / "run.json"
    recorded.write_text(json.dumps({"rows": [row]}))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "load.py"), "--table-from",
                          str(recorded)], capture_output=True, text=True, check=True).stdout
    lo, hi = row_ci(row)
    assert "95% interval" in out.splitlines()[0]
    assert f"| bad | 0 | default | 0.97x | {lo:.2f}-{hi:.2f} | 0.90-1.00 |" in out


def test_a_row_over_its_control_divides_out_what_the_comparison_itself_reads():
    # in every pass the comparison reads target-only 3% faster than itself (e.g. its order),
    # and the row's method is 2% dearer than target-only on top; passes differ by ±15%
    swing = [1.0, 1.15, 0.9, 1.1, 0.85, 1.05, 0.95, 1.0]
    control = [(1.03 * s, s) for s in swing]
    row = [(1.03 * 1.02 * s, s * (1 + 0.02 * (-1) ** i)) for i, s in enumerate(swing)]
    point, lo, hi = relative_ci(row, control)
    assert point == pytest.approx(1 / 1.02, abs=0.005) and lo < point < hi
    assert hi < 1.0                         # the row costs something of its own
    own = sum(t for _, t in row) / sum(m for m, _ in row)
    assert own < lo                         # the row alone reads both costs
    assert relative_ci(row[:1], control[:1]) is None


def test_the_table_prints_a_row_over_its_interleaved_control(tmp_path):
    base = {"variant": "default", "competitors": 2, "mean_acceptance_length": 1.0,
            "identical": 12, "inputs": 12, "loadavg_before": [2.0], "seconds": 60.0, "rc": 0,
            "interleaved": True}
    bad = dict(base, workload="bad", speedup=0.9, per_pass_speedup=[0.8, 1.0],
               per_pass_wall_s=[[1.25, 1.0], [1.0, 1.0]])
    control = dict(base, workload="control", speedup=1.0, per_pass_speedup=[0.8, 1.25],
                   per_pass_wall_s=[[1.25, 1.0], [0.8, 1.0]])
    recorded = tmp_path / "run.json"
    recorded.write_text(json.dumps({"rows": [bad, control]}))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "load.py"), "--table-from",
                          str(recorded)], capture_output=True, text=True, check=True).stdout
    point, lo, hi = relative_ci([(1.25, 1.0), (1.0, 1.0)], [(1.25, 1.0), (0.8, 1.0)])
    assert f"| {point:.2f} [{lo:.2f}-{hi:.2f}] |" in out
    assert "| control | 2 | default | 1.00x |" in out and "÷ control" in out.splitlines()[0]
