"""Batches on every family the chain serves alone (issue 61): Qwen2-VL, Qwen2.5-VL and
Qwen3-VL (M-RoPE: 3-D positions, each row with its own prompt's rope offset), LLaVA-NeXT,
LLaVA-OneVision and Mistral3. Tiny random-weight models saved to folders and loaded by
path, as in tests/test_family_*.py.

At B = 3 and 8, requests of different prompt lengths (images of different sizes, a two-turn
chat, plain text and, for families that read them, a video) with different token limits, so
rows finish at different rounds and new ones join, decode at T = 0 exactly the tokens each
decodes alone: target-only, chains that reject nearly everything (another random model),
accept everything (the target as its own draft) or some (the target reading the prompt as
text), the layer-skip twig, and for the Qwen families the hidden-state head's chains."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from families import family_session, hidden_head, llava_next, qwen2_5_vl, qwen2_vl
from test_batch import _batched, batched_equals_alone
from test_family_llava_onevision import llava_onevision
from test_family_mistral3 import mistral3
from test_family_qwen3_vl import qwen3_vl
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.tasks.video_io import clip_from_arrays

# family → (builder, image sizes, frames of its video or None)
FAMILIES = {
    "qwen2_vl": (qwen2_vl, [(40, 24), (32, 56), (48, 48)], 4),
    "qwen2_5_vl": (qwen2_5_vl, [(40, 24), (32, 56), (48, 48)], 4),
    "qwen3_vl": (qwen3_vl, [(100, 60), (64, 120), (96, 96)], 5),
    "llava_next": (llava_next, [(50, 30), (40, 70), (64, 64)], None),
    "llava_onevision": (llava_onevision, [(50, 30), (64, 64), (40, 70)], 4),
    "mistral3": (mistral3, [(40, 24), (32, 56), (48, 48)], None),
}
QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
COLOURS = [(200, 30, 30), (20, 160, 60), (30, 40, 220)]
LIMITS = [12, 4, 9, 7, 3, 10]      # new tokens per request: rows finish at different rounds


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def models(request, tmp_path_factory):
    build = FAMILIES[request.param][0]
    root = tmp_path_factory.mktemp(request.param)
    return request.param, build(root / "target", seed=1), build(root / "draft", seed=2, layers=1)


def _requests(family: str) -> list[Request]:
    _, sizes, frames = FAMILIES[family]
    imgs = [Image.new("RGB", size, colour) for size, colour in zip(sizes, COLOURS)]
    reqs = [Request([Message("user", "describe the image.", (im,))]) for im in imgs]
    reqs.append(Request([Message("user", "what is in this image?", (imgs[0],)),
                         Message("assistant", "a red thing."),
                         Message("user", "and in this one?", (imgs[1],))]))
    reqs.append(Request([Message("user", "say something.")]))
    if frames is not None:
        pixels = np.random.default_rng(frames).integers(0, 255, (frames, 40, 56, 3), dtype=np.uint8)
        reqs.append(Request([Message("user", "what happens?",
                                     videos=(clip_from_arrays(pixels, 2.0),))]))
    for i, req in enumerate(reqs):
        req.max_new_tokens = LIMITS[i % len(LIMITS)]
    return reqs


@pytest.fixture(scope="module")
def alone(models):
    """Each request decoded alone, target-only: the tokens every batch must give."""
    family, target, draft = models
    engine = family_session(target, draft, "none").engine
    return [engine.generate(r).tokens for r in _requests(family)]


CASES = {   # name → (method, draft: the other model or the target itself, settings)
    "none": ("none", "draft", []),
    "rejects": ("chain", "draft", ["drafting.inputs=[multimodal]"]),
    "accepts": ("chain", "target", ["drafting.inputs=[multimodal]"]),
    "some": ("chain", "target", ["drafting.inputs=[text]", "drafting.gamma=3"]),
    # a draft tree: each row's nodes at its own (3-D) positions under its ancestor mask
    "tree": ("tree", "target", ["drafting.inputs=[text]", "tree.depth=3", "tree.top_k=2",
                                "tree.total_tokens=6"]),
    # layer-skip self-speculation: each row drafts from its own copy of the first layer's
    # cache (3-D positions and deepstack through the split trunk), verified in the batch
    "twig": ("twig", "target", ["twig.model=none", "twig.layers=1", "twig.threshold=0",
                                "drafting.gamma=3"]),
}


@pytest.mark.parametrize("batch_size", [3, 8])
@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_equals_each_request_alone(models, alone, case, batch_size):
    family, target, draft = models
    method, which, sets = CASES[case]
    session = family_session(target, target if which == "target" else draft, method,
                             f"generation.batch_size={batch_size}", *sets)
    reqs = _requests(family)
    if case == "twig" and family not in QWEN:
        # the split trunk reads a video only in the 3-D rope families' prompts: elsewhere
        # (LLaVA-OneVision) a twig request with a video is refused, not decoded without it
        for r in (r for r in reqs if r.videos):
            with pytest.raises(ValueError, match="cannot read this request's video"):
                session.engine.generate(r)
        reqs = [r for r in reqs if not r.videos]
    # the same proposals as alone: each row's draft cache and positions its own
    results = batched_equals_alone(session, reqs, alone, batch_size, f"{family} request")
    # (layer-skip on the random LLaVA-NeXT target accepts nothing: its first layer and
    # head agree with the whole target on no token of these requests)
    if case in ("accepts", "some", "tree") or (case == "twig" and family != "llava_next"):
        assert sum(r.state.stats.num_accepted_tokens for r in results) > 0


@pytest.mark.parametrize("batch_size", [3, 8])
def test_batched_hidden_head_equals_each_request_alone(models, alone, tmp_path, batch_size):
    """The hidden-state head's chains on the Qwen families: each row's head reads its own
    target states from the batch's one forward at the row's own 3-D positions."""
    family, target, draft = models
    if family not in QWEN:
        pytest.skip("the LLaVA-like families' heads batch in tests/test_batch_heads.py")
    head = hidden_head(tmp_path / "head", target)
    session = family_session(target, draft, "hidden", f"hidden.model={head}",
                             "hidden.layer=null", "hidden.tree=false",
                             f"generation.batch_size={batch_size}")
    reqs = _requests(family)
    singles = [session.engine.generate(r) for r in reqs]
    results, _ = _batched(session.batched_engine(), reqs)
    assert [r.tokens for r in results] == [s.tokens for s in singles] == alone
    assert [r.state.stats.num_accepted_tokens for r in results] == \
        [s.state.stats.num_accepted_tokens for s in singles]
    assert sum(r.state.stats.num_draft_tokens for r in results) > 0
