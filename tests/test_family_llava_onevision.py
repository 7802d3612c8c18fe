"""LLaVA-OneVision (anyres tiles shrunk past anyres_max_N, one view per image in a
multi-image request, videos as pooled frames): tiny random-weight models saved to folders
and loaded by path. Target-only decoding equals transformers' generate(); every method
that runs on the family equals target-only at T = 0 on images of different sizes (2, 4
and 16 tiles), a two-turn chat with an image in each turn, videos and a two-turn chat
with a video in each turn; at T = 1 the first token follows the target's own prefill
distribution; the CLI gives the target's own output with acceptance stats."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

import videofiles
from families import (DRAFTED, TWIG, check_cli_compare, check_first_token_law, check_hidden_head,
                      check_offline_profile, image_requests, llava_onevision)
from test_lossless import reference
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import SessionError, build_session
from vlmspec_cli.tasks.video_io import clip_from_arrays

IMAGES = [((50, 30), (200, 30, 30)), ((64, 64), (30, 40, 220)), ((40, 70), (20, 160, 60))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava_onevision")
    return llava_onevision(root / "target", seed=1), llava_onevision(root / "draft", seed=2, layers=1)


def _clip(n: int, size=(40, 24), colour=(255, 0, 0)):
    return clip_from_arrays(videofiles.moving_square_frames(n, size, color=colour), fps=4)


def _requests() -> list[Request]:
    return image_requests(IMAGES, 8, chat_images=(0, 2))


def _video_requests() -> list[Request]:
    single = Request([Message("user", "describe the video.", videos=(_clip(4),))], max_new_tokens=8)
    chat = Request([Message("user", "what moves here?", videos=(_clip(3),)),
                    Message("assistant", "a red square."),
                    Message("user", "and here?", videos=(_clip(3, (32, 32), (0, 200, 0)),))],
                   max_new_tokens=8)
    return [single, chat]


def _session(target, draft, method: str, *sets: str, task: str = "caption"):
    name = "tinyworld-video" if task == "video" else "tinyworld-caption"
    profile = load_profile(name, [f"target.model={target}", f"draft.model={draft}",
                                  f"method={method}", "drafting.length=fixed", *sets])   # drafts every round
    return build_session(profile)


def _video_session(target, draft, method: str, *sets: str):
    return _session(target, draft, method, *sets, task="video")


@pytest.fixture(scope="module")
def target_only(models):
    """Method none's tokens for ``_requests()`` and ``_video_requests()``, decoded once."""
    target, draft = models
    engine = _session(target, draft, "none").engine
    return {"image": [engine.generate(r).tokens for r in _requests()],
            "video": [engine.generate(r).tokens for r in _video_requests()]}


def test_target_only_equals_generate(models, target_only):
    target, draft = models
    session = _session(target, draft, "none")
    assert type(session.target.adapter).__name__ == "LlavaOnevisionAdapter"
    for kind, requests in (("image", _requests()), ("video", _video_requests())):
        for req, tokens in zip(requests, target_only[kind]):
            assert tokens == reference(session.target, req)
    both = Request([Message("user", "compare them.", (Image.new("RGB", (50, 30)),), (_clip(2),))],
                   max_new_tokens=8)
    text = Request([Message("user", "say something.")], max_new_tokens=6)
    for req in (both, text):
        assert session.engine.generate(req).tokens == reference(session.target, req)


def test_counts_and_embeddings_are_the_models_own(models):
    """The adapter's placeholder counts (prompt_length, no pixels built) are what encode
    expands; prompt_embeds are the model's own input embeddings with image features in
    place, for tiled, shrunk (16 tiles) and multi-image requests."""
    target, draft = models
    lm = _session(target, draft, "none").target
    for req in _requests():
        prompt = lm.adapter.prompt_text(lm, req.messages)
        inputs = lm.adapter.encode(lm, prompt, req.images)
        assert lm.adapter.prompt_length(lm, prompt, req.images) == inputs["input_ids"].shape[1]
        embeds, mask = lm.adapter.prompt_embeds(lm, prompt, req.images)
        with torch.no_grad():
            own = lm.model.model(**inputs, output_hidden_states=True).hidden_states[0]
        assert torch.equal(embeds, own) and int(mask.sum()) > 4 * len(req.images)


def test_chat_template_read_from_the_checkout(models, tmp_path):
    """Without the processor (it needs torchvision) and with no template in the tokenizer,
    the checkout's chat_template.json renders the prompt, video parts included."""
    import shutil

    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import load_model

    folder = shutil.copytree(models[0], tmp_path / "checkout")
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    lm = load_model(ModelSpec(model=str(folder), device="cpu"))
    assert lm.processor is None and lm.tokenizer.chat_template is None
    prompt = lm.adapter.prompt_text(lm, _video_requests()[0].messages)
    assert prompt == "USER: <video>\ndescribe the video. ASSISTANT:"




def _equal_to_target_only(session, requests, expected, same_draft: bool) -> None:
    accepted = 0
    for req, tokens in zip(requests, expected, strict=True):
        res = session.engine.generate(req)
        assert res.tokens == tokens
        accepted += res.state.stats.num_accepted_tokens
    if same_draft:
        assert accepted > 0


@pytest.mark.parametrize("method,sets,same_draft",
                         [(*case, same) for case in DRAFTED for same in (False, True)]
                         + [(*TWIG, False)])
def test_methods_equal_target_only(models, target_only, method, sets, same_draft):
    """With the target as its own draft every proposal is accepted (the accepting path);
    with another random model nearly none is (the rejecting path). Both must decode the
    target's tokens."""
    target, draft = models
    session = _session(target, target if same_draft else draft, method, *sets)
    _equal_to_target_only(session, _requests(), target_only["image"], same_draft)


def test_batched_chain_equals_target_only(models, target_only):
    """generation.batch_size 2: requests of different image sizes (so prompt lengths) and
    the multi-image chat in one ragged batch decode their target-only tokens."""
    target, draft = models
    engine = _session(target, draft, "chain", "drafting.inputs=[multimodal]",
                      "generation.batch_size=2").batched_engine()
    done = dict(engine.run(range(len(target_only["image"])), lambda i: _requests()[i]))
    assert [done[i].tokens for i in range(len(done))] == target_only["image"]


@pytest.mark.parametrize("same_draft", [False, True])
def test_batched_tree_equals_target_only(models, target_only, same_draft):
    """generation.batch_size 3, method tree: every row's tree verified in the batch's one
    ragged forward (requests of different image sizes and the multi-image chat) decodes
    the target-only tokens, with the target as its own draft (every node on the path
    accepted) and with another random model (nearly all rejected)."""
    target, draft = models[0], models[1]
    engine = _session(target, target if same_draft else draft, "tree",
                      "drafting.inputs=[multimodal]", "tree.depth=3", "tree.top_k=2",
                      "tree.total_tokens=6", "generation.batch_size=3").batched_engine()
    done = dict(engine.run(range(len(target_only["image"])), lambda i: _requests()[i]))
    assert [done[i].tokens for i in range(len(done))] == target_only["image"]
    assert sum(done[i].state.stats.num_draft_tokens for i in done) > 0


@pytest.mark.parametrize("inputs", ["multimodal", "text"])
@pytest.mark.parametrize("same_draft", [False, True])
def test_video_chains_equal_target_only(models, target_only, inputs, same_draft):
    """describe-video's chain: the draft reads the videos as the target does (multimodal)
    or the prompt with each <video> turned into "\\n" (text)."""
    target, draft = models
    session = _video_session(target, target if same_draft else draft, "chain",
                             f"drafting.inputs=[{inputs}]")
    _equal_to_target_only(session, _video_requests(), target_only["video"], same_draft)


def test_what_cannot_be_exact_is_refused(models):
    target, draft = models
    with pytest.raises(SessionError, match="anyres"):   # from its config, before loading
        _session(target, target, "chain", "drafting.inputs=[pooled]")
    two = Request([Message("user", "compare.", videos=(_clip(3), _clip(4)))], max_new_tokens=4)
    with pytest.raises(ValueError, match="same frame count"):
        _video_session(target, draft, "none").engine.generate(two)


@pytest.mark.parametrize("tree", [False, True])
def test_hidden_head_equals_target_only(models, tmp_path, tree):
    check_hidden_head(models[-2], models[-1], tmp_path, tree, _session, _requests())


def test_hidden_head_on_videos_equals_target_only(models, tmp_path):
    check_hidden_head(models[-2], models[-1], tmp_path, False, _video_session, _video_requests())


def test_first_token_at_temperature_one_follows_the_target(models):
    """300 seeded runs of a chain (another random draft reading the image, so proposals are
    drawn and mostly rejected): the first token follows the target's exact law
    (tests/families.py check_first_token_law)."""
    assert check_first_token_law(*models, IMAGES[0], temperature=1, gamma=1) > 30, \
        "the residual path was barely exercised"


def test_cli_caption_compare_by_path(models, tmp_path):
    check_cli_compare(models[-2], models[-1], tmp_path, (50, 30))


def test_cli_describe_video_compare_by_path(models, tmp_path):
    """`vlmspec describe-video FILE -m chain --inputs multimodal --compare` on a real mp4."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    video = videofiles.write_video(tmp_path / "clip.mp4", videofiles.moving_square_frames(8, (40, 24)))
    res = CliRunner().invoke(cli, ["describe-video", str(video), "--frames", "4", "-m", "chain",
                                   "--inputs", "multimodal", "--set", f"target.model={models[0]}",
                                   "--set", f"draft.model={models[1]}", "--compare", "--json",
                                   "--max-new-tokens", "8"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = next(json.loads(line) for line in res.stdout.splitlines() if '"input"' in line)
    assert record["compare"]["identical"] is True and record["stats"]["num_drafts"] > 0


def test_real_model_profile_fails_with_one_clear_line_offline(tmp_path):
    check_offline_profile("llava-onevision-7b", "llava-hf/llava-onevision-qwen2-7b-ov-hf", tmp_path)
