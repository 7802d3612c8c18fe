"""Invariant 1 (lossless): at temperature 0, every lossless method produces exactly
the tokens of the target's own greedy ``generate()``, on fresh tinyworld scenes."""

from __future__ import annotations

import random
import zlib

import pytest

from conftest import fresh_scenes
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import SamplingParams
from vlmspec_cli.zoo import world

MAX_NEW = 40
N_SCENES = 50
GREEDY = SamplingParams(0.0)


def _prompts():
    rng = random.Random(99)
    prompts = list(world.CAPTION_PROMPTS[:3])
    scene = world.sample_scene(rng)
    prompts += [q for q, _ in world.qa_pairs(scene, rng)[:3]]
    return prompts


PROMPTS = _prompts()


def reference(target, request: Request) -> list[int]:
    """The target's own greedy decoding with transformers' generate()."""
    adapter = target.adapter
    prompt = adapter.prompt_text(target, request.messages)
    videos = {"videos": request.videos} if request.videos else {}
    inputs = adapter.encode(target, prompt, request.images or None, **videos)
    # the runtime's own rope bookkeeping (Qwen2-VL); generate() computes its own
    inputs = {k: v for k, v in inputs.items() if k not in ("position_ids", "rope_deltas")}
    out = target.model.generate(**inputs, do_sample=False, max_new_tokens=request.max_new_tokens)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def corpus(zoo_target):
    """50 fresh single-image requests with several prompts, and their references."""
    items = []
    for i, (_, image) in enumerate(fresh_scenes(N_SCENES, seed=20261121)):
        req = Request([Message("user", PROMPTS[i % len(PROMPTS)], (image,))], max_new_tokens=MAX_NEW)
        items.append((req, reference(zoo_target, req)))
    return items


@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
@pytest.mark.parametrize("variant", ["multimodal", "text"])
def test_chain_equals_target_greedy(zoo_target, zoo_draft, corpus, variant, gamma):
    drafter = create_drafter("chain", draft=zoo_draft, sampling=GREEDY, drafting_input=variant,
                             image_token=zoo_target.adapter.image_token(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, gamma, GREEDY)
    accepted = 0
    for i, (req, ref) in enumerate(corpus):
        res = engine.generate(req)
        assert res.tokens == ref, f"scene {i} ({req.messages[0].text!r}) differs from target greedy"
        accepted += res.state.stats.num_accepted_tokens
    assert accepted > 0  # the draft really drafted: equality is not trivial


def test_target_only_equals_generate(zoo_target, corpus):
    engine = SpeculativeEngine(zoo_target, create_drafter("none"), 1, GREEDY)
    for req, ref in corpus[:10]:
        assert engine.generate(req).tokens == ref


@pytest.mark.parametrize("kind", ["difference", "story", "followup", "text_task"])
def test_chain_equals_target_greedy_on_conversations(zoo_target, zoo_draft, kind):
    """Multi-image prompts and multi-turn conversations (the prompt ends before the last
    assistant answer)."""
    rng = random.Random(zlib.crc32(kind.encode()))  # str hash() differs per process
    for variant in ("multimodal", "text"):
        drafter = create_drafter("chain", draft=zoo_draft, sampling=GREEDY, drafting_input=variant,
                                 image_token=zoo_target.adapter.image_token(zoo_target))
        engine = SpeculativeEngine(zoo_target, drafter, 5, GREEDY)
        for _ in range(4):
            turns = world.sample_conversation(rng, kind)[:-1]
            req = Request([Message(t.role, t.text, tuple(t.images)) for t in turns], max_new_tokens=MAX_NEW)
            assert engine.generate(req).tokens == reference(zoo_target, req)
