"""Qwen3-VL (16 px patches, deepstack visual features in the first decoder layers,
interleaved 3-D rope, videos written frame group by frame group with their timestamps):
tiny random-weight models saved to folders and loaded by path.

The adapter's inputs are HF's (image patches as Qwen2VLImageProcessor makes them, a video's
prompt text as Qwen3VLProcessor writes it); target-only decoding equals generate() on
images, a two-image message, a two-turn chat, a video and plain text; every method the
family runs equals target-only at T = 0, with the target as its own draft (every proposal
accepted) and with another random model; at T = 1 a chain's first tokens follow the
target's distribution; what cannot be exact is refused with its reason."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from families import (check_cli_compare, check_first_token_law, check_hidden_head, check_offline_profile,
                      qwen3_vl)
from test_lossless import reference
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import SessionError, build_session
from vlmspec_cli.tasks.video_io import clip_from_arrays

IMAGES = [((100, 60), (200, 30, 30)), ((64, 120), (20, 160, 60)), ((96, 96), (30, 40, 220))]
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_vl")
    return qwen3_vl(root / "target", seed=1), qwen3_vl(root / "draft", seed=2, layers=1)


def _clip(frames: int = 5):
    rng = np.random.default_rng(frames)
    return clip_from_arrays(rng.integers(0, 255, (frames, 50, 70, 3), dtype=np.uint8), fps=2.0)


def _requests() -> list[Request]:
    """Two single images of different sizes, two images in one message, a two-turn chat
    with an image in each turn, a video, plain text."""
    imgs = [Image.new("RGB", size, colour) for size, colour in IMAGES]
    singles = [Request([Message("user", "describe the image.", (im,))], max_new_tokens=8) for im in imgs[:2]]
    pair = Request([Message("user", "compare them.", (imgs[0], imgs[2]))], max_new_tokens=8)
    chat = Request([Message("user", "what is in this image?", (imgs[0],)),
                    Message("assistant", "a red thing."),
                    Message("user", "and in this one?", (imgs[1],))], max_new_tokens=8)
    video = Request([Message("user", "what happens?", videos=(_clip(),))], max_new_tokens=8)
    text = Request([Message("user", "say something.")], max_new_tokens=6)
    return singles + [pair, chat, video, text]


def _session(target, draft, method: str, *sets: str):
    # a fixed γ drafts every round (auto rules out the target as its own draft on a CPU)
    profile = load_profile("tinyworld-caption", [f"target.model={target}", f"draft.model={draft}",
                                                 f"method={method}", "drafting.length=fixed",
                                                 *sets])
    return build_session(profile)


def test_inputs_are_the_processors(models):
    """Image patches equal Qwen2VLImageProcessor's; a video's prompt is what
    Qwen3VLProcessor writes for it (timestamps, one group per 2 frames) and its frames take
    the video processor's size."""
    from transformers import AutoImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize
    from transformers.video_utils import VideoMetadata

    target, _ = models
    lm = _session(target, target, "none").target
    imgs = [Image.new("RGB", size, colour) for size, colour in IMAGES]
    hf = AutoImageProcessor.from_pretrained(target)(images=imgs, return_tensors="pt")
    prompt = "USER: " + "<|vision_start|><|image_pad|><|vision_end|>" * 3 + "hi ASSISTANT:"
    ours = lm.adapter.encode(lm, prompt, imgs)
    assert torch.equal(ours["image_grid_thw"], hf["image_grid_thw"])
    torch.testing.assert_close(ours["pixel_values"], hf["pixel_values"], rtol=0, atol=1e-6)

    clip = _clip()
    grid = lm.adapter.video_patches(lm, clip)[1]
    h, w = smart_resize(5, 50, 70, temporal_factor=2, factor=32, min_pixels=1024, max_pixels=4 * 64 * 64)
    assert grid.tolist() == [3, h // 16, w // 16]
    fake = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                           vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                           video_token="<|video_pad|>",
                           _calculate_timestamps=lambda *a: Qwen3VLProcessor._calculate_timestamps(None, *a))
    meta = VideoMetadata(total_num_frames=5, fps=2.0, frames_indices=list(range(5)))
    text = Qwen3VLProcessor.replace_video_token(fake, {"video_grid_thw": grid[None], "video_metadata": [meta]}, 0)
    prompt = "USER: <|vision_start|><|video_pad|><|vision_end|>what? ASSISTANT:"
    expected = lm.tokenizer(prompt.replace("<|video_pad|>", text))["input_ids"]
    assert "<0.2 seconds>" in text and "<2.0 seconds>" in text
    assert lm.adapter.encode(lm, prompt, None, videos=[clip])["input_ids"][0].tolist() == expected
    assert lm.adapter.prompt_length(lm, prompt, None, [clip]) == len(expected)


@pytest.fixture(scope="module")
def target_only(models) -> list[list[int]]:
    """Target-only tokens of each of ``_requests()``."""
    session = _session(*models, "none")
    return [session.engine.generate(req).tokens for req in _requests()]


def test_target_only_equals_generate(models, target_only):
    session = _session(*models, "none")
    assert type(session.target.adapter).__name__ == "Qwen3VLAdapter"
    assert session.target.fast is not None      # the fast path runs q_norm and k_norm
    for req, tokens in zip(_requests(), target_only):
        assert tokens == reference(session.target, req)


DRAFTED = [
    ("chain", ["drafting.inputs=[multimodal]"]),
    ("chain", ["drafting.inputs=[text]", "drafting.gamma=3"]),
    ("chain", ["drafting.inputs=[caption]"]),      # images only: the captioner writes the caption
    ("tabed", ["drafting.inputs=[multimodal]"]),
    ("tree", ["drafting.inputs=[multimodal]", "tree.depth=3", "tree.top_k=2", "tree.total_tokens=6"]),
]


@pytest.mark.parametrize("method,sets", DRAFTED)
@pytest.mark.parametrize("same_draft", [False, True])
def test_methods_equal_target_only(models, target_only, method, sets, same_draft):
    """The target as its own draft accepts every proposal (its visual inputs, deepstack
    features and 3-D positions must match the target's for that); another random model
    accepts few. Both decode target-only's tokens."""
    target, draft = models
    session = _session(target, target if same_draft else draft, method, *sets)
    accepted = drafted = 0
    for req, tokens in zip(_requests(), target_only):
        if "caption" in sets[0] and req.videos:
            continue
        res = session.engine.generate(req)
        assert res.tokens == tokens
        accepted += res.state.stats.num_accepted_tokens
        drafted += res.state.stats.num_draft_tokens
    if same_draft and "multimodal" in sets[0] and method == "chain":
        assert accepted == drafted > 0
    if not same_draft:
        assert accepted < drafted / 2


def test_first_token_follows_target_distribution_at_t1(models):
    """T = 1, chain with the random draft reading the image: the first generated token over
    300 seeds follows the target's exact law (tests/families.py check_first_token_law)."""
    check_first_token_law(*models, IMAGES[0], temperature=1)


def test_what_cannot_be_exact_is_refused(models):
    target, draft = models
    # refused from the draft's config, before anything loads
    with pytest.raises(SessionError, match="one drafting input at a time"):
        _session(target, draft, "tabed", "drafting.inputs=[multimodal,text]")
    with pytest.raises(SessionError, match="not as embeddings.*Qwen3-VL"):
        _session(target, target, "chain", "drafting.inputs=[pooled]")
    session = _session(target, target, "chain", "drafting.inputs=[multimodal]")
    one_frame = Request([Message("user", "what?", videos=(_clip(1),))], max_new_tokens=2)
    with pytest.raises(ValueError, match="at least 2 frames"):
        session.engine.generate(one_frame)
    # batches are exact (tests/test_batch_families.py): no longer refused
    assert _session(target, draft, "chain", "generation.batch_size=2").batched_engine().batch_size == 2


def test_twig_layer_skip_equals_target_only(models, target_only):
    """The twig without trained weights (twig.model=none: layers[:1] + the target's own head
    draft) runs the target's layers in two parts with the interleaved 3-D rope at the
    prompt's positions (later tokens at their 1-D position + the rope delta) and the
    deepstack features added after layers 0 and 1 as the model's decoder adds them: its
    prefill logits are the target's, and its tokens equal target-only on images of
    different sizes, two images in a message, a two-turn chat, a video and text."""
    target, draft = models
    session = _session(target, draft, "twig", "twig.model=none", "twig.layers=1")
    baseline = session.baseline_engine()
    drafted = 0
    for req, tokens in zip(_requests(), target_only):
        torch.testing.assert_close(session.engine.start(req).target_next_logits,
                                   baseline.start(req).target_next_logits, rtol=0, atol=1e-4)
        res = session.engine.generate(req)
        assert res.tokens == tokens
        drafted += res.state.stats.num_draft_tokens
    assert drafted > 0


@pytest.mark.parametrize("tree", [False, True])
def test_hidden_head_equals_target_only(models, tmp_path, tree):
    check_hidden_head(models[0], models[1], tmp_path, tree, _session, _requests())


def test_cli_caption_compare_by_path(models, tmp_path):
    check_cli_compare(models[0], models[1], tmp_path, (100, 60))


def test_real_model_profile_fails_with_one_clear_line_offline(tmp_path):
    check_offline_profile("qwen3-vl-8b", "Qwen/Qwen3-VL-8B-Instruct", tmp_path)
