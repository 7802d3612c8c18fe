"""LLaVA-NeXT (anyres tiling, image_sizes, image_newline): tiny random-weight models saved
to folders and loaded by path. Target-only decoding equals transformers' generate(); every
method that runs on the family equals target-only at T = 0, on images of different sizes
(different tile grids, so different token counts) and on a two-turn conversation with an
image in each turn; the CLI gives the target's own output with acceptance stats."""

from __future__ import annotations

import pytest

from families import (DRAFTED, TWIG, check_cli_compare, check_first_token_law, check_hidden_head,
                      check_offline_profile, family_session, image_requests, llava_next)
from test_lossless import reference
from vlmspec_cli.runtime.request import Request
from vlmspec_cli.session import SessionError

IMAGES = [((50, 30), (200, 30, 30)), ((40, 70), (20, 160, 60)), ((64, 64), (30, 40, 220))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava_next")
    return llava_next(root / "target", seed=1), llava_next(root / "draft", seed=2, layers=1)


def _requests() -> list[Request]:
    return image_requests(IMAGES, 12)


_session = family_session


def test_target_only_equals_generate(models):
    target, draft = models
    session = _session(target, draft, "none")
    assert type(session.target.adapter).__name__ == "LlavaNextAdapter"
    for req in _requests():
        assert session.engine.generate(req).tokens == reference(session.target, req)




@pytest.mark.parametrize("method,sets,same_draft",
                         [(*case, same) for case in DRAFTED for same in (False, True)]
                         + [(*TWIG, False)])
def test_methods_equal_target_only(models, method, sets, same_draft):
    """With the target as its own draft every proposal is accepted (the accepting path);
    with another random model nearly none is (the rejecting path). Both must decode the
    target's tokens."""
    target, draft = models
    session = _session(target, target if same_draft else draft, method, *sets)
    accepted = 0
    for req in _requests():
        res = session.engine.generate(req)
        assert res.tokens == session.baseline_engine().generate(req).tokens
        accepted += res.state.stats.num_accepted_tokens
    if same_draft:
        assert accepted > 0


def test_pooled_drafting_is_refused_with_a_reason(models):
    target, _ = models
    with pytest.raises(SessionError, match="anyres"):   # from its config, before loading
        _session(target, target, "chain", "drafting.inputs=[pooled]")


def test_first_token_follows_the_target_law_at_t_above_0(models):
    """Speculative sampling on the family: at T = 0.03 the random model's law has about 10
    tokens of 5+ expected draws in 300."""
    check_first_token_law(*models, IMAGES[0], temperature=0.03)


@pytest.mark.parametrize("tree", [False, True])
def test_hidden_head_equals_target_only(models, tmp_path, tree):
    check_hidden_head(models[-2], models[-1], tmp_path, tree, _session, _requests())


def test_cli_caption_compare_by_path(models, tmp_path):
    check_cli_compare(models[-2], models[-1], tmp_path, (50, 30))


def test_real_model_profile_fails_with_one_clear_line_offline(tmp_path):
    check_offline_profile("llava-next-7b", "llava-hf/llava-v1.6-vicuna-7b-hf", tmp_path)
