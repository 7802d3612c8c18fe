"""What rounds cost in this process (``drafting.length: auto``, draft_length.py): D(k),
drafting k positions, and V(n), verifying and committing n fed tokens, each a decayed
least-squares line over this process's own timed rounds (``LinearCost``), a plain
one-token step timed apart (``RoundCosts``).

Timed with ``time.perf_counter`` around the drafter's ``propose`` and around verification
+ commit by the engine; no device synchronisation is added (each phase ends reading its
tokens back to the host, which waits for its kernels). A round timed over OUTLIER times
its prediction counts as that; until verification was seen at sizes far enough apart to
tell its slope, V is taken as flat, and after EXPLORE_AFTER rounds that did not tell it a
round drafts another length to measure it. Below the sizes it was fitted on, V's line is
held flat (``RoundCosts._line``).
"""

from __future__ import annotations

import math
from collections import deque

COST_DECAY = 0.95         # per round, the cost fits' weights
MIN_SPREAD = 1.0          # sizes' weighted standard deviation below which a slope is a guess
OUTLIER = 3.0             # a round timed over this many times its prediction counts as that
EXPLORE_AFTER = 32        # drafted rounds before one is drafted short to measure V's slope
# a batch's: its forward feeds every row, so V's slope is steep on a CPU (8 rows × 13
# tokens against 8 × 6) and a flat guess drafts every row long (batch_width.py)
BATCH_EXPLORE_AFTER = 2
RECENT = 9                # drafted rounds whose median time (over the line's) bounds D
SLOPE_T = 2.0             # a slope under this many of its standard errors is taken as none
MIN_FIT = 4               # rounds before a slope is fitted (two left to tell its error)


class LinearCost:
    """Seconds as a line in a round's size x (positions drafted, or tokens verified): a
    least-squares fit over the rounds seen, each weight decaying by ``decay`` per
    observation, so a machine that gets busier is followed within some tens of rounds.
    While the sizes seen are too alike (weighted spread < MIN_SPREAD) the slope is the last
    one fitted while they were not (``slope``: sizes, once told apart, keep their relative
    costs when every round settles on one length), or before any, ``fallback``: "flat"
    (T(x) = the mean: Remark 1, verification costs about the same for any k) or
    "proportional" (T(x) ∝ x: a draft step per position). A slope is shrunk towards 0 by
    its own uncertainty (b − SLOPE_T²·se²/b, se² the residual variance over the sizes'
    spread and the rounds' effective count; 0 while b is under SLOPE_T standard errors): on
    a busy machine two rounds a few sizes apart differ by more than their sizes explain,
    and an unshrunk slope from them can make verification look dear enough to draft short
    chains where long ones pay."""

    def __init__(self, fallback: str = "flat", decay: float = COST_DECAY) -> None:
        self.fallback = fallback
        self.decay = decay
        self.w = self.ww = self.x = self.xx = self.y = self.yy = self.xy = 0.0
        self.n = 0
        self.slope: float | None = None   # the last slope fitted over sizes told apart

    def observe(self, x: float, seconds: float) -> None:
        if self.n >= 3:   # one round the machine stalled must not set the line
            seconds = min(seconds, OUTLIER * self.at(x))
        self.n += 1
        d = self.decay
        self.w = d * self.w + 1.0
        self.ww = d * d * self.ww + 1.0
        self.x = d * self.x + x
        self.xx = d * self.xx + x * x
        self.y = d * self.y + seconds
        self.yy = d * self.yy + seconds * seconds
        self.xy = d * self.xy + x * seconds
        # a line through two or three rounds fits them (nearly) exactly, so its slope's error
        # cannot be told: beside two competitors, a draft line through one round of 1
        # position and one of 5 descheduled priced a position at several times its cost, and
        # the video's rounds drafted 3 where 5 pay (traced by hand in session 51's
        # bench/runs/2026-11-27/load-full-s51.txt run)
        if self.n >= MIN_FIT and self.spread() >= MIN_SPREAD:
            self.slope = self._fit()

    def _fit(self) -> float:
        """The weighted least-squares slope b, shrunk by its uncertainty, never below 0 (a
        round is never cheaper for being longer): b·(1 − (SLOPE_T / t)²), t = b / se, so 0
        for t ≤ SLOPE_T and b itself as t grows. Beside two competitors a round of the
        video target takes the same time whatever its size, or two to three times it when
        descheduled: a dozen rounds in, the slope came out several times its first rounds'
        at t = 1-1.5, which shrunk by b − se²/b (t = 1) still priced a verified token at
        up to ten times its cost, and rounds drafted 1-3 proposals where 5 pay (the
        describe-video row 1.37x, one pass 0.94x, against 1.69x beside one competitor:
        bench/runs/2026-11-27/load-full-s51.txt; the round times traced by hand)."""
        mean_x, mean_y = self.x / self.w, self.y / self.w
        var_x = self.xx / self.w - mean_x * mean_x
        cov = self.xy / self.w - mean_x * mean_y
        slope = cov / var_x
        if slope <= 0:
            return 0.0
        residual = max(self.yy / self.w - mean_y * mean_y - slope * cov, 0.0)
        count = self.w * self.w / self.ww              # the rounds' effective number
        se2 = residual / (var_x * max(count - 2.0, 1.0))
        return max(slope - SLOPE_T * SLOPE_T * se2 / slope, 0.0)

    @property
    def known(self) -> bool:
        return self.w > 0

    def spread(self) -> float:
        if not self.known:
            return 0.0
        mean = self.x / self.w
        return math.sqrt(max(self.xx / self.w - mean * mean, 0.0))

    def low(self) -> float:
        """The low end of the sizes the line was fitted on: their weighted mean less one
        standard deviation."""
        return self.x / self.w - self.spread() if self.known else 0.0

    def at(self, x: float) -> float:
        mean_x, mean_y = self.x / self.w, self.y / self.w
        if self.slope is not None:
            return max(mean_y + self.slope * (x - mean_x), 0.0)
        if self.fallback == "proportional" and mean_x > 0:
            return mean_y * x / mean_x
        return mean_y


class RoundCosts:
    """What rounds cost in this process: drafting by positions drafted (D), verifying and
    committing by tokens fed to the target (V). A plain step (one token fed) is timed
    apart from the rounds that feed several: on a CPU the fast path's one-token forward
    is markedly cheaper than any longer one (bench/runs/2026-11-23/profile-deep-cpu.json, the demo's
    target at 256 positions: V(2) = 1.23·V(1), V(8) = 1.25·V(1)), which a line through both
    would put near V(2), and a draft that is kept now and then (τ ≈ 1.1) would look as if
    it paid."""

    def __init__(self) -> None:
        self.draft = LinearCost("proportional")
        self.recent: deque[tuple[int, float]] = deque(maxlen=RECENT)   # (levels, seconds)
        self.verify = LinearCost("flat")    # rounds feeding the target 2 or more tokens
        self.plain = LinearCost("flat")     # rounds feeding it one
        self.ratio_w = self.ratio_sum = 0.0  # a plain step over the line's V(2) at its time
        self.draft_scale: float | None = None  # draft_s's median scale (None: to compute)
        self.two: float | None = None   # the line at two tokens (None: to compute), read by
                                        # every plain round: it moves only with the line

    def observe(self, levels: int, draft_s: float | None, fed: int, verify_s: float) -> None:
        """One round: ``draft_s`` for ``levels`` positions (None: not a clean measure, e.g.
        the draft first caught up on tokens decoded without it), ``verify_s`` for ``fed``
        tokens."""
        if draft_s is not None and levels > 0:
            self.draft.observe(levels, draft_s)
            self.recent.append((levels, draft_s))
            self.draft_scale = None
        if fed == 1 and self.verify.known:
            ratio = min(verify_s / max(self._two(), 1e-12), 1.0)
            self.ratio_w = COST_DECAY * self.ratio_w + 1.0
            self.ratio_sum = COST_DECAY * self.ratio_sum + ratio
        if fed == 1:
            self.plain.observe(fed, verify_s)
        else:
            self.verify.observe(fed, verify_s)
            self.two = None

    @property
    def timed(self) -> int:
        """Rounds timed so far (plain steps and drafted rounds)."""
        return self.verify.n + self.plain.n

    def draft_s(self, levels: int) -> float | None:
        """D(levels): the line, scaled down where the last RECENT rounds came in below it
        (their lower median time over the line's value at their own size, when below 1;
        the line's shape, e.g. a round's fixed catch-up, is kept). One stalled round moves
        a decayed mean for tens of rounds but not a median: one stall in the demo's
        drafting early in a process, a hundred times its rounds, had the line say drafting
        did not pay, and it went off (traced by hand in session 46: bench/history/RESULTS-until-2026-12-07.md)."""
        if not self.draft.known:
            return None
        if self.draft_scale is None:   # once per observed round, not per length priced
            line = self.draft
            ratios = sorted(s / max(line.at(x), 1e-12) for x, s in self.recent)
            self.draft_scale = min(1.0, ratios[(len(ratios) - 1) // 2])
        return self.draft.at(levels) * self.draft_scale

    def verify_s(self, fed: int) -> float | None:
        """V(fed): a plain step's own time for one token, the line through the longer
        rounds for more; each stands in for the other until it is measured."""
        if fed == 1 and self.plain.known:
            return self.plain.at(1)
        if self.verify.known:
            return self._line(fed)
        return self.plain.at(1) if self.plain.known else None

    def _line(self, fed: float) -> float:
        """The line through the longer rounds at ``fed`` tokens, held flat below the sizes
        it was fitted on (``LinearCost.low``). Verifying costs nearly the same for any
        small n on a CPU (V(2) = 1.23·V(1), V(8) = 1.25·V(1): the class's docstring), so a
        slope from rounds of 6-13 tokens says nothing of 2: beside two competitors the
        demo's first rounds (6-13 tokens fed, some descheduled) put V(2) at a third to a
        half of a plain step, a V(1) capped there (``plain_s``) priced every round under a
        plain step's gain, and a good draft decoded 98 of a process's 102 rounds plain
        (1.08x, against 2.0-3.0x in the runs beside it: bench/runs/2026-11-29/load-s56.txt)."""
        return self.verify.at(max(fed, self.verify.low()))

    def _two(self) -> float:
        if self.two is None:
            self.two = self._line(2)
        return self.two

    def plain_s(self, cautious: bool = False) -> float | None:
        """V(1), what a plain step costs: never more than the line through the longer
        rounds puts at two tokens (held flat below their sizes: ``_line``; feeding one
        token costs no more than feeding two; while drafting is on no plain step is timed,
        and the one that was can be a stall: a bad draft's round cut to one fed token by an
        EOS, timed well above the rounds around it early in a process, kept a bad draft
        drafting 15 rounds at a gain of 1.3-1.5); ``cautious``: at most that less the
        line's slope (its value one token lower), so a plain step timed while the machine
        was busier than when those rounds were (the costs are measured at
        different times) is not taken as what drafting would save. Where plain steps were
        timed beside the line, V(1) is the line's V(2) now times their ratio to it then: a
        request's context, or the machine's load, moves both, and a plain step timed
        rounds ago in a short request (about half a long request's rounds, in the mixed
        set; traced by hand in session 46: bench/history/RESULTS-until-2026-12-07.md) switched a good
        draft off."""
        v1 = self.verify_s(1)
        if v1 is not None and self.plain.known and self.verify.known:
            two = self._two()
            if self.ratio_w > 0:
                v1 = two * self.ratio_sum / self.ratio_w
            # cautious: the line one token below two (its slope's worth under V(2))
            v1 = min(v1, max(two - (self.verify.slope or 0.0), 0.0) if cautious else two)
        return v1

    def explore(self, k: int, budget: int, after: int = EXPLORE_AFTER) -> int:
        """``k``, or, while verification has not been seen at sizes far enough apart to tell
        its slope after ``after`` rounds (EXPLORE_AFTER; a batch's: BATCH_EXPLORE_AFTER), the size in 1..budget farthest from those seen
        (a round to measure it; once told, the slope is kept). Until then V is taken as flat
        (``LinearCost``'s fallback): rounds cut short by an EOS or by the token budget
        usually tell the slope for free, and a round drafted short only to measure costs
        the tokens it does not propose (on the demo, 30 rounds in all, one such round was
        3% of the run)."""
        if (not self.verify.known or self.verify.slope is not None
                or self.verify.n < after):
            return k
        seen = self.verify.x / self.verify.w - 1          # proposals of the mean round
        return max((1, budget), key=lambda size: abs(size - seen))
