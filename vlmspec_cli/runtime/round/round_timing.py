"""Where a method's decoding rounds spend their time, measured on real requests.

Eq. 1 needs T_q, the cost of drafting, next to T_p, the target's. For a separate draft model
that is one draft forward (runtime/fast/latency.py times it in isolation), but a hidden-state
head drafts from the target's features, a twig runs the target's first K layers plus its
own, a tree drafts level by level and TABED drafts several rows at once. So this module
times the engine the profile builds, on real requests: per round, the drafting phase (the
drafter's ``propose_rows``, the engine's one call to it) and the rest of the round (the target's verification and the
acceptance bookkeeping), with the device synchronised around each. Every method reports
its own cost this way, through the same code path users run.

Per round it records the drafting time, the rest, the proposals drafted (a tree's nodes)
and how deep they reach (a chain's length, a tree's depth): the drafting time per level is
the method's T_q, comparable with one target step T_p(1).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from vlmspec_cli.runtime.fast.latency import synchronize
from vlmspec_cli.runtime.round.round_policy import FixedLength
from vlmspec_cli.runtime.stats import SpecStats


@dataclass
class RoundTimes:
    draft_ms: list[float] = field(default_factory=list)    # per round: the drafter's propose
    verify_ms: list[float] = field(default_factory=list)   # per round: everything else
    drafted: list[int] = field(default_factory=list)       # proposals (a tree's nodes)
    levels: list[int] = field(default_factory=list)        # draft positions deep
    start_ms: list[float] = field(default_factory=list)    # per request: its start (prefills)
    new_tokens: int = 0
    stats: SpecStats = field(default_factory=SpecStats)     # the timed requests' acceptance
    outputs: list[list[int]] = field(default_factory=list)  # their tokens, in order

    def summary(self) -> dict:
        """Medians per round of the rounds that drafted, and the drafting cost per level."""
        drafting = [i for i, n in enumerate(self.drafted) if n > 0]
        if not drafting:
            return {"rounds": len(self.drafted), "rounds_drafting": 0}
        draft = [self.draft_ms[i] for i in drafting]
        verify = [self.verify_ms[i] for i in drafting]
        levels = sum(self.levels[i] for i in drafting)   # a round drafting has ≥ 1
        return {
            "rounds": len(self.drafted), "rounds_drafting": len(drafting),
            "draft_ms_per_round": round(statistics.median(draft), 4),
            "verify_ms_per_round": round(statistics.median(verify), 4),
            "drafted_per_round": round(sum(self.drafted[i] for i in drafting) / len(drafting), 3),
            "levels_per_round": round(levels / len(drafting), 3),
            # T_q of this method: drafting time per draft position (level), the median
            # over rounds (one slow round, a collection or a first call, does not skew it)
            "draft_ms_per_level": round(statistics.median(
                self.draft_ms[i] / max(1, self.levels[i]) for i in drafting), 4),
            "tokens_per_round": round(self.new_tokens / len(self.drafted), 3),
            # a whole drafting round as the engine decodes it (the draft's catch-up, the
            # target's forward and every bookkeeping step), and a request's start (the
            # prefills): medians, what calibrate's measured model predicts a request from
            "round_ms": round(statistics.median(d + v for d, v in zip(draft, verify)), 4),
            "start_ms": round(statistics.median(self.start_ms), 4) if self.start_ms else 0.0,
        }


def time_rounds(engine, requests: list, warmup: int = 1) -> RoundTimes:
    """Decode ``requests`` with ``engine`` (after ``warmup`` untimed ones), timing every round.
    The engine's drafter is wrapped for the call only and restored afterwards; so is an auto
    draft length set aside: every round drafts the full γ, the cost measured (auto could
    draft shorter, or not at all)."""
    device = engine.target.device
    drafter = engine.drafter
    policy = engine.policy
    engine.use_policy(FixedLength())
    propose_rows = drafter.propose_rows
    times = RoundTimes()
    last = {"ms": 0.0, "drafted": 0, "levels": 0}

    def timed_propose_rows(states, budgets):
        synchronize(device)
        t0 = time.perf_counter()
        proposals = propose_rows(states, budgets)
        synchronize(device)
        last["ms"] = (time.perf_counter() - t0) * 1000.0
        (proposal,) = proposals            # one request at a time
        last["drafted"] = len(proposal)
        last["levels"] = proposal.levels   # a tree's depth, a chain's length
        return proposals

    drafter.propose_rows = timed_propose_rows
    try:
        for req in requests[:warmup]:
            engine.generate(req)
        for req in requests:
            synchronize(device)
            t0 = time.perf_counter()
            state = engine.start(req)
            synchronize(device)
            times.start_ms.append((time.perf_counter() - t0) * 1000.0)
            while not state.done:
                last.update(ms=0.0, drafted=0, levels=0)   # a round with no room to draft
                synchronize(device)
                t0 = time.perf_counter()
                engine.step(state)
                synchronize(device)
                total = (time.perf_counter() - t0) * 1000.0
                times.draft_ms.append(last["ms"])
                times.verify_ms.append(total - last["ms"])
                times.drafted.append(last["drafted"])
                times.levels.append(last["levels"])
            engine.finish(state)
            times.new_tokens += len(state.tokens)
            times.stats.merge(state.stats)
            times.outputs.append(list(state.tokens))
    finally:
        del drafter.propose_rows   # the class's own method again
        engine.use_policy(policy)
    return times
