"""``hidden``: the HiViS/Sparrow draft head on the tinyworld Llava target — lossless on
images (chain and tree), a KV cache holding text positions only, settings checked."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import fresh_scenes
from test_lossless import reference
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.drafters.hidden import TreeSettings
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.models.hidden_head import prompt_pairs
from vlmspec_cli.runtime.models.loading import load_hidden_head, use_fast_path
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.session import SessionError, build_session
from vlmspec_cli.runtime.round.verify import SamplingParams
from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.build import IMAGE_TOKENS

GREEDY = SamplingParams(0.0)
HEAD = "zoo:tinyworld/llava-hidden"


@pytest.fixture(scope="module")
def zoo_head(zoo_target):
    return load_hidden_head(HEAD, zoo_target)


@pytest.fixture(scope="module")
def corpus(zoo_target):
    """Fresh scenes (captions and questions), two images, a second turn and a text-only
    request, each with its target-greedy reference."""
    rng = random.Random(99)
    reqs = []
    for i, (scene, image) in enumerate(fresh_scenes(5, seed=4321)):
        prompt = world.CAPTION_PROMPTS[i % 3] if i % 2 == 0 else rng.choice(world.qa_pairs(scene, rng))[0]
        reqs.append(Request([Message("user", prompt, (image,))], max_new_tokens=40))
    (_, a), (_, b) = fresh_scenes(2, seed=4322)
    reqs.append(Request([Message("user", "what changed between the two images?", (a, b))], max_new_tokens=30))
    reqs.append(Request([Message("user", "describe the image.", (a,)),
                         Message("assistant", "a red circle."),
                         Message("user", "what colour is the background?")], max_new_tokens=20))
    reqs.append(Request([Message("user", "say something about shapes.")], max_new_tokens=20))
    return [(r, reference(zoo_target, r)) for r in reqs]


def _engine(target, head, gamma=5, tree=None, sampling=GREEDY):
    drafter = create_drafter("hidden", target=target, head=head, sampling=sampling,
                             eos_ids=eos_token_ids(target), tree=tree)
    return SpeculativeEngine(target, drafter, tree.depth if tree else gamma, sampling)


@pytest.mark.parametrize("gamma,tree", [
    (5, None), (2, None),
    (None, TreeSettings(4, 3, 10)), (None, TreeSettings(6, 2, 12, static=True)),
])
def test_hidden_equals_target_greedy(zoo_target, zoo_head, corpus, gamma, tree):
    engine = _engine(zoo_target, zoo_head, gamma, tree)
    drafted = accepted = drafts = 0
    for req, ref in corpus:
        res = engine.generate(req)
        assert res.tokens == ref, f"differs from target greedy on {req.messages[-1].text!r}"
        s = res.state.stats
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(res.tokens)
        assert sum(s.accept_len_hist) == s.num_drafts
        assert s.num_accepted_tokens <= s.num_draft_tokens
        drafted += s.num_draft_tokens
        accepted += s.num_accepted_tokens
        drafts += s.num_drafts
    # the trained head really drafts: well over one token per round on fresh scenes
    assert 1 + accepted / drafts > (1.5 if gamma == 2 else 2.5)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_draft_cache_holds_text_positions_only(zoo_target, zoo_head, corpus, mode):
    """Sparrow's VATA: the head's KV cache has one entry per text pair and none for the
    image tokens — prompt text pairs + generated tokens, never the prompt length; with the
    fast path on and off (the head's layers follow the target's path)."""
    use_fast_path(zoo_target, mode)
    try:
        _check_text_only_cache(_engine(zoo_target, zoo_head), corpus[:6], mode == "on")
    finally:
        use_fast_path(zoo_target, "auto")


def _check_text_only_cache(engine, corpus, fast: bool) -> None:
    lm = engine.target
    for req, ref in corpus:
        res = engine.generate(req)
        assert res.tokens == ref
        st = res.state.drafter_state
        assert isinstance(st.cache, StaticKVCache) == fast
        ids = lm.adapter.encode(lm, res.state.prompt, req.images or None)["input_ids"][0]
        visual = lm.adapter.visual_mask(lm, ids)
        n_visual = int(visual.sum())
        assert n_visual == IMAGE_TOKENS * len(req.images) > 0   # image tokens to leave out
        text_pairs = len(prompt_pairs(ids, torch.zeros(len(ids), 1), visual)[0])
        assert text_pairs == len(ids) - n_visual - 1
        cache_len = int(st.cache.get_seq_length())
        assert cache_len == st.committed                     # nothing speculative left over
        # every prompt text pair, and the generated tokens up to the last rounds' (the
        # tokens of a final round, at most γ + 1 = 6, are never read back)
        assert text_pairs + len(res.tokens) - 12 <= cache_len <= text_pairs + len(res.tokens)
        assert cache_len < len(ids) - n_visual + len(res.tokens)
        assert res.state.stats.draft_cache == {"entries": cache_len, "prompt_tokens": len(ids)}


def test_untrained_head_is_still_lossless(zoo_target, corpus):
    """Losslessness never depends on the head's quality: a random head, same outputs."""
    from vlmspec_cli.zoo.hidden_train import new_head

    head = new_head(zoo_target, -1, max_steps=2, seed=3).eval()
    engine = _engine(zoo_target, head, gamma=3)
    for req, ref in corpus[:3]:
        assert engine.generate(req).tokens == ref


def test_hidden_profile_and_layer_key(zoo_target):
    prof = load_profile("tinyworld-hidden", cli={"target.device": "cpu"})
    session = build_session(prof)
    assert session.engine.drafter.name == "hidden" and session.lossless
    assert session.engine.hidden_layer == -1
    with pytest.raises(SessionError, match=r"trained on target layer -1.*hidden.layer is -2"):
        build_session(load_profile("tinyworld-hidden", overrides=["hidden.layer=-2"],
                                   cli={"target.device": "cpu"}))


def test_head_for_another_target_is_refused(zoo_target, zoo_head):
    from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead, HiddenHeadConfig

    wrong = HiddenDraftHead(HiddenHeadConfig(hidden_size=128, vocab_size=999))
    with pytest.raises(ValueError, match="vocabulary of 999"):
        create_drafter("hidden", target=zoo_target, head=wrong, sampling=GREEDY)
