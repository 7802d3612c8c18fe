"""A chain ended by the draft's confidence (runtime/length/draft_stop.py, ``drafting.length:
auto``): the rule's arithmetic by hand, the acceptance it reports, and the engine with
chains ended at every length (none proposed included) lossless at T = 0 (token for token
against the target's greedy ``generate()``) and at T > 0 (chi-square against the target's
exact distribution)."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import fresh_scenes
from test_draft_length import Costs, use_auto
from test_lossless import reference
from test_sampling_lm import _assert_samples_follow_target, tiny_pair  # noqa: F401 (fixture)
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.runtime.length import draft_stop
from vlmspec_cli.runtime.length.acceptance import Acceptance
from vlmspec_cli.runtime.length.draft_length import AutoGamma
from vlmspec_cli.runtime.length.draft_stop import ChainStop
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.length.round_costs import RoundCosts
from vlmspec_cli.runtime.round.verify import SamplingParams

MS = 1e-3


def _rule(margin: float = 1.0) -> ChainStop:
    # R = 100 tokens a second (0.1 a ms); a plain step 10 ms, verifying n + 1 tokens
    # 12 + 0.3·(n − 1) ms; each further position 0.2 ms to draft and 0.3 ms to verify
    price = [10 * MS] + [(12 + 0.3 * (n - 1)) * MS for n in range(1, 6)]
    return ChainStop(100.0, [0.8] * 5, [0.5 * MS] * 4, price, margin)


def test_the_prefix_verified_maximises_tokens_less_their_price():
    rule = _rule()
    # W(0) = −1 (a plain step at R = 0.1 / ms); W(1) = 0.9 − 1.2 = −0.3;
    # W(2) = 1.4 − 1.23 = 0.17; W(3) = 1.45 − 1.26 = 0.19: all three
    assert rule.keep([0.9, 0.5, 0.05]) == 3
    # W(3) = 1.41 − 1.26 = 0.15 < W(2): the third is not worth its 0.3 ms
    assert rule.keep([0.9, 0.5, 0.01]) == 2
    # a first proposal at 0.1: W(1) = 0.1 − 1.2 < W(0), a plain step is the better use
    assert rule.keep([0.1]) == 0
    # and whatever follows a first proposal that unlikely cannot pay for the round's 2 ms
    assert rule.keep([0.1, 0.05, 0.02]) == 0
    assert rule.keep([]) == 0


def test_drafting_goes_on_while_the_next_position_pays():
    rule = _rule()
    # the next position pays when S · h (0.8) ≥ R · 0.5 ms = 0.05: S ≥ 0.0625
    assert rule.more(1, 0.07)
    assert not rule.more(1, 0.06)
    assert rule.more(4, 0.9)
    assert not rule.more(5, 0.9)          # the budget (5 proposals) is reached
    # a margin asks each position for that much over its price
    assert not _rule(margin=1.2).more(1, 0.07)
    assert draft_stop.MARGIN == 1.0


def test_built_from_the_round_costs_and_none_before_they_are_known():
    costs = RoundCosts()
    policy = AutoGamma(6, costs=costs)
    state = type("S", (), {"length": None})()
    policy.start(state)
    assert policy.stop_rule(state, 6) is None          # no round timed, no rate
    for k in (2, 6, 3, 5, 4, 6):
        policy.observe(state, k, levels=k, fed=k + 1, drafted=k, accepted=k // 2,
                       draft_s=k * 0.4 * MS, verify_s=(12 + 0.3 * k) * MS)
    rule = policy.stop_rule(state, 6)
    assert rule is not None and policy.stop_rule(state, 0) is None
    # R: the rounds' tokens over their time, the last counting most
    assert 150 < policy.rate < 320
    # priced by the lines: a plain step never above a round of one proposal
    assert len(rule.price) == 7 and rule.price[0] <= rule.price[1] <= rule.price[6]
    assert len(rule.step) == 5 and all(s >= 0 for s in rule.step)


def test_a_stopped_chain_counts_the_position_it_dropped_by_its_confidence():
    acc = Acceptance(1.0)
    acc.observe(0, 0, dropped=0.3)        # none proposed: position 1 at risk, 0.3 kept
    assert acc.risk == [1.0] and acc.kept == [0.3]
    acc.observe(2, 2, dropped=0.5)        # both kept, the third dropped at 0.5
    assert acc.risk == [2.0, 1.0, 1.0] and acc.kept == [1.3, 1.0, 0.5]
    acc.observe(2, 1, dropped=0.9)        # one rejected: what was dropped says nothing
    assert acc.risk == [3.0, 2.0, 1.0] and acc.kept == [2.3, 1.0, 0.5]


class _Forced:
    """Chains ended by a fixed rule whatever the machine: R = 1 token a second; drafting
    on while S ≥ ``go``; a proposal verified at ``each`` seconds over the one before (a
    plain step free), so the prefix kept depends on the confidences."""

    def __init__(self, go: float, each: float) -> None:
        self.go, self.each = go, each

    def __call__(self, state, k):
        if k < 1:
            return None
        return ChainStop(1.0, [1.0] * k, [self.go] * max(k - 1, 0),
                         [self.each * n for n in range(k + 1)], margin=1.0)


@pytest.fixture(scope="module")
def scenes(zoo_target):
    reqs = [Request([Message("user", "describe the image.", (image,))], max_new_tokens=32)
            for _, image in fresh_scenes(6, seed=5252)]
    return [(r, reference(zoo_target, r)) for r in reqs]


def test_stopped_chains_equal_target_greedy(zoo_target, zoo_draft, scenes):
    """T = 0: chains ended at every length by the draft's confidence, none proposed among
    them; every output is the target's greedy generate()."""
    drafter = create_drafter("chain", draft=zoo_draft, sampling=SamplingParams(0.0),
                             drafting_input="multimodal",
                             image_token=zoo_target.adapter.image_token(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, 6, SamplingParams(0.0))
    # (a draft step a hundredth of a target step: drafting never goes off here)
    policy = use_auto(engine, AutoGamma(6, costs=Costs(0.01)))
    policy.stop_rule = _Forced(go=0.6, each=0.45)
    shapes = Counter()     # (positions drafted, proposals verified)
    observe = policy.observe
    policy.observe = lambda st, k, **kw: (shapes.update([(kw["levels"], kw["drafted"])]),
                                          observe(st, k, **kw))
    stopped = 0
    for i, (req, ref) in enumerate(scenes):
        res = engine.generate(req)
        assert res.tokens == ref, f"request {i} differs from the target's greedy decoding"
        stopped += res.state.stats.draft_length["rounds_stopped"]
    assert stopped > 0
    # chains that drafted fewer than 6, chains that verified fewer than they drafted, and
    # rounds that drafted and verified none
    assert any(0 < levels < 6 for levels, _ in shapes)
    assert any(verified < levels for levels, verified in shapes)
    assert any(levels > 0 and verified == 0 for levels, verified in shapes)


def test_stopped_chains_follow_the_target_distribution(tiny_pair):  # noqa: F811
    """T > 0: the chain ends where the draft's probability of its own samples falls, and
    every proposal it drew is verified (leaving one out for its own q_j(x_j), as the rule's
    ``keep`` does at T = 0, biased the law: over these four tokens this test's chi-square
    rejected that at p ≈ 1e-18; over three it had passed); the first tokens' distribution
    is the target's."""
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    drafter = create_drafter("chain", draft=draft, sampling=params, drafting_input="text")
    engine = SpeculativeEngine(target, drafter, 3, params)
    policy = use_auto(engine, AutoGamma(3, probe_after=10 ** 6))
    # drafting on while S ≥ 0.5 (this draft's samples fall under it often enough); a
    # proposal "worth verifying" at 0.5 each: at T = 0 that would cut the prefix verified
    policy.stop_rule = _Forced(go=0.5, each=0.5)
    policy.choose = lambda state, budget: budget          # every round asks for the budget
    shapes = Counter()     # (proposals asked for, positions drafted, proposals verified)
    observe = policy.observe
    policy.observe = lambda st, k, **kw: (shapes.update([(k, kw["levels"], kw["drafted"])]),
                                          observe(st, k, **kw))
    _assert_samples_follow_target(engine, target, params, n=1000, new_tokens=4)
    # every proposal drawn was verified
    assert all(levels == verified for k, levels, verified in shapes if k > 0), shapes
    # (the first token is the prefill's: engine.free_first) chains of two the confidence
    # ended after one proposal, and whole chains
    assert shapes[(2, 1, 1)] > 100 and shapes[(2, 2, 2)] > 200, shapes


def test_the_summary_counts_the_chains_cut_by_confidence():
    from types import SimpleNamespace

    from vlmspec_cli import ui
    from vlmspec_cli.runtime.stats import length_section

    def table(stopped: int) -> str:
        stats = SimpleNamespace(num_draft_tokens=0, draft_length=length_section(
            12, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 27], 0, None, None, stopped),
            new_tokens=119, caption_s=0.0)
        summary = SimpleNamespace(stats=stats, items=6, done=6, skipped=0, failures=0,
                                  tokens_per_s=100.0, batched_s=None, speedup=None,
                                  baseline_tokens_per_s=None, compared=False)
        with ui.stderr.capture() as out:
            ui.summary_table(summary, "chain (γ auto ≤ 12)", True)
        return " ".join(out.get().replace("│", " ").split())   # a wrapped cell read on
    assert "rounds 27 drafted (19 stopped early: draft unsure), 0 by the target alone" in table(19)
    assert "rounds 27 drafted, 0 by the target alone" in table(0)
    assert "draft length chosen (γ) 12.00 per round on average (auto, at most 12)" in table(0)
