"""Batched decoding with the hidden-state heads (methods ``hidden`` and ``eagle3``, chains;
their trees batched: tests/test_batch_trees.py):
every row keeps its own head state (its head cache, the target states it has not read
yet) while the target verifies every row's chain in one forward over the batch's ragged
cache. At temperature 0 each row emits what the same request decoded alone emits, with
the same proposals accepted, for prompts of different lengths and rows that finish at
different rounds; at T > 0 the tokens follow the target's law (chi-square)."""

from __future__ import annotations


import pytest
import torch

from batch_cli import batch_equals_alone
from conftest import ROOT, assert_first_two_follow, fresh_scenes
from test_batch import _batched, requests_  # noqa: F401  (requests_: the fixture)
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.loading import (load_eagle3_head, load_hidden_head, load_model,
                                                use_fast_path)
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities

GREEDY = SamplingParams(0.0)


@pytest.fixture(scope="module")
def hidden_head(zoo_target):
    return load_hidden_head("zoo:tinyworld/llava-hidden", zoo_target)


@pytest.fixture(scope="module")
def deep():
    """The shipped profiles' 32-layer target and its shipped EAGLE-3 head."""
    target = load_model(ModelSpec(model="zoo:tinyworld/llava-target-deep", device="cpu"), "target")
    return target, load_eagle3_head("zoo:tinyworld/llava-deep-eagle3", target)


@pytest.fixture
def target_path(request, zoo_target):
    """The small target with the fast path off (transformers caches: the rows' DynamicCache,
    each row's head cache its own) or on (static caches)."""
    use_fast_path(zoo_target, request.param)
    yield zoo_target
    use_fast_path(zoo_target, "auto")


def _engine(method, target, head, gamma, batch_size=1, sampling=GREEDY):
    drafter = create_drafter(method, target=target, head=head, sampling=sampling,
                             eos_ids=eos_token_ids(target))
    return SpeculativeEngine(target, drafter, gamma, sampling, batch_size)


def _check_equal_alone(method, target, head, gamma, batch_size, reqs):
    refs = [_engine(method, target, head, gamma).generate(r) for r in reqs]
    results, live = _batched(_engine(method, target, head, gamma, batch_size), reqs)
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from its single decoding"
        # the same proposals as alone: each row's head read exactly its own verified
        # target states, and forgot exactly its own speculative entries
        s, r = res.state.stats, ref.state.stats
        assert (s.num_accepted_tokens, s.num_drafts) == (r.num_accepted_tokens, r.num_drafts), \
            f"request {i}"
        assert s.draft_cache == r.draft_cache, f"request {i}: the head's record"
    assert max(live) == min(batch_size, len(reqs)) - 1          # the batch was full
    if batch_size < len(reqs):                                   # and rows joined mid-way
        assert any(0 < n for n in live[batch_size:])
    assert sum(r.state.stats.num_accepted_tokens for r in results) > len(reqs)


@pytest.mark.parametrize("batch_size,target_path", [(3, "off"), (8, "on")],
                         indirect=["target_path"])
def test_batched_hidden_equals_each_request_alone(target_path, hidden_head, requests_,
                                                  batch_size):
    _check_equal_alone("hidden", target_path, hidden_head, 5, batch_size, requests_)


@pytest.mark.parametrize("batch_size", [3, 8])
def test_batched_eagle3_equals_each_request_alone(deep, requests_, batch_size):
    target, head = deep
    _check_equal_alone("eagle3", target, head, 4, batch_size, requests_[:9])


def test_a_request_that_fails_to_start_leaves_the_head_batch_going(zoo_target, hidden_head,
                                                                  requests_):
    reqs = requests_[:5]

    def admit(r):
        if r is reqs[1]:
            raise ValueError("cannot read this one")
        return r

    outcomes = {id(r): res for r, res in _engine("hidden", zoo_target, hidden_head, 3,
                                                 batch_size=2).run(reqs, admit)}
    assert isinstance(outcomes[id(reqs[1])], ValueError)
    alone = _engine("hidden", zoo_target, hidden_head, 3)
    for r in (reqs[0], reqs[2], reqs[3], reqs[4]):
        assert outcomes[id(r)].tokens == alone.generate(r).tokens


def _law(lm, messages, prefix: list[int], params) -> torch.Tensor:
    """The target's warped next-token law after the prompt and ``prefix``."""
    images = [im for m in messages for im in m.images]
    inputs = lm.adapter.encode(lm, lm.adapter.prompt_text(lm, messages), images)
    cache = lm.adapter.new_cache(lm)
    logits = lm.adapter.prefill(lm, inputs, cache)[0]
    if prefix:
        logits = lm.adapter.extend(lm, torch.tensor([prefix]), cache)[0, -1]
    return probabilities(logits.float(), params).cpu()


def joint_law(lm, messages, params, runs: int) -> dict[tuple[int, int], float]:
    """The target's joint law of the first two tokens, over the pairs ``runs`` draws can
    show (a first token expected twice or more, a pair once or more)."""
    first = _law(lm, messages, [], params)
    joint = {}
    for a in (first * runs >= 2).nonzero().flatten().tolist():
        second = _law(lm, messages, [a], params)
        for b in (first[a] * second * runs >= 1).nonzero().flatten().tolist():
            joint[(a, b)] = float(first[a] * second[b])
    return joint


def test_batched_hidden_samples_follow_the_targets_law(zoo_target):
    """300 seeded requests of one image prompt decoded 8 rows at a time: the first token is
    the target's own, the second the head's proposal verified in the batch's forward; the
    joint law of both (chi-square over the pairs with 5 or more expected draws, the rest
    pooled) is the target's. An untrained head, so that many proposals are rejected and
    the residual draws are tested too (the trained head's are rarely wrong at T = 1)."""

    from vlmspec_cli.zoo.hidden_train import new_head

    params, runs = SamplingParams(1.0), 300
    (_, image), = fresh_scenes(1, seed=515)
    messages = [Message("user", "describe the image.", (image,))]
    joint = joint_law(zoo_target, messages, params, runs)
    head = new_head(zoo_target, -1, max_steps=2, seed=3).eval()
    engine = _engine("hidden", zoo_target, head, 2, batch_size=8, sampling=params)
    reqs = [Request(messages, max_new_tokens=(3, 5, 4)[seed % 3], seed=seed)
            for seed in range(runs)]
    assert_first_two_follow([res for _, res in engine.run(reqs, lambda r: r)], joint, runs)


@pytest.mark.parametrize("profile", ["tinyworld-hidden", "tinyworld-eagle3"])
def test_cli_shipped_head_profiles_batch(tmp_path, profile):
    """The shipped profiles (by path: their 32-layer target and its shipped head) caption a
    folder at --batch-size 3 exactly as at 1, and as target-only (--compare); --out
    resumes."""
    a, b = batch_equals_alone(tmp_path, ["--profile", str(ROOT / "profiles" / f"{profile}.yaml")])
    # the records keep their shape: the same fields, the head's own report included
    assert all("draft_cache" in a[k]["stats"] and "draft_cache" in b[k]["stats"] for k in a)
