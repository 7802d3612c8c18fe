"""The round policy: how many proposals each row's round drafts, and when the drafter is
prefilled. The engine (engine.py) asks it two things a round — ``plan`` (k per row) and
``observe`` (a ``RoundRecord``: what the round did) — and hands it each request's start
(``prefill``) and end (``finish``).

Two policies, one per ``drafting.length``:

- ``FixedLength`` (``fixed``): every round drafts its budget (γ, less near the token
  limit); the drafter is prefilled with the target.
- ``AutoLength`` (``auto``): the length model of draft_length.py (``AutoGamma``: Eq. 1'
  online) chooses k per round, 0 while drafting does not pay; a drafter that can wait
  (``Drafter.late_prefill``) is prefilled at its request's first drafted round, if any; a
  request whose rounds are all plain whatever it emits (``plain_throughout``, from its
  start, or ``plain_from_here``: drafting off past its last round) runs as target-only
  does; a drafter that reads its own confidence (``Drafter.reads_confidence``) gets the
  rule that may end its chain short of k (``DecodeState.draft_stop``, draft_stop.py). In
  a batch each row chooses by its own length model (``row_model``): k per row, 0 for a
  row whose drafting does not pay, in the same target forward.

Lossless either way: k is decided before the round from earlier rounds only, and every
token emitted is still the target's (verify.py).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

from vlmspec_cli.runtime.round.draft import Drafter
from vlmspec_cli.runtime.length.batch_width import batch_width, cap_rows
from vlmspec_cli.runtime.length.draft_length import WARMUP_ROUNDS, AutoGamma, rounds_left
from vlmspec_cli.runtime.request import DecodeState


@dataclass(frozen=True)
class RoundRecord:
    """What one row's round did: it chose ``k``, drafted ``levels`` positions (a chain's
    length, a tree's depth; before an EOS cut) in ``draft_s`` (the choice and a late prefill
    included), fed the target ``fed`` tokens, verified ``drafted`` positions deep and kept
    ``accepted``, verifying and committing in ``verify_s``. ``dropped``: the draft's
    confidence in the first proposal it drafted and did not propose (a chain its confidence
    ended), else None; ``stopped``: that chain ended short of k."""

    k: int
    levels: int
    fed: int
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    dropped: float | None = None
    stopped: bool = False


# prefills the drafter for a request (at the prefill's thread count when the rounds have
# begun: ``late``); returns the seconds it took. The engine's: it knows the threads.
PrefillDraft = Callable[[DecodeState, bool], float]


class FixedLength:
    """``drafting.length: fixed``: every round drafts its budget; the drafter is prefilled
    with the target, before the first round."""

    def __init__(self) -> None:
        self.drafter = Drafter()
        self.prefill_draft: PrefillDraft = lambda state, late: 0.0

    def bind(self, drafter: Drafter, prefill_draft: PrefillDraft) -> None:
        """The engine's drafter, and how the engine prefills it."""
        self.drafter, self.prefill_draft = drafter, prefill_draft

    def prefill(self, state: DecodeState, prefill_target: Callable[[], None]) -> None:
        """A request's prefill: the drafter's work that overlaps the target's (``prepare``),
        the target's (``prefill_target``), then the drafter's."""
        self.drafter.prepare(state)
        prefill_target()
        self.prefill_draft(state, False)

    def admit(self, state: DecodeState) -> None:
        """A request joins a batch as a row (SpeculativeEngine.run), target and drafter
        prefilled."""

    def plan(self, states: list[DecodeState], budgets: list[int]) -> list[int]:
        """The proposals each row drafts this round, k_b ≤ budgets[b] (0: a plain step)."""
        return [max(n, 0) for n in budgets]

    def observe(self, state: DecodeState, record: RoundRecord) -> None:
        """What a row's round did (after its commit)."""

    def finish(self, state: DecodeState) -> None:
        """After a request's last round."""


class AutoLength(FixedLength):
    """``drafting.length: auto``: ``auto`` (draft_length.AutoGamma) chooses each round's k
    from this request's acceptance and this process's round costs, and owns when a drafter
    that can wait is prefilled."""

    def __init__(self, auto: AutoGamma) -> None:
        super().__init__()
        self.auto = auto
        # a batch's round (rows with their own length models): its rows' records, timed
        # once as the batch's when the last row's is in (``_observe_batch``)
        self.batch: list[RoundRecord] = []
        self.batch_rows = 0
        self.batch_clean = True
        self.batch_rounds = 0

    def bind(self, drafter: Drafter, prefill_draft: PrefillDraft) -> None:
        """As FixedLength's; a head whose prefill waits reads the target's states the engine
        keeps for it each plain round until then: its probes come at a request's start
        (``AutoGamma.probe_first``)."""
        super().bind(drafter, prefill_draft)
        self.auto.probe_first = (drafter.late_prefill and drafter.hidden_layer is not None
                                 and not drafter.runs_target)

    def prefill(self, state: DecodeState, prefill_target: Callable[[], None]) -> None:
        """A drafter that can wait is prefilled at the request's first drafted round, if any
        (``state.draft_deferred``): never when the request decodes plain (a draft dearer
        than the target, e.g. a 4-bit copy of it on a CPU, paid its prefill for nothing in
        every request that started with drafting on). But the process's first request drafts
        its first drafted round whatever it costs (nothing is measured yet): its drafter is
        prefilled now, timed against the target's prefill (``AutoGamma.dear``: a draft whose
        prefill is the dearer starts with one proposal)."""
        auto = self.auto
        auto.start(state)
        measure = self.drafter.late_prefill and auto.measures_prefill
        state.draft_deferred = self.drafter.late_prefill and not measure
        state.plain_throughout = state.draft_deferred and plain_throughout(auto, state)
        t0 = time.perf_counter()
        if not (state.draft_deferred and auto.off):   # (off: this request likely decodes plain)
            self.drafter.prepare(state)   # e.g. start the captioner alongside the prefill
        prefill_target()
        target_s = time.perf_counter() - t0
        if not state.draft_deferred:
            draft_s = self.prefill_draft(state, False)
            if measure:
                auto.note_prefill(draft_s, target_s)

    def plan(self, states: list[DecodeState], budgets: list[int]) -> list[int]:
        """k per row from ``AutoGamma.choose``, but for a request's first round, which is
        free: its token comes from the prefill's logits (the target's distribution after the
        prompt, already computed), with no forward, and drafting starts from it in the next
        round. A first round that drafted would check its first proposal against those same
        logits; when that proposal is wrong the round's whole forward buys the one token the
        prefill had given, and when it is right the round emits what the free token and a
        round one proposal shorter emit, for the same forward width and draft steps: the
        free round is never worse. At T > 0 the first token is drawn from the prefill's
        distribution, the target's law. The free round is neither chosen nor observed.
        A row that drafts while its drafter waits is prefilled first (it catches up on the
        tokens decoded without it)."""
        if len(states) == 1 and states[0].length.model is None:   # a request alone
            state = states[0]
            if not state.plain_throughout and plain_from_here(self.auto, state):
                state.plain_throughout = True
            if state.plain_throughout:
                return [self._plain(state, budgets[0])]
        ks = []
        for state, budget in zip(states, budgets):
            state.length.chose = state.target_next_logits is None
            auto = self._model(state)
            ks.append(auto.choose(state, budget) if state.length.chose and budget > 0 else 0)
        if states and states[0].length.model is not None:    # a batch's rows
            # one width for the round: the widest row sets every row's cost (batch_width.py)
            ks = cap_rows(states, ks, batch_width(states, ks, self.auto))
            # the drafting is timed clean when no drafting row catches up on plain rounds
            self.batch, self.batch_rows = [], len(states)
            self.batch_clean = all(k == 0 or st.length.previous > 0 for st, k in zip(states, ks))
        for state, k in zip(states, ks):
            if k > 0 and state.draft_deferred:
                self.auto.note_prefill(self.prefill_draft(state, True))
                state.draft_deferred = False
        # a request alone may end its chain short of k by the draft's confidence (a drafter
        # that reads it; the rule is built for no other); not a batch's last row left,
        # which drafts in the batch's cache, not in a cache of its own
        stops = (len(states) == 1 and states[0].length.model is None
                 and self.drafter.reads_confidence)
        for state, k in zip(states, ks):
            state.draft_stop = self.auto.stop_rule(state, k) if stops else None
        return ks

    def _plain(self, state: DecodeState, budget: int) -> int:
        """A round of a request decoded plain throughout (``plain_throughout``): what
        ``AutoGamma.choose`` does there, a plain round off the wait, without its pricing."""
        state.length.chose = state.target_next_logits is None
        if state.length.chose and budget > 0:
            self.auto.wait = max(self.auto.wait - 1, 0)
            state.length.count(0)
        state.draft_stop = None
        return 0

    def observe(self, state: DecodeState, record: RoundRecord) -> None:
        """The round's costs and acceptance, for the next k (acceptance by position: a
        tree's depth drafted, not its nodes)."""
        if state.length.chose:
            r, model = record, self._model(state)
            if state.length.model is None and model.untimed(state, r.k):   # (a request alone)
                return
            model.observe(state, r.k, levels=r.levels, fed=r.fed, drafted=r.drafted,
                          accepted=r.accepted, draft_s=r.draft_s, verify_s=r.verify_s,
                          dropped=r.dropped, stopped=r.stopped)
        if state.length.model is not None:
            self.batch.append(record)
            if len(self.batch) == self.batch_rows:
                self._observe_batch(self.batch)

    def _observe_batch(self, records: list[RoundRecord]) -> None:
        """A batch's round, timed once: its cost is the batch's (one draft forward per
        position for every row, one target forward as wide as the widest row's feed), so
        the process's cost lines take it at its widest row's levels and feed, and the
        rows' models price a length by them (``RowCosts``). Per row, the lines would take
        the whole round's time at each row's own size: flat, a long chain looking as cheap
        as a short one (every row then drafted long, 0.78x target-only batched where a
        fixed γ = 5 made 1.25x: bench/runs/2026-12-07/scale-folder-auto-length-1.txt)."""
        self.batch_rounds += 1
        fed = max(r.fed for r in records)
        if self.batch_rounds <= WARMUP_ROUNDS or fed < 1:
            return
        levels = max(r.levels for r in records)
        draft_s = records[0].draft_s if self.batch_clean else None
        self.auto.costs.observe(levels, draft_s, fed, max(r.verify_s for r in records))

    def admit(self, state: DecodeState) -> None:
        """A batch's row chooses its k by its own length model (``row_model``): rows
        differ in acceptance, and one whose drafting does not pay decodes plain while the
        others draft. Its drafter was prefilled at admission (nothing deferred)."""
        row = row_model(self.auto)
        row.start(state)
        state.length.model = row

    def _model(self, state: DecodeState) -> AutoGamma:
        """The length model that decides ``state``'s rounds: its row's, or the process's."""
        return (state.length.model if state.length is not None else None) or self.auto

    def finish(self, state: DecodeState) -> None:
        auto = self._model(state)
        auto.finish(state)
        if auto is not self.auto:     # a batch's row: the process goes on where it left off
            adopt(self.auto, auto)


def plain_throughout(auto: AutoGamma, state: DecodeState) -> bool:
    """The request starting now (its draft not prefilled) will decode every round plain
    whatever it emits: drafting is ruled out, or it is off with more plain rounds to wait
    than the request can choose (at most max_new_tokens - 2: the first token is the
    prefill's, the last round has no budget) and the process's acceptance does not resume
    it at the request's start (``AutoGamma._rejudge``'s test; judged here at its first
    token, where the draft's prefill weighs least on the gain, so the rejudge at its first
    chosen round would not resume it either). Such a request decodes as target-only does:
    no hidden states handed over (a useless EAGLE-3 head's three layers, copied every
    round, were 1-2% of a tiny target's step), no length chosen (``AutoLength._plain``)."""
    if auto.ruled_out is not None:
        return True
    rounds = state.request.max_new_tokens - 2      # the most it can choose a k for
    if auto.wait < max(rounds, 1):                 # (wait 0: a probe is due)
        return False
    budget = min(auto.ceiling, rounds)             # its first chosen round's
    return budget < 1 or not auto.resumes(state.length, budget, auto.prefill_overhead(state))


def plain_from_here(auto: AutoGamma, state: DecodeState) -> bool:
    """Drafting went off in this request's last round, or earlier, with more plain rounds
    to wait than the request has left (a plain round emits one token; the last has no
    budget): the rest is plain whatever it emits (the wait is judged again only at a new
    request), so from here on it runs as target-only does (``plain_throughout``)."""
    return state.length.previous == 0 and auto.wait >= rounds_left(state)


def row_model(auto: AutoGamma) -> AutoGamma:
    """A batch row's own length model: its own on/off state, probes and backoff (and its own
    acceptance: ``AutoGamma.start``), so each row's k follows its own acceptance. It starts
    where the process stands (on or off, its backoff and rate) and shares the process's
    acceptance prior and round costs, which time a batch's round as the batch's, at its
    widest row (``AutoLength._observe_batch``): a row drafts k only while its expected
    tokens pay for a batch round that wide."""
    row = copy.copy(auto)
    row.probing = False
    row.costs = RowCosts(auto.costs)
    return row


class RowCosts:
    """A batch row's view of the process's round costs: it reads them and observes
    nothing; the policy times each batch round once (``AutoLength._observe_batch``)."""

    def __init__(self, costs) -> None:
        self.costs = costs

    def observe(self, *args) -> None:
        pass

    @property
    def timed(self) -> int:
        return self.costs.timed

    def draft_s(self, levels: int) -> float | None:
        return self.costs.draft_s(levels)

    def verify_s(self, fed: int) -> float | None:
        return self.costs.verify_s(fed)

    def plain_s(self, cautious: bool = False) -> float | None:
        return self.costs.plain_s(cautious)

    def explore(self, k: int, budget: int, *after: int) -> int:
        return self.costs.explore(k, budget, *after)


def adopt(auto: AutoGamma, row: AutoGamma) -> None:
    """A batch's row finished: the process goes on where that row left off (on or off, its
    backoff, probe cost and rate), as after a request decoded alone."""
    auto.wait, auto.backoff, auto.probe_due, auto.on = row.wait, row.backoff, row.probe_due, row.on
    auto.carried = row.carried
    auto.probe_cost, auto.tokens_w, auto.seconds_w = row.probe_cost, row.tokens_w, row.seconds_w
    auto.request_tokens, auto.rounds = row.request_tokens, row.rounds
