"""How ``vlmspec calibrate`` prices a candidate it has not decoded for real.

- ``LatencyModel``: the latency tables, T_p(k) (the target verifying k tokens) and T_q(B)
  (a draft-model step for B rows), from a hardware profile or timed by the calibration;
  Eq. 1 with the measured verification cost: τ·T_p(1) / (levels·step + T_p(nodes + 1)).
- ``RoundsModel``: with the tables timed by the calibration itself, a candidate is priced
  by its probe's own timed rounds instead (whole rounds and the prefills, as the engine
  runs them), the tables only saying how much cheaper a shorter γ's round is.
- ``tau_for_gamma``: a chain probe at the largest γ stands for every γ.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Run:
    """Samples decoded one at a time: the total wall time, each one's, outputs, stats."""

    wall: float
    walls: list[float]
    outputs: list[list[int]]
    stats: object


def tau_for_gamma(hist: list[int], gamma: int) -> float:
    """1 + E[min(k, γ)] over rounds that accepted k proposals (probed at a larger γ)."""
    rounds = sum(hist)
    return 1.0 + sum(n * min(k, gamma) for k, n in enumerate(hist)) / rounds if rounds else 1.0


class LatencyModel:
    """The latency tables. ``measured``: timed by this calibration (not a hardware
    profile's): each probe's own rounds then price its candidates (``RoundsModel``)."""

    def __init__(self, verify_ms: dict[int, float], draft_ms: dict[int, float],
                 level_ms: dict[str, float] | None = None, measured: bool = False,
                 prefill_ms: float = 0.0) -> None:
        self.verify_ms = dict(sorted(verify_ms.items()))
        self.draft_ms = dict(sorted(draft_ms.items()))
        self.level_ms = dict(level_ms or {})    # per method without a draft-model table
        self.measured = measured
        self.prefill_ms = prefill_ms            # the target's prefill of a sample request

    @staticmethod
    def _at(table: dict[int, float], x: int) -> float:
        """Linear interpolation in a table keyed by int (clamped at its ends)."""
        keys = list(table)
        if x <= keys[0]:
            return table[keys[0]]
        for lo, hi in zip(keys, keys[1:]):
            if x <= hi:
                return table[lo] + (table[hi] - table[lo]) * (x - lo) / (hi - lo)
        return table[keys[-1]]

    def step_ms(self, rows: int) -> float:
        """T_q(rows): one draft-model step for ``rows`` rows."""
        return self._at(self.draft_ms, rows)

    def round_ms(self, levels: float, nodes: float, step_ms: float) -> float:
        """levels·step + T_p(nodes + 1): a round drafts ``levels`` steps of ``step_ms`` and
        the target verifies the pending token and ``nodes`` proposals (forwards only)."""
        return levels * step_ms + self._at(self.verify_ms, round(nodes) + 1)

    def verify_line(self) -> tuple[float, float]:
        """(intercept, slope ≥ 0) of a least-squares line through the table's T_p(k), k ≥ 2.
        Timed now on a busy machine one entry can be a fifth off or more (medians of 7
        forwards; by hand, two tables in a row); the line through all of them much less. With fewer than two such entries: flat at their mean (or T_p(1))."""
        points = [(k, v) for k, v in self.verify_ms.items() if k >= 2]
        if len(points) < 2:
            return (points[0][1] if points else self._at(self.verify_ms, 1)), 0.0
        mk = statistics.fmean(k for k, _ in points)
        mv = statistics.fmean(v for _, v in points)
        spread = sum((k - mk) ** 2 for k, _ in points)
        slope = max(sum((k - mk) * (v - mv) for k, v in points) / spread, 0.0)
        return mv - slope * mk, slope

    def line_round_ms(self, levels: float, nodes: float, step_ms: float) -> float:
        """``round_ms`` with verification from ``verify_line``, never below T_p(1) (a
        steep line from one slow entry must not price a round's verification at ≤ 0)."""
        intercept, slope = self.verify_line()
        verify = max(intercept + slope * (nodes + 1), self._at(self.verify_ms, 1))
        return levels * step_ms + verify

    def speedup(self, tau: float, levels: float, nodes: float, step_ms: float) -> float:
        """τ·T_p(1) / round_ms: Eq. 1 with the measured verification cost."""
        return tau * self._at(self.verify_ms, 1) / self.round_ms(levels, nodes, step_ms)

    def with_prefill(self, speedup: float, requests: int, tokens: int) -> float:
        """A decode-only speedup (Eq. 1) over whole requests: ``requests`` prefills of
        ``prefill_ms`` that both sides pay and ``tokens`` target steps of T_p(1) that the
        method decodes ``speedup`` times faster (Amdahl). The demo's six captions of ~20
        tokens spend about a tenth of target-only's time prefilling: left out, Eq. 1 ranks
        the same but predicts high. Unchanged without a prefill time (0)."""
        if not self.prefill_ms or tokens <= 0 or speedup <= 0:
            return speedup
        prefill, decode = requests * self.prefill_ms, tokens * self._at(self.verify_ms, 1)
        return (prefill + decode) / (prefill + decode / speedup)

    def predicted_speedup(self, tau: float, gamma: int, rows: int) -> float:
        return self.speedup(tau, gamma, gamma, self.step_ms(rows))

    def predicted_tree_speedup(self, tau: float, depth: int, top_k: int, nodes: int) -> float:
        """A round drafts ``depth`` levels of up to ``top_k`` rows and verifies nodes + 1."""
        return self.speedup(tau, depth, nodes, self.step_ms(top_k))

    @classmethod
    def from_hardware(cls, hardware, profile=None) -> "LatencyModel | None":
        """The tables of an included hardware profile, or None (none, or, with ``profile``,
        measured for other models: ``hardware_mismatch``)."""
        if profile is not None and hardware_mismatch(profile):
            return None
        m = hardware.measurements if hardware is not None else None
        if not isinstance(m, dict) or not m.get("target_verify_ms"):
            return None
        verify = next(iter(m["target_verify_ms"].values()))       # the sample prompt's S
        draft = {int(b): next(iter(row.values())) for b, row in (m.get("draft_step_ms") or {}).items()}
        levels = dict(m.get("draft_level_ms") or {})
        rounds = m.get("rounds") or {}
        if rounds.get("method") and rounds.get("draft_ms_per_level") is not None:
            levels.setdefault(rounds["method"], rounds["draft_ms_per_level"])
        return cls({int(k): float(v) for k, v in verify.items()}, draft,
                   {k: float(v) for k, v in levels.items()},
                   prefill_ms=float(hardware.prefill_ms or 0.0))


def hardware_mismatch(profile) -> str | None:
    """Why the hardware profile ``profile`` includes does not time its models, or None: its
    tables were measured for another target or draft (as `vlmspec profile` records them;
    files written before it did say only the profile's name, and pass). The 32-layer
    target's tables priced tinyworld-small's (8 layers) candidates, and calibrate's
    predictions came out 60% off."""
    m = profile.hardware.measurements if profile.hardware is not None else None
    if not isinstance(m, dict):
        return None
    for role in ("target", "draft"):
        measured, here = m.get(role), getattr(profile, role).model
        if measured and here and measured != here:
            return (f"the hardware profile's tables were measured for {role} '{measured}' "
                    f"(profile {m.get('profile', '?')}), this profile's {role} is '{here}': "
                    f"its tables are not used, latency is measured here")
    return None


@dataclass
class RoundsModel:
    """The samples decoded as a probe's own timed rounds decoded them (latency measured by
    this calibration): a candidate's wall over the samples is n·start + (N / τ)·round·s
    (start and round: the probe's medians, a request's prefills and a whole drafting round
    as the engine runs it, the draft catching up and every bookkeeping step with the
    forwards; N: the tokens target-only decoded; τ: the candidate's tokens per round; s: its
    round's share of the probe's, from the tables, ``LatencyModel.line_round_ms`` of the
    levels and proposals each drafts: 1 at the probe's own γ, less for a shorter γ of a
    chain probe), and its speedup target-only's measured wall over that. The tables alone
    (Eq. 1, forwards only) leave out the engine's own time per round and the prefills: on
    the 2-core CPU they predicted the finalists 39% (the demo) and 75% (real photos) too fast
    on average, and three draft trees measured at 1.8-2.0x came before a head's tree
    measured at 2.6x (bench/runs/2026-11-27/calibrate-ab-s49/). A share, not the tables' difference: timed
    in a busy moment the tables once priced 7 levels and proposals above a whole round of
    the probe's, and every shorter γ came out at the prefills' speed (8.00x)."""

    base_wall_ms: float     # target-only over the samples, measured
    tokens: int             # what target-only decoded (every lossless candidate's too)
    requests: int
    start_ms: float
    round_ms: float

    @classmethod
    def of_probe(cls, base_run: Run, summary: dict) -> "RoundsModel | None":
        if "round_ms" not in summary or base_run.wall <= 0 or not base_run.stats.new_tokens:
            return None     # a probe that never drafted: the tables price it
        return cls(base_run.wall * 1000.0, base_run.stats.new_tokens, len(base_run.walls),
                   summary["start_ms"], summary["round_ms"])

    def speedup(self, tau: float, share: float = 1.0) -> float:
        wall = self.requests * self.start_ms + self.tokens / max(tau, 1e-9) * self.round_ms * share
        return self.base_wall_ms / wall
