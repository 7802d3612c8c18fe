"""Batched decoding of draft trees (methods ``tree``, and ``hidden`` / ``eagle3`` with
``tree: true``): every row's tree is verified in the batch's one target forward, its nodes
flattened after the row's own prefix (positions: prefix length + 1 + depth; a 4-D mask:
the row's valid slots, then its own ancestors and itself), and the row's ragged cache
keeps only its accepted path. At temperature 0 each row emits what the same request
decoded alone emits, with the same trees accepted, for prompts of different lengths and
rows that finish at different rounds; at T > 0 the tokens follow the target's law."""

from __future__ import annotations


import pytest
import torch
from click.testing import CliRunner

from batch_cli import batch_equals_alone
from conftest import assert_first_two_follow, fresh_scenes
from test_batch import _batched, requests_  # noqa: F401  (requests_: the fixture)
from test_batch_heads import deep, hidden_head, joint_law  # noqa: F401  (fixtures)
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.drafters.hidden import TreeSettings
from vlmspec_cli.runtime.fast.ragged import RaggedCache
from vlmspec_cli.runtime.models.loading import use_fast_path
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.round.verify import SamplingParams

GREEDY = SamplingParams(0.0)


@pytest.fixture
def fast(request, zoo_target):
    """The small target with the fast path off (transformers caches: an additive 4-D mask)
    or on (static caches: a bool one)."""
    use_fast_path(zoo_target, request.param)
    yield request.param
    use_fast_path(zoo_target, "auto")


def _tree_engine(target, draft, policy, batch_size=1, sampling=GREEDY, depth=4, top_k=3,
                 total=10):
    drafter = create_drafter("tree", draft=draft, sampling=sampling,
                             drafting_input="multimodal", depth=depth, top_k=top_k,
                             total_tokens=total, policy=policy,
                             image_token=target.adapter.image_token(target),
                             eos_ids=eos_token_ids(target))
    return SpeculativeEngine(target, drafter, depth, sampling, batch_size)


def _head_engine(method, target, head, batch_size=1, sampling=GREEDY, static=False):
    drafter = create_drafter(method, target=target, head=head, sampling=sampling,
                             eos_ids=eos_token_ids(target),
                             tree=TreeSettings(4, 3, 10, static=static))
    return SpeculativeEngine(target, drafter, 4, sampling, batch_size)


def _check_equal_alone(make, batch_size, reqs, draft_cache=False):
    """Each row of a batch of ``batch_size`` equals its request decoded alone: tokens, the
    trees' acceptance round by round, the rows' tree records."""
    refs = [make(1).generate(r) for r in reqs]
    results, live = _batched(make(batch_size), reqs)
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from its single decoding"
        s, r = res.state.stats, ref.state.stats
        assert (s.num_accepted_tokens, s.num_drafts, s.num_draft_tokens) == \
            (r.num_accepted_tokens, r.num_drafts, r.num_draft_tokens), f"request {i}"
        assert s.accepted_per_pos == r.accepted_per_pos, f"request {i}"
        assert s.trees == r.trees and s.trees, f"request {i}: the trees' record"
        if draft_cache:
            assert s.draft_cache == r.draft_cache, f"request {i}: the head's record"
    assert max(live) == min(batch_size, len(reqs)) - 1          # the batch was full
    if batch_size < len(reqs):                                   # and rows joined mid-way
        assert any(0 < n for n in live[batch_size:])
    # trees were really walked: some rounds accepted more than one node
    assert sum(r.state.stats.num_accepted_tokens for r in results) > 2 * len(reqs)
    assert any(len(r.state.stats.accepted_per_pos) > 1 for r in results)


@pytest.mark.parametrize("batch_size,policy,fast", [
    (3, "dynamic", "off"), (8, "dynamic", "on"), (3, "static", "on"), (8, "static", "off")],
    indirect=["fast"])
def test_batched_tree_equals_each_request_alone(zoo_target, zoo_draft, requests_, batch_size,
                                                policy, fast):
    _check_equal_alone(lambda b: _tree_engine(zoo_target, zoo_draft, policy, b), batch_size,
                       requests_)


@pytest.mark.parametrize("batch_size,fast", [(3, "off"), (8, "on")], indirect=["fast"])
def test_batched_hidden_tree_equals_each_request_alone(zoo_target, hidden_head, requests_,
                                                       batch_size, fast):
    _check_equal_alone(lambda b: _head_engine("hidden", zoo_target, hidden_head, b),
                       batch_size, requests_, draft_cache=True)


@pytest.mark.parametrize("batch_size,static", [(3, True), (8, False)])
def test_batched_eagle3_tree_equals_each_request_alone(deep, requests_, batch_size, static):
    target, head = deep
    _check_equal_alone(lambda b: _head_engine("eagle3", target, head, b, static=static),
                       batch_size, requests_[:9], draft_cache=True)


def test_a_tree_row_beside_chain_rows_attends_as_if_alone(zoo_target):
    """The ragged cache's tree feed, directly: row 0 feeds a chain, row 1 a two-branch
    tree after a prefix of another length; each fed token's logits equal the same tokens
    run alone (the tree's branches as the sequences they are), and the rollback keeps only
    the path, so the next token sees the path alone."""
    lm = zoo_target
    prompts = [[5, 9, 14, 3], [7, 2]]
    rows = RaggedCache(lm)
    for p in prompts:
        cache = lm.adapter.new_cache(lm)
        lm.adapter.prefill(lm, {"input_ids": torch.tensor([p])}, cache)
        rows.add_row(cache, len(p))

    def alone(ids):
        cache = lm.adapter.new_cache(lm)
        return lm.adapter.prefill(lm, {"input_ids": torch.tensor([ids[:-1]])}, cache), \
            lm.adapter.extend(lm, torch.tensor([ids[-1:]]), cache)[0, -1]

    # row 1: pending 11, then nodes a=20 (depth 0), b=21 (depth 0), c=22 (child of a)
    allowed = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]).bool()
    outs = rows.feed_hidden([[4, 6], [11, 20, 21, 22]], None,
                            [None, (torch.tensor([0, 1, 1, 2]), allowed)])
    for got, seq in [(outs[0][0][1], [5, 9, 14, 3, 4, 6]), (outs[1][0][2], [7, 2, 11, 21]),
                     (outs[1][0][3], [7, 2, 11, 20, 22])]:
        torch.testing.assert_close(got.float(), alone(seq)[1].float(), atol=1e-4, rtol=1e-4)
    rows.rollback([1, [True, True, False, True]])       # row 1 keeps 11, a, c
    assert rows.next_pos.tolist() == [5, 5]
    outs = rows.feed_hidden([[8], [30]], None)
    torch.testing.assert_close(outs[1][0][0].float(), alone([7, 2, 11, 20, 22, 30])[1].float(),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outs[0][0][0].float(), alone([5, 9, 14, 3, 4, 8])[1].float(),
                               atol=1e-4, rtol=1e-4)


def test_batched_tree_samples_follow_the_targets_law(zoo_target):
    """300 seeded requests of one image prompt, trees drafted by an untrained head (many
    nodes rejected, so the residual draws are tested too), 8 rows at a time: the joint law
    of the first two tokens is the target's (chi-square, conftest)."""
    from vlmspec_cli.zoo.hidden_train import new_head

    params, runs = SamplingParams(1.0), 300
    (_, image), = fresh_scenes(1, seed=515)
    messages = [Message("user", "describe the image.", (image,))]
    joint = joint_law(zoo_target, messages, params, runs)
    head = new_head(zoo_target, -1, max_steps=2, seed=3).eval()
    engine = _head_engine("hidden", zoo_target, head, batch_size=8, sampling=params)
    reqs = [Request(messages, max_new_tokens=(3, 5, 4)[seed % 3], seed=seed)
            for seed in range(runs)]
    assert_first_two_follow([res for _, res in engine.run(reqs, lambda r: r)], joint, runs)


def test_batched_draft_tree_samples_follow_the_targets_law(zoo_target, zoo_draft):
    """The same law with trees of the draft model (``tree``), 8 rows at a time."""
    params, runs = SamplingParams(1.0), 300
    (_, image), = fresh_scenes(1, seed=515)
    messages = [Message("user", "describe the image.", (image,))]
    joint = joint_law(zoo_target, messages, params, runs)
    engine = _tree_engine(zoo_target, zoo_draft, "dynamic", 8, params, depth=2, top_k=2,
                          total=4)
    reqs = [Request(messages, max_new_tokens=(3, 5, 4)[seed % 3], seed=seed)
            for seed in range(runs)]
    assert_first_two_follow([res for _, res in engine.run(reqs, lambda r: r)], joint, runs)


@pytest.mark.parametrize("extra", [["-m", "tree", "--set", "tree.top_k=2",
                                    "--set", "tree.total_tokens=8"],
                                   ["-m", "hidden", "--set", "hidden.tree=true"]])
def test_cli_trees_batch(tmp_path, extra):
    """A folder at --batch-size 3 is captioned exactly as at 1 and as target-only
    (--compare); the records keep their shape, the trees' section included; --out resumes."""
    a, b = batch_equals_alone(tmp_path, extra)
    # (drafting.length auto: each row's depths are its own choice, not the request's alone)
    assert all(set(a[k]["stats"]["trees"]) == set(b[k]["stats"]["trees"]) for k in a)


def test_adt_refuses_a_batch_in_one_line():
    """ADT drafts image codes, and generate-image decodes one image at a time: refused
    before anything loads, in one line."""
    res = CliRunner().invoke(cli, ["generate-image", "a red circle", "--method", "adt",
                                   "--set", "generation.batch_size=2",
                                   "--profile", "tinyworld-image"])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if "error" in line.lower()]
    # (generate-image has no --batch-size: the line names the profile key to set)
    assert len(errors) == 1 and "generate-image decodes one image at a time" in errors[0] \
        and "generation.batch_size: 1" in errors[0], res.output
