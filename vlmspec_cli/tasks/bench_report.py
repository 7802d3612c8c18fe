"""``vlmspec bench``'s numbers, per category and overall, from its records (this run's and
those a resumed ``--out`` already held).

Per category and method, over the samples both it and target-only (``none``) decoded:

- **MAT** (Mean Accepted Tokens; vLLM's JSON names it ``mean_acceptance_length``): tokens
  emitted per verification round, 1 + accepted / rounds (runtime/stats.py
  ``mean_accept_len``: every round, drafted or not, adds the target's own token). 1 for
  target-only.
- **speedup**: walltime speedup vs target-only, Σ target-only wall / Σ method wall over
  the same samples (MMSpec's Walltime Speedup Ratio).
- **tokens/s**: Σ new tokens / Σ wall (throughput).
- **p50 / p90**: per-request latency (one request = one reply of a conversation), not
  the same thing as throughput.
- **identical**: at T = 0, samples whose every reply has target-only's tokens (each a
  SHA-256 of the token ids), out of those compared; every lossless method must be N/N.
  At T > 0 two samples differ by design: "n/a (T > 0)".
- **acceptance per position**: rounds whose draft token i was accepted / rounds.

No click or rich.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vlmspec_cli.runtime.stats import SpecStats

OVERALL = "overall"


@dataclass
class ReportRow:
    category: str
    method: str
    label: str
    lossless: bool
    describe: str = ""          # its models and shape (DraftingMethod.describe)
    samples: int = 0
    requests: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    mat: float = 0.0
    accept_per_pos: list[float] = field(default_factory=list)
    speedup: float | None = None
    tokens_per_s: float = 0.0
    p50_s: float | None = None
    p90_s: float | None = None
    identical: int | None = None      # None: not compared (T > 0, or the reference itself)
    compared: int = 0

    @property
    def mismatched(self) -> int:
        return 0 if self.identical is None else self.compared - self.identical

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["mean_acceptance_length"] = d.pop("mat")
        return d


@dataclass
class BenchReport:
    rows: list[ReportRow]
    categories: list[str]
    methods: list[str]
    greedy: bool
    reference: str

    def mismatches(self) -> list[ReportRow]:
        """Lossless rows that differ from target-only somewhere (T = 0), overall rows."""
        return [r for r in self.rows if r.category == OVERALL and r.lossless and r.mismatched]


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latest(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(method, sample source) -> its record: successful ones, the last of repeats."""
    out = {}
    for r in records:
        if r.get("error") is None and r.get("method") is not None and r.get("turns"):
            out[(r["method"], r["source"])] = r
    return out


def _hashes(record: dict) -> list[str]:
    return [t.get("tokens_sha256") for t in record["turns"]]


def _row(category: str, method: str, recs: list[dict], ref: dict[str, dict], greedy: bool,
         is_ref: bool) -> ReportRow:
    first = recs[0]
    config = (first.get("settings") or {}).get("method") or {}
    row = ReportRow(category, method, first.get("label", method), bool(first.get("lossless")),
                    config.get("describe", ""))
    stats = SpecStats()
    latencies, base_wall, own_wall = [], 0.0, 0.0
    for r in recs:
        stats.merge(SpecStats.from_dict(r["stats"]))
        latencies += [t["latency_s"] for t in r["turns"]]
        row.new_tokens += r["new_tokens"]
        row.wall_s += r["wall_s"]
        base = ref.get(r["source"])
        if base is not None:
            base_wall += base["wall_s"]
            own_wall += r["wall_s"]
            row.compared += 1
            row.identical = (row.identical or 0) + (_hashes(base) == _hashes(r))
    row.samples, row.requests = len(recs), len(latencies)
    row.mat = round(stats.mean_accept_len, 4)
    row.accept_per_pos = [round(c / stats.num_drafts, 4) for c in stats.accepted_per_pos
                          ] if stats.num_drafts else []
    row.speedup = round(base_wall / own_wall, 4) if own_wall > 0 and row.compared else None
    row.tokens_per_s = round(row.new_tokens / row.wall_s, 2) if row.wall_s > 0 else 0.0
    row.p50_s, row.p90_s = percentile(latencies, 0.5), percentile(latencies, 0.9)
    if is_ref or not greedy:
        row.identical = None
    return row


def build_report(records: list[dict], methods: list[str], greedy: bool, reference: str,
                 categories: list[str] | None = None) -> BenchReport:
    """The table's rows: per category (in ``categories`` order, else first appearance)
    every method with records, then the overall rows."""
    by_key = latest(records)
    found = list(dict.fromkeys(r["category"] for r in by_key.values()))
    order = [c for c in (categories or []) if c in found] + [c for c in found
                                                              if c not in (categories or [])]
    ref_all = {src: r for (m, src), r in by_key.items() if m == reference}
    rows = []
    for category in order + [OVERALL]:
        for method in methods:
            recs = [r for (m, _), r in by_key.items()
                    if m == method and category in (OVERALL, r["category"])]
            if recs:
                rows.append(_row(category, method, recs, ref_all, greedy, method == reference))
    return BenchReport(rows, order, methods, greedy, reference)



def report_png(report: BenchReport, title: str = "vlmspec bench") -> bytes:
    """Speedup per category (and overall) per method, each bar marked with its MAT."""
    from vlmspec_cli.plot import Bars, bar_chart_png

    groups = report.categories + [OVERALL]
    series = []
    for method in report.methods:
        rows = {r.category: r for r in report.rows if r.method == method}
        if not rows:
            continue
        series.append(Bars(method, [rows[g].speedup if g in rows else None for g in groups],
                           [f"MAT {rows[g].mat:.2f}" if g in rows else "" for g in groups]))
    return bar_chart_png(groups, series, title=title, ylabel="walltime speedup vs target-only",
                         reference=1.0, reference_label="target-only (1x)")


__all__ = ["OVERALL", "BenchReport", "ReportRow", "build_report", "percentile", "report_png"]
