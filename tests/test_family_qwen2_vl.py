"""Qwen2-VL and Qwen2.5-VL on still images (3-D rope positions; a draft of the family reads
images through its own inputs): tiny random-weight models saved to folders and loaded by
path. Target-only decoding equals transformers' generate(); chain M and T and draft trees
equal target-only at T = 0 on images of different sizes and a two-image chat, and so does
the twig (layer-skip) on those and a video; what cannot be exact yet (ensembles of image
inputs) is refused with its reason; batches: tests/test_batch_families.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from families import (check_cli_compare, check_first_token_law, check_hidden_head, check_offline_profile,
                      qwen2_5_vl, qwen2_vl)
from test_lossless import reference
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import SessionError, build_session
from vlmspec_cli.tasks.video_io import clip_from_arrays

IMAGES = [((40, 24), (200, 30, 30)), ((32, 56), (20, 160, 60)), ((48, 48), (30, 40, 220))]
FAMILIES = {"qwen2_5_vl": qwen2_5_vl, "qwen2_vl": qwen2_vl}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def models(request, tmp_path_factory):
    build = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    return request.param, build(root / "target", seed=1), build(root / "draft", seed=2, layers=1)


def _requests() -> list[Request]:
    imgs = [Image.new("RGB", size, colour) for size, colour in IMAGES]
    singles = [Request([Message("user", "describe the image.", (im,))], max_new_tokens=10) for im in imgs]
    chat = Request([Message("user", "what is in this image?", (imgs[0],)),
                    Message("assistant", "a red thing."),
                    Message("user", "and in this one?", (imgs[1],))], max_new_tokens=10)
    text = Request([Message("user", "say something.")], max_new_tokens=6)
    return singles + [chat, text]


def _session(target, draft, method: str, *sets: str):
    # a fixed γ drafts every round (auto rules out the target as its own draft on a CPU)
    profile = load_profile("tinyworld-caption", [f"target.model={target}", f"draft.model={draft}",
                                                 f"method={method}", "drafting.length=fixed",
                                                 *sets])
    return build_session(profile)


def test_target_only_equals_generate(models):
    family, target, draft = models
    session = _session(target, draft, "none")
    assert session.target.model.config.model_type == family
    for req in _requests():
        assert session.engine.generate(req).tokens == reference(session.target, req)


@pytest.mark.parametrize("method,sets", [
    ("chain", ["drafting.inputs=[multimodal]"]),
    ("chain", ["drafting.inputs=[text]", "drafting.gamma=3"]),
    ("tabed", ["drafting.inputs=[multimodal]"]),
    ("tree", ["drafting.inputs=[multimodal]", "tree.depth=3", "tree.top_k=2", "tree.total_tokens=6"]),
])
@pytest.mark.parametrize("same_draft", [False, True])
def test_methods_equal_target_only(models, method, sets, same_draft):
    """The target as its own draft accepts every proposal (the draft's images and 3-D
    positions must match the target's for that); another random model accepts few."""
    _, target, draft = models
    session = _session(target, target if same_draft else draft, method, *sets)
    accepted = drafted = 0
    for req in _requests():
        res = session.engine.generate(req)
        assert res.tokens == session.baseline_engine().generate(req).tokens
        accepted += res.state.stats.num_accepted_tokens
        drafted += res.state.stats.num_draft_tokens
    if same_draft and "multimodal" in sets[0] and method == "chain":
        assert accepted == drafted > 0


def test_what_cannot_be_exact_is_refused(models):
    _, target, draft = models
    with pytest.raises(SessionError, match="one drafting input at a time"):   # before loading
        _session(target, draft, "tabed", "drafting.inputs=[multimodal,text]")
    # batches are exact (tests/test_batch_families.py): no longer refused
    assert _session(target, draft, "chain", "generation.batch_size=2").batched_engine().batch_size == 2


def test_twig_layer_skip_equals_target_only(models):
    """The twig without trained weights (twig.model=none: layers[:1] + the target's own head
    draft) runs the target's layers in two parts at the prompt's 3-D positions, later
    tokens at their 1-D position + the prompt's rope delta: its prefill logits are the
    target's, and its tokens equal target-only on two images of different sizes, a
    two-image chat and a video. Qwen2.5-VL decodes on the fast path's static segments,
    Qwen2-VL over transformers' cache (runtime.fast_path=off)."""
    family, target, draft = models
    fast = "auto" if family == "qwen2_5_vl" else "off"
    session = _session(target, draft, "twig", "twig.model=none", "twig.layers=1",
                       f"runtime.fast_path={fast}")
    baseline = session.baseline_engine()
    frames = np.random.default_rng(4).integers(0, 255, (4, 28, 42, 3), dtype=np.uint8)
    video = Request([Message("user", "what happens?", videos=(clip_from_arrays(frames, 2.0),))],
                    max_new_tokens=10)
    drafted = 0
    singles, chat = _requests()[:2], _requests()[3]
    for req in singles + [chat, video]:
        torch.testing.assert_close(session.engine.start(req).target_next_logits,
                                   baseline.start(req).target_next_logits, rtol=0, atol=1e-4)
        res = session.engine.generate(req)
        assert res.tokens == baseline.generate(req).tokens
        drafted += res.state.stats.num_draft_tokens
    # off: transformers' cache as the adapter makes it (a DynamicCache with the rope offset)
    assert type(res.state.target_cache).__name__ == ("SegmentedCache" if fast == "auto" else "MRopeCache")
    assert drafted > 0


def test_first_token_follows_the_target_law_at_t_above_0(models):
    """Speculative sampling on the family (the draft reads the image with its own 3-D
    positions); at T = 0.1 the random model's law has 7-8 tokens of 5+ expected draws."""
    check_first_token_law(*models[1:], IMAGES[0], temperature=0.1)


@pytest.mark.parametrize("tree", [False, True])
def test_hidden_head_equals_target_only(models, tmp_path, tree):
    check_hidden_head(models[-2], models[-1], tmp_path, tree, _session, _requests())


def test_cli_caption_compare_by_path(models, tmp_path):
    check_cli_compare(models[-2], models[-1], tmp_path, (40, 24))


@pytest.mark.parametrize("profile,hub_id", [("qwen25-vl-7b", "Qwen/Qwen2.5-VL-7B-Instruct"),
                                            ("qwen2-vl-7b", "Qwen/Qwen2-VL-7B-Instruct")])
def test_real_model_profile_fails_with_one_clear_line_offline(tmp_path, profile, hub_id):
    check_offline_profile(profile, hub_id, tmp_path)
