"""Mistral 3 (Pixtral tower, patch merger, [IMG] / [IMG_BREAK] / [IMG_END] rows, image_sizes,
Mistral decoder): tiny random-weight models saved to folders and loaded by path.
Target-only decoding equals transformers' generate(); the adapter's embeddings are what
the model's own forward builds; every method that runs on the family (chain M/T/C/P,
TABED, trees, the hidden-state head, the twig) equals target-only at T = 0 on images of
different sizes (different grids, so token counts) and a two-turn conversation with an
image in each turn; at T = 1 the first token follows the target's prefill distribution;
the CLI gives the target's own output with acceptance stats."""

from __future__ import annotations


import pytest
import torch
from PIL import Image

from families import (DRAFTED, TWIG, check_cli_compare, check_first_token_law, check_hidden_head,
                      check_offline_profile, family_session, image_requests, mistral3)
from test_lossless import reference
from vlmspec_cli.runtime.request import Message, Request

# (width, height): grids of merged features 2x4, 4x3, 4x4 (longest edge 64, 16 px per feature)
IMAGES = [((50, 30), (200, 30, 30)), ((40, 70), (20, 160, 60)), ((64, 64), (30, 40, 220))]
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistral3")
    return mistral3(root / "target", seed=1), mistral3(root / "draft", seed=2, layers=1)


def _requests() -> list[Request]:
    return image_requests(IMAGES, 8)


@pytest.fixture(scope="module")
def expected(models) -> list[list[int]]:
    """Target-only tokens of each of ``_requests()`` (equal to generate(): tested below)."""
    session = _session(*models, "none")
    return [session.engine.generate(req).tokens for req in _requests()]


_session = family_session


def test_inputs_are_what_the_models_forward_builds(models):
    """The prompt holds the processor's layout (cols [IMG] and a [IMG_BREAK] per row, the
    last one [IMG_END]); the adapter's embeddings give the logits of the model's own forward
    on pixel_values + image_sizes, for single images and two images in one prompt."""
    target, _ = models
    lm = _session(target, target, "none").target
    ad = lm.adapter
    assert type(ad).__name__ == "Mistral3Adapter"
    first = _requests()[0]
    ids = ad.encode(lm, ad.prompt_text(lm, first.messages), first.images)["input_ids"][0]
    row = "[IMG]" * 4
    assert f"{row}[IMG_BREAK]{row}[IMG_END]describe" in lm.tokenizer.decode(ids)
    for req in _requests():
        prompt = ad.prompt_text(lm, req.messages)
        enc = ad.encode(lm, prompt, req.images)
        embeds, mask = ad.prompt_embeds(lm, prompt, req.images)
        assert embeds.shape[1] == enc["input_ids"].shape[1]
        assert torch.equal(mask, enc["input_ids"][0] == lm.model.config.image_token_id)
        with torch.no_grad():
            own = lm.model(**enc).logits
            ours = lm.model(inputs_embeds=embeds).logits
        torch.testing.assert_close(ours, own, rtol=0, atol=1e-5)


def test_target_only_equals_generate(models, expected):
    target = _session(*models, "none").target
    for req, tokens in zip(_requests(), expected):
        assert tokens == reference(target, req)




@pytest.mark.parametrize("method,sets,same_draft",
                         [(*case, same) for case in DRAFTED for same in (False, True)]
                         + [(*TWIG, False)])
def test_methods_equal_target_only(models, expected, method, sets, same_draft):
    """With the target as its own draft proposals are accepted (every one for chain M:
    the draft's embeddings are the target's inputs); with another random model few are.
    Both decode the target's tokens."""
    target, draft = models
    session = _session(target, target if same_draft else draft, method, *sets)
    accepted = drafted = 0
    for req, tokens in zip(_requests(), expected):
        res = session.engine.generate(req)
        assert res.tokens == tokens
        accepted += res.state.stats.num_accepted_tokens
        drafted += res.state.stats.num_draft_tokens
    if same_draft:
        assert accepted > 0
        if sets == DRAFTED[0][1]:
            assert accepted == drafted


def test_batched_chain_equals_target_only(models, expected):
    """generation.batch_size 2: requests of different image sizes (so prompt lengths) in
    one ragged batch decode their target-only tokens."""
    target, draft = models
    engine = _session(target, draft, "chain", "drafting.inputs=[multimodal]",
                      "generation.batch_size=2").batched_engine()
    done = dict(engine.run(range(len(expected)), lambda i: _requests()[i]))
    assert [done[i].tokens for i in range(len(expected))] == expected


def test_pooled_input_halves_each_grid_side(models):
    """Input P: each image's merged-feature grid pooled 2x2 (ceil), laid out in rows with
    their own breaks: 2x4 -> 1x2, 4x3 -> 2x2, 4x4 -> 2x2."""
    target, _ = models
    lm = _session(target, target, "none").target
    for (size, _), (rows, cols) in zip(IMAGES, [(1, 2), (2, 2), (2, 2)]):
        req = Request([Message("user", "describe the image.", (Image.new("RGB", size),))])
        prompt = lm.adapter.prompt_text(lm, req.messages)
        plain = lm.adapter.encode(lm, prompt, None)["input_ids"].shape[1]
        embeds, mask = lm.adapter.prompt_embeds(lm, prompt, list(req.images), pool=2)
        assert int(mask.sum()) == rows * cols and embeds.shape[1] == plain - 1 + rows * (cols + 1)


@pytest.mark.parametrize("tree", [False, True])
def test_hidden_head_equals_target_only(models, tmp_path, tree):
    check_hidden_head(models[-2], models[-1], tmp_path, tree, _session, _requests())


def test_first_token_follows_the_targets_distribution_at_t1(tmp_path):
    """Chain M at temperature 1 over 300 seeds: the first token's counts match the target's
    prefill distribution p and reject the draft's own q (so the check can fail), with
    proposals both accepted and rejected (the residual path runs)."""
    # the draft: the target's weights with a head twice as sharp (q peaks where p does,
    # but much higher: some proposals are accepted, many rejected)
    target = mistral3(tmp_path / "target", seed=1, layers=1, head_scale=20.0)
    draft = mistral3(tmp_path / "draft", seed=1, layers=1, head_scale=40.0)
    assert 30 < check_first_token_law(target, draft, IMAGES[0], temperature=1.0, gamma=1) < 270


def test_cli_caption_compare_by_path(models, tmp_path):
    check_cli_compare(models[-2], models[-1], tmp_path, (50, 30))


def test_real_model_profile_fails_with_one_clear_line_offline(tmp_path):
    check_offline_profile("mistral3-24b", "mistralai/Mistral-Small-3.1-24B-Instruct-2503", tmp_path)
