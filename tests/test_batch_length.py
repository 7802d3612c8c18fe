"""``drafting.length: auto`` in a batch (SpeculativeEngine.run, B > 1): each row chooses
its own k from its own acceptance (round_policy.AutoLength.admit: the row's own length
model over the process's costs), a row whose drafting does not pay decodes plain in the
round's one target forward while the others draft, and every row still emits what the
same request decoded alone emits at temperature 0. The costs are injected where the test
needs the switch to happen (``Costs``: a made-up machine); the real cost model decides
elsewhere, where only losslessness is asserted."""

from __future__ import annotations

import pytest

from test_batch import _batched, requests_  # noqa: F401  (requests_: the fixture)
from test_batch_heads import hidden_head  # noqa: F401  (the fixture)
from test_draft_length import Costs
from vlmspec_cli.drafters import create_drafter, method_class
from vlmspec_cli.runtime.length.draft_length import AutoGamma
from vlmspec_cli.runtime.models.loading import load_twig
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.draft import Draft
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.round.round_policy import AutoLength
from vlmspec_cli.runtime.round.verify import SamplingParams
from conftest import fresh_scenes
from vlmspec_cli.zoo import world

GREEDY = SamplingParams(0.0)
USELESS = 777       # the seed of the request whose proposals are scrambled


class Recording(AutoLength):
    """The auto policy, keeping each round's k per row (request seed → k)."""

    def __init__(self, auto: AutoGamma, batch: bool) -> None:
        super().__init__(auto)
        self.batch = batch
        self.rounds: list[dict[int, int]] = []

    def plan(self, states, budgets):
        ks = super().plan(states, budgets)
        self.rounds.append({st.request.seed: k for st, k in zip(states, ks)})
        # the confidence stop (draft_stop.py) is a request alone's: its own draft cache.
        # A batch's rows, the last one left included, draft in the batch's
        assert not self.batch or all(st.draft_stop is None for st in states)
        return ks


class Scrambled(method_class("chain")):
    """The chain drafter, but the request seeded USELESS gets every proposal shifted by one
    token id: a draft that is (nearly) never right for that row only."""

    def propose_rows(self, states, budgets):
        drafts = super().propose_rows(states, budgets)
        return [Draft([(t + 1) % self.draft.vocab_size for t in d.tokens])
                if st.request.seed == USELESS and d.tokens else d
                for st, d in zip(states, drafts)]


def _drafter(method, target, draft=None, head=None):
    if method == "twig":   # the target's first 2 layers and a twig on them
        return create_drafter("twig", target=target, sampling=GREEDY, layers=2, threshold=0.6,
                              twig=load_twig("zoo:tinyworld/llava-twig", target))
    if method == "hidden":
        return create_drafter("hidden", target=target, head=head, sampling=GREEDY,
                              eos_ids=eos_token_ids(target))
    return create_drafter("chain", draft=draft, sampling=GREEDY, drafting_input="multimodal",
                          image_token=target.adapter.image_token(target))


def _auto_engine(drafter, target, gamma, batch_size, costs=None):
    engine = SpeculativeEngine(target, drafter, gamma, GREEDY, batch_size)
    policy = Recording(AutoGamma(gamma, costs=costs, feed_size=drafter.feed_size),
                       batch=batch_size > 1)
    engine.use_policy(policy)
    return engine, policy


@pytest.mark.parametrize("method,batch_size,made_up", [
    ("chain", 3, True), ("chain", 8, False), ("hidden", 3, False), ("hidden", 8, True),
    ("twig", 3, True), ("twig", 8, False)])
def test_auto_length_rows_equal_each_request_alone(zoo_target, zoo_draft, hidden_head,
                                                   requests_, method, batch_size, made_up):
    """Rows of different prompt lengths and token limits, each choosing its own k (on the
    made-up machine or the real cost model): every row's tokens are the target's own
    greedy decoding of that request alone, and its record has the section a request
    decoded alone with auto length has."""
    target = zoo_target
    plain = SpeculativeEngine(target, create_drafter("none"), 1, GREEDY)
    refs = [plain.generate(r) for r in requests_]
    drafter = _drafter(method, target, zoo_draft, hidden_head)
    costs = Costs(0.2) if made_up else None
    engine, policy = _auto_engine(drafter, target, 5, batch_size, costs)
    results, live = _batched(engine, requests_)
    assert max(live) == min(batch_size, len(requests_)) - 1          # the batch was full
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from the target alone"
        if method == "twig":   # through plain rounds too, the row's twig read (or queued)
            st = res.state.drafter_state          # every committed token, as its trunk
            unread = 0 if st.unread is None else st.unread.shape[1]
            committed = st.prompt_len + len(res.tokens) - 1
            assert st.trunk.get_seq_length(0) == committed == \
                st.twig_cache.get_seq_length(0) + unread, f"request {i}"
    alone, _ = _auto_engine(_drafter(method, target, zoo_draft, hidden_head), target, 5, 1,
                            costs)
    section = alone.generate(requests_[0]).state.stats.draft_length
    for res in results:
        got = res.state.stats.draft_length
        assert got is not None and set(got) == set(section)
        rounds = got["rounds_drafted"] + got["rounds_plain"]
        assert sum(got["gamma_hist"]) == rounds <= res.state.stats.num_drafts
    # k was chosen per row: in some round two rows chose different lengths
    assert any(len(set(ks.values())) > 1 for ks in policy.rounds if len(ks) > 1)


def _long_requests(n: int) -> list[Request]:
    reqs = []
    for i, (_, image) in enumerate(fresh_scenes(n, seed=99)):
        reqs.append(Request([Message("user", world.CAPTION_PROMPTS[i % 2], (image,))],
                            max_new_tokens=48, seed=USELESS if i == 1 else i))
    return reqs


def test_a_row_whose_draft_is_useless_turns_off_while_the_others_draft(zoo_target, zoo_draft):
    """One row's proposals are scrambled (never right), the others' are the draft's: on a
    machine where a draft step costs 0.3 target steps that row goes plain (k = 0) in rounds
    where the others still draft, in the same target forward; its outputs stay the
    target's, and its record says it drafted less."""
    reqs = _long_requests(3)
    plain = SpeculativeEngine(zoo_target, create_drafter("none"), 1, GREEDY)
    refs = [plain.generate(r) for r in reqs]
    drafter = Scrambled(draft=zoo_draft, sampling=GREEDY, drafting_input="multimodal",
                        image_token=zoo_target.adapter.image_token(zoo_target))
    engine, policy = _auto_engine(drafter, zoo_target, 5, 3, Costs(0.3))
    results, _ = _batched(engine, reqs)
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from the target alone"
    split = [ks for ks in policy.rounds
             if ks.get(USELESS) == 0 and any(k > 0 for s, k in ks.items() if s != USELESS)]
    assert len(split) >= 5, policy.rounds
    stats = {r.seed: res.state.stats.draft_length for r, res in zip(reqs, results)}
    useless, good = stats[USELESS], stats[0]
    assert useless["rounds_plain"] > useless["rounds_drafted"], useless
    assert good["rounds_drafted"] > good["rounds_plain"], good
    assert useless["mean_gamma"] * useless["rounds_drafted"] < \
        good["mean_gamma"] * good["rounds_drafted"]
    assert results[1].state.stats.num_accepted_tokens < results[0].state.stats.num_accepted_tokens


class _Rates(AutoGamma):
    """A row's length model with given acceptance rates (h_1..h_12), on a made-up machine."""

    def __init__(self, rates, costs) -> None:
        super().__init__(12, costs)
        self.fixed = rates

    def rates(self, ls):
        return self.fixed


def test_a_batch_round_is_as_wide_as_pays_for_the_whole_batch_not_its_best_row():
    """Each row's own best k at the batch's costs let one row that accepts well draft 12
    and every row pay a 13-wide forward for the 2-3 tokens the others keep (per-row auto
    1.03-1.07x target-only batched, fixed γ = 5 1.23x). The batch's width is the one with
    the most tokens a second over all its rows (batch_width.py); rows alike keep their own
    best; a plain row counts one token; the capped rows' histograms count what they draft."""
    from vlmspec_cli.runtime.length.batch_width import batch_width, cap_rows
    from vlmspec_cli.runtime.length.acceptance import Acceptance, LengthState

    machine = Costs(draft=0.05, slope=0.1)
    process = AutoGamma(12, machine)

    def rows(rates_and_ks):
        states = []
        for rates, k in rates_and_ks:
            ls = LengthState(Acceptance(0.9), model=_Rates(rates, machine))
            ls.count(k)
            states.append(type("Row", (), {"length": ls})())
        return states, [k for _, k in rates_and_ks]

    good, bad = [0.95] * 12, [0.3] * 12
    alone = process.best(good, 12)[0]
    states, ks = rows([(good, alone)] * 4)
    assert batch_width(states, ks, process) == alone       # alike: each row's own best
    states, ks = rows([(good, 12), (bad, 2), (bad, 2), (bad, 0)])
    width = batch_width(states, ks, process)
    assert 2 < width < 12
    capped = cap_rows(states, ks, width)
    assert capped == [width, 2, 2, 0]
    assert states[0].length.hist[12] == 0 and states[0].length.hist[width] == 1
    assert batch_width(states[:1], ks[:1], process) is None     # one row: its own k
