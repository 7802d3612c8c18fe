"""Draft trees (runtime/round/tree.py, verify.verify_tree, drafters/tree.py): the tree
structure and masks, EAGLE-2 expansion, multi-candidate speculative sampling (exact
distribution), and T=0 equality with target greedy decoding through the real models."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from scipy.stats import chisquare

from conftest import fresh_scenes
from test_draft_length import Costs, use_auto
from test_sampling_lm import _assert_samples_follow_target, tiny_pair  # noqa: F401 (fixture)
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.runtime.length.acceptance import expected_tokens
from vlmspec_cli.runtime.length.draft_length import AutoGamma
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.tree import DraftTree, path_to, tree_mask
from vlmspec_cli.runtime.round.tree_growth import expand_tree, tree_nodes
from vlmspec_cli.runtime.round.tree_shape import AdjacencyAdaptive, RoundLog, TreeRound
from vlmspec_cli.runtime.round.verify import SamplingParams, verify_tree
from vlmspec_cli.zoo import world

GREEDY = SamplingParams(0.0)


# -- structure ------------------------------------------------------------------------
def _sample_tree() -> DraftTree:
    #        root
    #       /    \
    #      0(5)   1(7)
    #     /   \     \
    #   2(8)  3(9)   4(5)
    return DraftTree([5, 7, 8, 9, 5], [-1, -1, 0, 0, 1], [0, 0, 1, 1, 1])


def test_ancestry_mask_and_paths():
    tree = _sample_tree()
    anc = tree.ancestry()
    assert anc.tolist()[3] == [True, False, False, True, False]
    assert anc.tolist()[4] == [False, True, False, False, True]
    assert path_to(tree, 3) == [0, 3] and tree.children(0) == [2, 3] and tree.max_depth == 2
    mask = tree_mask(tree, past=4, lead=1, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 6, 10)
    seen = mask[0, 0] == 0
    assert seen[:, :4].all()                       # the cache: everyone
    assert seen[:, 4].all()                        # the pending token: everyone
    assert seen[0, 5:].sum() == 0                  # pending sees no node
    assert seen[4, 5:].tolist() == [True, False, False, True, False]   # node 3: 0 and itself


def test_eagle2_expansion_ranks_by_path_probability():
    """Scripted draft: every node proposes children with probabilities .6 .3 .1 …; the
    frontier is the best nodes by product of probabilities, and the final rerank keeps the
    best total_tokens (ancestor-closed)."""
    vocab = 8
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1] + [1e-6] * (vocab - 3)))
    fed: list[list[int]] = []

    def step(tree, nodes):
        fed.append(list(nodes))
        return logits.expand(len(nodes), vocab)

    tree = expand_tree(logits, step, depth=3, top_k=2, total_tokens=5, sampling=GREEDY,
                       generator=None)
    assert len(tree) == 5
    # level 0: tokens 0 (.6) and 1 (.3); frontier after level 1: (0,0)=.36 and (0,1)=.18
    # — ahead of (1,0)=.18? ties break towards earlier creation — then the rerank keeps
    # .6 .36 .3 .216 .18
    assert fed[0] == [0, 1]
    kept = sorted(zip(tree.depth, tree.tokens))
    assert kept[:2] == [(0, 0), (0, 1)] and (2, 0) in kept
    for i, p in enumerate(tree.parents):             # ancestor-closed, parents first
        assert p < i


def test_sampled_trees_keep_every_drawn_child_and_respect_the_budget():
    vocab = 10
    gen = torch.Generator().manual_seed(0)

    def step(tree, nodes):
        return torch.randn(len(nodes), vocab, generator=gen)

    for total in (3, 7, 20, 60):
        tree = expand_tree(torch.randn(vocab, generator=gen), step, depth=4, top_k=3,
                           total_tokens=total, sampling=SamplingParams(1.0),
                           generator=torch.Generator().manual_seed(total))
        assert 1 <= len(tree) <= total
        for u in [-1] + list(range(len(tree))):
            kids = tree.children(u)
            if kids:   # siblings are distinct draws, and q is recorded for their parent
                assert len({tree.tokens[c] for c in kids}) == len(kids) and u in tree.q
        if total >= 20:
            assert tree.max_depth == 4


# -- multi-candidate speculative sampling ---------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_verify_tree_emits_the_target_distribution(k):
    """Children drawn from q without replacement, verified by recursive rejection: the
    emitted token is distributed as p, for every branching factor."""
    vocab, trials = 6, 8000
    gen = torch.Generator().manual_seed(100 + k)   # fixed: the test is deterministic
    p_logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 0.3])
    q = torch.softmax(torch.tensor([0.0, 2.0, 1.5, 1.0, 0.5, -1.0]), -1)
    counts = torch.zeros(vocab)
    params = SamplingParams(1.0)
    for _ in range(trials):
        picks = torch.multinomial(q, k, replacement=False, generator=gen).tolist()
        tree = DraftTree(picks, [-1] * k, [0] * k, {-1: q})
        path, tok = verify_tree(tree, p_logits, torch.zeros(k, vocab), params, gen)
        first = tree.tokens[path[0]] if path else tok
        counts[first] += 1
    p = torch.softmax(p_logits, -1)
    assert chisquare(counts.numpy(), (p * trials).numpy()).pvalue > 1e-3
    # q differs enough from p that rejections happen
    assert (p - q).abs().sum() > 0.5


# -- the real models ------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(zoo_target):
    reqs = []
    prompts = [world.CAPTION_PROMPTS[0], "What colour is the background?",
               world.CAPTION_PROMPTS[2], "how many shapes are there?"]
    for i, (_, image) in enumerate(fresh_scenes(8, seed=9090)):
        images = (image, image) if i == 3 else (image,)
        reqs.append(Request([Message("user", prompts[i % 4], images)],
                            max_new_tokens=32 if i % 3 else 7))   # 7: the limit cuts a tree
    reqs.append(Request([Message("user", "say something about shapes.")], max_new_tokens=16))
    base = SpeculativeEngine(zoo_target, create_drafter("none"), 1, GREEDY)
    return [(r, base.generate(r).tokens) for r in reqs]


@pytest.mark.parametrize("variant,depth,top_k,total", [
    ("multimodal", 5, 4, 20), ("multimodal", 6, 2, 10), ("multimodal", 3, 3, 60),
    ("multimodal", 4, 1, 4), ("text", 5, 3, 16)])
def test_tree_equals_target_greedy(zoo_target, zoo_draft, corpus, variant, depth, top_k, total):
    drafter = create_drafter("tree", draft=zoo_draft, sampling=GREEDY, drafting_input=variant,
                             depth=depth, top_k=top_k, total_tokens=total,
                             image_token=zoo_target.adapter.image_token(zoo_target),
                             eos_ids=eos_token_ids(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, depth, GREEDY)
    accepted = 0
    for i, (req, ref) in enumerate(corpus):
        res = engine.generate(req)
        assert res.tokens == ref, f"request {i} differs from target greedy"
        s = res.state.stats
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(ref)
        assert len(s.accepted_per_pos) <= depth and sum(s.accept_len_hist) == s.num_drafts
        # both caches were cut back to the committed tokens (the last one is pending)
        prompt_len = res.state.target_cache.get_seq_length() - (len(ref) - 1)
        assert prompt_len > 0
        accepted += s.num_accepted_tokens
    assert accepted > 0


def test_a_wider_tree_accepts_more_than_its_chain(zoo_target, zoo_draft, corpus):
    def tau(top_k, total):
        drafter = create_drafter("tree", draft=zoo_draft, sampling=GREEDY, drafting_input="multimodal",
                                 depth=5, top_k=top_k, total_tokens=total,
                                 image_token=zoo_target.adapter.image_token(zoo_target),
                                 eos_ids=eos_token_ids(zoo_target))
        engine = SpeculativeEngine(zoo_target, drafter, 5, GREEDY)
        stats = [engine.generate(r).state.stats for r, _ in corpus]
        return sum(s.num_accepted_tokens for s in stats) / sum(s.num_drafts for s in stats)

    assert tau(4, 40) > tau(1, 5)


def test_cli_tree(tmp_path):
    path = tmp_path / "a.png"
    fresh_scenes(1, seed=3)[0][1].save(path)
    runner = CliRunner()
    res = runner.invoke(cli, ["caption", str(path), "-m", "tree", "--compare", "--json", "-q",
                              "--set", "tree.top_k=2", "--set", "tree.total_tokens=8"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)
    assert rec["method"] == "tree" and rec["lossless"] and rec["compare"]["identical"]
    assert rec["tree"] == {"depth": 5, "top_k": 2, "total_tokens": 8}
    # drafting.length auto: the record says so, and what the rounds chose (k: the depth)
    res = runner.invoke(cli, ["caption", str(path), "-m", "tree", "--compare", "--json", "-q",
                              "--set", "drafting.length=auto", "--max-new-tokens", "12"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)
    assert rec["draft_length"] == "auto" and rec["compare"]["identical"]
    section = rec["stats"]["draft_length"]
    assert section["max"] == rec["tree"]["depth"] == 5 and sum(section["gamma_hist"]) > 0
    bad = runner.invoke(cli, ["caption", str(path), "-m", "tree", "--set", "tree.top_k=0"])
    assert bad.exit_code == 2 and "tree.top_k" in bad.output
    two = runner.invoke(cli, ["caption", str(path), "-m", "tree", "--inputs", "M,T"])
    assert two.exit_code == 2 and "one input" in two.output


# -- drafting.length auto: each round's depth chosen, drafting off when it does not pay ----
def test_tree_nodes_counts_what_expansion_grows():
    """``tree_nodes`` (what a round of depth k feeds the target, for the auto cost model)
    is the node count ``expand_tree`` really grows, T = 0 and T > 0, dynamic and static."""
    vocab = 40
    gen = torch.Generator().manual_seed(5)

    def step(tree, nodes):
        return torch.randn(len(nodes), vocab, generator=gen)

    for depth, top_k, total in [(1, 4, 20), (2, 4, 20), (3, 2, 5), (5, 3, 60), (4, 1, 3)]:
        for sampling in (GREEDY, SamplingParams(1.0)):
            for static in (False, True):
                tree = expand_tree(torch.randn(vocab, generator=gen), step, depth, top_k, total,
                                   sampling, torch.Generator().manual_seed(depth), static=static)
                assert len(tree) == tree_nodes(depth, top_k, total, sampling.greedy, static), \
                    (depth, top_k, total, sampling.greedy, static)


def test_a_tree_round_is_priced_by_its_nodes():
    """AutoGamma.best: with verification dearer per token fed, a tree (whose round of depth
    k feeds its nodes, ``feed_size``) is drafted shallower than a chain of the same
    acceptance, and every k a tree round may take is priced by its own feed."""
    chain = AutoGamma(5, costs=Costs(0.0, slope=0.05), prior_weight=1e6)
    tree = AutoGamma(5, costs=Costs(0.0, slope=0.05), prior_weight=1e6,
                     feed_size=lambda k: tree_nodes(k, 4, 60) + 1)
    rates = [0.7] * 5
    k_chain, _ = chain.best(rates, 5)
    k_tree, gain = tree.best(rates, 5)
    assert k_tree < k_chain == 5
    # the tree's gain is its own E(k) over V(nodes + 1), not V(k + 1)
    assert gain == pytest.approx(expected_tokens(rates, k_tree)
                                 / (1.0 + 0.05 * tree_nodes(k_tree, 4, 60)))


def test_adt_estimates_a_rounds_width_from_its_last_choice():
    """ADT-Tree's width moves per region: a round's feed (feed_size) is estimated at the
    top_k its policy chose last."""
    shape = AdjacencyAdaptive(cols=4, beta=1.0, step_depth=1, step_top_k=2, depth=4, top_k=4)
    assert shape.width == 4
    log = RoundLog()
    log.add(TreeRound(0, 4, 4, 1))                 # α = 1/4 < β: shallower, wider
    assert shape.choose(log, 1, None) == (3, 6) and shape.width == 6


def _auto_tree(zoo_target, zoo_draft, costs, depth=5, total=20, **kw):
    """A tree engine with drafting.length auto, recording each round's k (per request) and
    the depth drafted that AutoGamma counted acceptance by."""
    drafter = create_drafter("tree", draft=zoo_draft, sampling=GREEDY, drafting_input="multimodal",
                             depth=depth, top_k=4, total_tokens=total,
                             image_token=zoo_target.adapter.image_token(zoo_target),
                             eos_ids=eos_token_ids(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, depth, GREEDY)
    policy = use_auto(engine, AutoGamma(depth, costs=costs, feed_size=drafter.feed_size, **kw))
    log = {"k": [], "drafted": []}
    choose, observe = policy.choose, policy.observe

    def chosen(state, budget):
        log["k"].append(choose(state, budget))
        return log["k"][-1]

    def observed(state, k, **round_):
        log["drafted"].append((k, round_["drafted"], round_["accepted"]))
        return observe(state, k, **round_)

    policy.choose, policy.observe = chosen, observed
    lane = engine.policy._plain     # a request's rounds once plain throughout: not chosen

    def plain(state, budget):
        counted = state.target_next_logits is None and budget > 0
        k = lane(state, budget)
        if counted:
            log["k"].append(k)
        return k

    engine.policy._plain = plain
    prefill = drafter.prefill   # tokens decoded when the draft was prefilled
    drafter.prefill = lambda state: (log["prefills"].append(len(state.tokens)), prefill(state))
    log["prefills"] = []
    return engine, log


@pytest.mark.parametrize("costs", ["measured", "shallow", "off-on"])
def test_auto_tree_equals_target_greedy(zoo_target, zoo_draft, corpus, costs):
    """T = 0, method tree with drafting.length auto: each round's k caps the tree's depth
    (the tree drafted is exactly k levels deep; the acceptance counted is by depth, never
    the tree's node count), 0 is a plain target step, and every output is the target's
    greedy decoding: with the costs this process measures, with verification dear per
    node fed (shallow trees), and with drafting as dear as a target step (drafting off,
    probes of one level; the draft's prefill deferred to a request's first probe)."""
    made = {"measured": None, "shallow": Costs(0.0, slope=0.04),
            "off-on": Costs(1.0)}[costs]
    kw = dict(probe_after=3, max_backoff=3) if costs == "off-on" else {}
    # (60 nodes: a tree's feed grows with every level, 5 / 21 / 37 / 53 / 61 tokens)
    engine, log = _auto_tree(zoo_target, zoo_draft, made, total=60, **kw)
    ks = []
    for i, (req, ref) in enumerate(corpus):
        log["k"].clear()
        res = engine.generate(req)
        assert res.tokens == ref, f"request {i} differs from the target's greedy decoding"
        s = res.state.stats
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(ref)
        section = s.draft_length
        # (a last round with room for no proposal is decided by no one)
        assert section["rounds_drafted"] + section["rounds_plain"] == len(log["k"]) <= s.num_drafts
        drafted = [k for k in log["k"] if k > 0]
        if s.trees is not None:   # (never prefilled: drafting off the whole request)
            assert s.trees["depths"] == drafted   # each tree k levels deep
        ks += log["k"]
    # acceptance by depth: ≤ k (a tree of k levels holds up to 20 nodes)
    assert all(0 < d <= k and a <= d for k, d, a in log["drafted"] if k > 0)
    assert any(d > 0 and a == d for k, d, a in log["drafted"])   # a whole depth accepted
    if costs == "shallow":   # most rounds drafted trees shallower than the depth of 5
        assert 0 not in ks and sum(0 < k < 5 for k in ks) > len(ks) / 2, ks
    if costs == "off-on":
        assert set(ks) == {0, 1} and ks.count(0) > ks.count(1) > 0
        # requests that started with drafting off prefilled the draft at their first
        # probe, tokens in (it caught up on them: the outputs above are the target's)
        assert any(n > 0 for n in log["prefills"])


def test_auto_tree_follows_the_target_distribution(tiny_pair):  # noqa: F811
    """T > 0: trees whose depth is chosen live from the acceptance seen (verification
    costing 0.15 of a target step per node fed: plain, depth 1 or deeper as the rates
    move), with plain rounds and probes among them, emit the target's distribution."""
    from collections import Counter

    target, draft = tiny_pair
    params = SamplingParams(1.0)
    drafter = create_drafter("tree", draft=draft, sampling=params, drafting_input="text", depth=3,
                             top_k=2, total_tokens=6)
    engine = SpeculativeEngine(target, drafter, 3, params)
    # (doubt 0: off, a probe or two kept turn drafting back on, so that every depth
    # occurs often among 600 short requests)
    policy = use_auto(engine, AutoGamma(3, costs=Costs(0.0, slope=0.05), probe_after=1,
                                       max_backoff=2, decay=0.3, prior_weight=0.5,
                                       process_decay=0.5, feed_size=drafter.feed_size,
                                       doubt=0.0))
    choices = Counter()
    choose = policy.choose

    def counted(state, budget):
        k = choose(state, budget)
        choices[k] += 1
        return k

    policy.choose = counted
    # four tokens: the prefill's (a free first round), then rounds with room for 2 levels
    _assert_samples_follow_target(engine, target, params, n=600, new_tokens=4)
    assert min(choices[0], choices[1], choices[2]) > 50, choices   # plain, 1 and 2 levels
