"""How ``vlmspec calibrate`` spends its ``--budget``: what to probe next, on how many samples,
which finalists to decode, and the step count and ETA its progress line shows.

The search's wall time is the fixed start (latency tables, target-only's run), the probes,
the finalists (each decoded beside target-only) and the batch sizes. Only the start is not
planned; the rest is sized from what was timed so far, so that the whole stays within the
budget plus one finalist's decode:

- a **finalist** costs about ``finalist_s``: one warm-up sample, then every sample by
  target-only and by the candidate, back to back (tasks/calibrate.py ``_paired``): at most
  twice target-only's run and a sample (a candidate slower than target-only costs more; the
  estimate grows with the probes' measured cost per sample when they are slower);
- the probing phase ends ``reserve`` before the budget: time for the profile's own finalist
  and the modelled best;
- every method family (chain, tree, TABED, each head kind, twig, ADT) is probed at least
  once: a family's first probe runs on as many samples as the time left allows (at least
  one), the later probes of a family only when whole samples fit, and are skipped (listed
  "budget") otherwise. On a busy machine the first pass still reaches every family, each
  on fewer samples, instead of spending the budget on the first two families' variants
  (issue: one family probed in 344 s of a 120 s budget).

Nothing here decodes: tasks/calibrate.py asks and reports (``probe_samples``, ``probed``,
``finalist_fits``, ``step``).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

# a finalist's samples are decoded (paired with target-only) this many times over at most,
# until target-only's side lasts MIN_PAIRED_S: one 16-token sample is a tenth of that on
# the 2-core CPU, where a busy moment moved a single pair's ratio by more than 10% (a useless draft's
# tree measured faster than target-only)
MIN_PAIRED_S = 0.5
MAX_PAIRED_REPEATS = 5


def paired_repeats(base_wall_s: float) -> int:
    """How many times a finalist's samples are decoded beside target-only."""
    if base_wall_s <= 0:
        return 1
    return max(1, min(MAX_PAIRED_REPEATS, math.ceil(MIN_PAIRED_S / base_wall_s)))


@dataclass
class SearchClock:
    budget_s: float
    say: Callable[[str], None]
    samples: int = 1                  # the samples a whole probe decodes
    base_wall_s: float = 0.0          # target-only over every sample (its run at the start)
    first_sample_s: float = 0.0       # target-only's first sample (a finalist's warm-up)
    steps: int = 0                    # planned steps (probes, finalists, batch sizes)
    done: int = 0
    start: float = field(default_factory=time.perf_counter)
    per_sample_s: list[float] = field(default_factory=list)   # each probe's wall ÷ its samples
    probed: set[str] = field(default_factory=set)             # families probed so far

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def over(self) -> bool:
        return self.left() <= 0

    def sample_s(self) -> float:
        """A probe's cost per sample (its session's build included), as timed so far;
        target-only's before any probe."""
        if self.per_sample_s:
            return statistics.median(self.per_sample_s)
        return self.base_wall_s / max(self.samples, 1)

    def finalist_s(self) -> float:
        """One finalist's measurement: a warm-up sample, target-only's run and the
        candidate's, the candidate's costing what a probe's samples cost (or less)."""
        candidate = max(self.sample_s() * self.samples, 0.5 * self.base_wall_s)
        return self.first_sample_s + paired_repeats(self.base_wall_s) * (self.base_wall_s + candidate)

    def reserve(self) -> float:
        """What the probing phase leaves to the finalists: the profile's own and the best."""
        return 2 * self.finalist_s()

    def probe_samples(self, family: str, families_left: int) -> int:
        """How many samples the next probe of ``family`` decodes (0: skip it, budget).
        ``families_left``: the families not probed yet, this one's included if it is one
        of them; each is kept a sample's time."""
        room = self.left() - self.reserve()
        if family in self.probed:
            room -= families_left * self.sample_s()
            return min(self.samples, int(room // self.sample_s())) if room > 0 else 0
        room -= (families_left - 1) * self.sample_s()
        return max(1, min(self.samples, int(room // self.sample_s()) if room > 0 else 1))

    def probed_family(self, family: str, wall_s: float, samples: int) -> None:
        self.probed.add(family)
        self.per_sample_s.append(wall_s / max(samples, 1))

    def finalist_fits(self) -> bool:
        """Whether another finalist ends within the budget (as estimated)."""
        return self.left() >= self.finalist_s()

    def step(self, what: str, probes: int, finalists: int) -> None:
        """Report the next step: "step 5/31 · acceptance of … · ~40 s left". ``probes`` and
        ``finalists``: the steps planned after this one's start (this one included), each
        probe priced as one of every sample, each finalist as ``finalist_s``; the total
        capped at the budget left plus a finalist."""
        self.done += 1
        guess = probes * self.sample_s() * self.samples + finalists * self.finalist_s()
        eta = max(0.0, min(guess, max(self.left(), 0.0) + self.finalist_s()))
        self.say(f"step {self.done}/{max(self.steps, self.done)} · {what} · ~{eta:.0f} s left")
