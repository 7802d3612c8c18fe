"""``vlmspec profile``'s steps and its sense checks (tasks/hwprofile.py runs them).

Steps: the measurements are known before the first one starts (thread counts, contexts ×
verify widths, batch rows, draft rows, rounds, compiled steps, video lengths), so progress
says "step i/N" and an ETA: the time so far over the weight of the steps done, times the
weight left. The weights are rough costs (a step decoding whole requests weighs more than
one timing a draft step); the ETA adapts to this machine as steps finish.

Sense checks: a wider verification cannot be cheaper than a narrower one on the same
kernels, so T_p(k) may not fall in k by more than NOISE; and Eq. 1's speedup cannot exceed
τ unless a round's verification costs less than a target-only step. Offending timings are
measured once more; what is still off is listed (``suspect``), never silently kept.
"""

from __future__ import annotations

import time
from typing import Callable

# a wider forward measured more than this much faster than a narrower one: not noise
NOISE = 0.10
# a CPU target's forwards of several rows run on (in, out) copies of its weights
# (runtime/fast/wide_rows.py: about twice as fast per product as its one-row step's), so
# T_p(k > 1) may be below T_p(1), but a whole forward (more than its products) not below half
WIDE_FLOOR = 0.5

# rough relative costs of one step of each kind (target forwards, about)
WEIGHTS = {"threads": 200.0, "prefill": 50.0, "verify": 150.0, "batch": 40.0, "draft": 2.0,
           "image": 200.0, "rounds": 60.0, "compile": 400.0, "compiled": 20.0, "frames": 60.0,
           "recheck": 40.0}


class Steps:
    """A str progress callback (what the runtime's measurements call, once per step) that
    reports "step i/N, ETA ~Xs: what" to ``report`` (the CLI's display, which may cut a
    long line's end)."""

    def __init__(self, kinds: list[str], report: Callable[[str], None] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.weights = [WEIGHTS[k] for k in kinds]
        self.report = report
        self.clock = clock
        self.done = 0
        self.start = clock()

    @property
    def total(self) -> int:
        return len(self.weights)

    def add(self, kind: str, n: int = 1) -> None:
        """Steps found on the way (re-measurements)."""
        self.weights += [WEIGHTS[kind]] * n

    def eta_s(self) -> float | None:
        """Seconds left after the steps done, from the time they took; None before one."""
        done = sum(self.weights[:self.done])
        if not self.done or done <= 0:
            return None
        return (self.clock() - self.start) / done * sum(self.weights[self.done:])

    def __call__(self, message: str) -> None:
        eta = self.eta_s()
        self.done += 1
        if self.done > self.total:    # a step no plan foresaw: counted, never past N
            self.weights.append(WEIGHTS["recheck"])
        if self.report is not None:
            self.report(f"step {self.done}/{self.total}"   # the ETA before what may be cut
                        + (f", ETA ~{duration(eta)}" if eta is not None else "") + f": {message}")


def duration(seconds: float) -> str:
    """45s, 2m05s."""
    s = max(0, round(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


def narrower_faster(row: dict[int, float], wide: bool) -> list[tuple[int, int]]:
    """(narrow, wide) widths of one context's T_p(k) where the wider forward measured more
    than NOISE faster than the slowest narrower one on the same kernels (``wide``: the
    target's several-row forwards run on other kernels than its one-row step: T_p(1) is
    then compared only against WIDE_FLOOR)."""
    out = []
    ks = sorted(row)
    for i, k in enumerate(ks):
        same = [j for j in ks[:i] if not (wide and j == 1)]
        if same:
            slowest = max(same, key=row.__getitem__)
            if row[k] < (1 - NOISE) * row[slowest]:
                out.append((slowest, k))
        if wide and k > 1 and 1 in row and row[k] < WIDE_FLOOR * row[1]:
            out.append((1, k))
    return out


def check_verify(verify_ms: dict[int, dict[int, float]], wide: bool,
                 remeasure: Callable[[int, list[int]], dict[int, float]],
                 steps: Steps | None = None) -> list[str]:
    """T_p(k) per context S checked (``narrower_faster``); the widths of an offending pair
    are timed again once (``remeasure(S, widths)``, into ``verify_ms``) and what is still
    off is returned, one plain phrase each."""
    suspect = []
    for s, row in verify_ms.items():
        pairs = narrower_faster(row, wide)
        if not pairs:
            continue
        ks = sorted({k for pair in pairs for k in pair})
        if steps is not None:
            steps.add("recheck")
            steps(f"timing {', '.join(map(str, ks))} tokens after {s} positions again "
                  "(a wider verification measured faster)")
        row.update(remeasure(s, ks))
        suspect += [f"T_p({hi}) {row[hi]:.3f} ms below T_p({lo}) {row[lo]:.3f} ms at S={s}"
                    for lo, hi in narrower_faster(row, wide)]
    return suspect


def check_eq1(expected: dict[str, dict[str, float]], wide: bool, verify_over_step: float,
              width: int) -> list[str]:
    """Eq. 1 speedups above their τ: a round gives at most τ tokens for at least one
    target forward, so only a verification cheaper than a target-only step can, and Eq. 1
    (which counts no round overhead) then overstates; each one is listed."""
    why = ""
    if verify_over_step < 1:
        why = (f" (T_p({width}) measured {verify_over_step:.2f} of T_p(1)"
               + (": this CPU target verifies several tokens on faster kernels than its "
                  "one-token step" if wide else "") + ")")
    return [f"Eq. 1 speedup at τ={tau}: {e[key]:.2f}x, above τ{why}"
            for tau, e in expected.items() for key in ("eq1", "eq1_measured_verify")
            if e[key] > float(tau) + 1e-9]
