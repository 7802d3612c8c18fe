"""The GPU one-shot stays runnable between GPU sessions: bench/gpu.py runs its whole code
at toy sizes on the CPU, and bench/gpu.sh says in one line that there is no GPU here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT


def test_gpu_bench_runs_at_toy_sizes(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny", "--no-compile",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-bench.json").read_text())
    failed = {k: v for k, v in report["sections"].items() if "error" in v or "skipped" in v}
    assert not failed
    for pair in ("llava15_7b", "qwen25_vl_7b"):
        assert sorted(map(int, report[pair]["verify"]["fast_ms"])) == [
            1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64]
        assert report[pair]["rounds"]["rounds_drafting"] > 0
        assert report[pair]["target_only"]["generate_ms_per_token"] > 0
    assert report["qwen25_vl_7b"]["prefill_large"]["visual_tokens"] == 64
    assert report["llava15_7b"]["prefill"]["visual_tokens"] == 16
    assert [r["pair"].split(" +")[0] for r in report["projections"]] == [
        "LLaVA-1.5-7B", "Qwen2.5-VL-7B", "Qwen2.5-VL-7B", "Qwen2.5-VL-7B"]
    assert all(r["eq1_prime"] > 0 for r in report["projections"])
    assert "Eq. 1'" in (tmp_path / "gpu-bench.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: gpu.sh would run")
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_gpu_sh_says_there_is_no_gpu_in_one_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 2
    assert proc.stdout.strip().count("\n") == 0 and "no CUDA GPU here" in proc.stdout
    assert proc.stderr == ""
    assert not (tmp_path / "out").exists()
