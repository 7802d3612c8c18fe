"""The shipped profiles and their deep targets, end to end.

The rest of the suite resolves the shipped caption and video profile names to the smaller
targets the deep ones were grown from (tests/profiles/README.md); here the shipped files
are loaded by path, so every shipped deep model is exercised: each method decodes exactly
what its target's own greedy ``generate()`` does, and a fresh user's first command runs
the deep default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, fresh_scenes
from test_lossless import PROMPTS, reference
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.threads import PROCESS_THREADS, ThreadPlan
from vlmspec_cli.session import build_session

SHIPPED = ROOT / "profiles"
CPU = {"target.device": "cpu", "draft.device": "cpu"}


def shipped(name: str, *sets: str):
    return load_profile(str(SHIPPED / f"{name}.yaml"), overrides=list(sets), cli=CPU)


@pytest.fixture(scope="module")
def default_session():
    return build_session(shipped("tinyworld-caption"))


def _requests(n: int, seed: int, max_new_tokens: int = 32) -> list[Request]:
    return [Request([Message("user", PROMPTS[i % len(PROMPTS)], (image,))], max_new_tokens=max_new_tokens)
            for i, (_, image) in enumerate(fresh_scenes(n, seed=seed))]


def _equal_and_drafted(session, requests, reference_of) -> None:
    accepted = 0
    for req in requests:
        res = session.engine.generate(req)
        assert res.tokens == reference_of(req)
        accepted += res.state.stats.num_accepted_tokens
    assert accepted > 0, "the draft was never accepted"


def test_the_default_is_the_deep_target_and_its_head_and_equals_its_greedy_decoding(default_session):
    """The shipped default: the 32-layer target (zoo/deepen.py) drafted by its own
    hidden-state head, length auto (what calibrate ranks first on the examples, beside the
    EAGLE-3 head); its draft model, the 1-layer draft distilled on the target's answers
    (zoo/distill_draft.py), serves -m chain and the other draft-model methods."""
    target = default_session.target
    assert target.model.config.text_config.num_hidden_layers == 32
    profile = default_session.profile
    assert (profile.method, profile.hidden.model) == ("hidden", "zoo:tinyworld/llava-deep-hidden")
    assert default_session.method.draft_length(profile) == "auto"
    assert profile.draft.model == "zoo:tinyworld/llava-deep-draft"
    chain = build_session(shipped("tinyworld-caption", "method=chain"), target=target)
    assert chain.draft.model.config.text_config.num_hidden_layers == 1
    # the profile's runtime.threads: 1 while decoding, the process's count prefilling at
    # most (auto: fewer while other processes use the cores; the rest of the suite decodes
    # on the suite's count, tests/conftest.py)
    assert default_session.threads == ThreadPlan(prefill=PROCESS_THREADS, decode=1,
                                                 auto=frozenset({"prefill"}))
    assert "CPU threads: 1 decoding" in default_session.fast_path_summary()
    _equal_and_drafted(default_session, _requests(3, 3232), lambda r: reference(target, r))


def test_the_shipped_hidden_head_equals_the_deep_targets_greedy_decoding(default_session):
    """tinyworld-hidden: the deep target's own head (zoo/hidden.py --target llava-deep)."""
    session = build_session(shipped("tinyworld-hidden"))
    assert session.target.model.config.text_config.num_hidden_layers == 32
    _equal_and_drafted(session, _requests(2, 3233), lambda r: reference(default_session.target, r))


def test_the_shipped_eagle3_head_equals_the_deep_targets_greedy_decoding(default_session):
    """tinyworld-eagle3: the deep target's EAGLE-3 head, in the published layout, trained
    by the user's own command (bench/eagle3_tinyworld.py), reading layers 2, 16 and 29."""
    session = build_session(shipped("tinyworld-eagle3"))
    assert session.engine.hidden_layer == (2, 16, 29)
    _equal_and_drafted(session, _requests(2, 3234), lambda r: reference(default_session.target, r))


def test_the_shipped_twig_equals_the_deep_targets_greedy_decoding(default_session):
    """tinyworld-twig: the deep target's first 2 layers + its own twig (zoo/twig.py)."""
    session = build_session(shipped("tinyworld-twig"))
    assert session.target.model.config.text_config.num_hidden_layers == 32
    assert session.engine.drafter.twig.config.twig_from_layer == 2
    _equal_and_drafted(session, _requests(2, 3235), lambda r: reference(default_session.target, r))


def test_the_shipped_tabed_ensemble_on_the_deep_target(default_session):
    session = build_session(shipped("tinyworld-tabed"))
    assert session.target.model.config.text_config.num_hidden_layers == 32
    _equal_and_drafted(session, _requests(1, 3234, 24), lambda r: reference(default_session.target, r))


def test_a_fresh_users_first_command_runs_the_deep_default(default_session, tmp_path):
    """`vlmspec caption IMAGE` with no profile and no profile path set, as a fresh user
    runs it: the record names the deep target and holds its greedy output."""
    image = sorted((ROOT / "examples" / "images").glob("*.png"))[0]
    env = {k: v for k, v in os.environ.items() if k != "VLMSPEC_PROFILES"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(image), "--json",
                           "--max-new-tokens", "24", "--device", "cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["profile"] == "tinyworld-caption"
    assert record["settings"]["target"] == "zoo:tinyworld/llava-target-deep"
    from PIL import Image

    req = Request([Message("user", record["prompt"], (Image.open(image).convert("RGB"),))],
                  max_new_tokens=24)
    expected = default_session.target.tokenizer.decode(reference(default_session.target, req),
                                                       skip_special_tokens=True).strip()
    assert record["output"] == expected


def test_the_shipped_video_profile_is_the_deep_target_and_equals_its_greedy_decoding():
    """tinyworld-video: the 24-layer video target (zoo/deepen.py --family video) drafted by
    its own hidden-state head, and by the plain draft that reads the video."""
    import random

    from vlmspec_cli.tasks.video_io import clip_from_arrays
    from vlmspec_cli.zoo import video

    sessions = [build_session(shipped("tinyworld-video")),
                build_session(shipped("tinyworld-video", "method=chain"))]
    target = sessions[0].target
    assert target.model.config.text_config.num_hidden_layers == 24
    requests = []
    for seed, frames in ((920_001, 8), (920_002, 16)):
        script = video.random_script(random.Random(seed))
        clip = clip_from_arrays(video.render_script(script, frames), fps=frames / video.DURATION)
        requests.append(Request([Message("user", video.QUESTIONS[0], videos=(clip,))], max_new_tokens=40))

    for session in sessions:
        _equal_and_drafted(session, requests, lambda r: reference(target, r))


def test_the_shipped_video_eagle3_head_through_describe_video():
    """tinyworld-video-eagle3: the 24-layer video target's EAGLE-3 head (zoo.eagle3_build
    --task video: the user's command), in the published layout, through describe-video:
    the target's own greedy reply, mostly drafted. Sampled to 2 frames (it was trained on
    8), the video makes the head miss some tokens, so the equality also checks rejections
    (at the profile's fixed γ: with its auto length a run's rounds follow its timings, and
    one drafted exactly what was kept, 6 of 6, in the full suite under load)."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    video = ROOT / "examples" / "videos" / "red-circle-left-to-right.mp4"
    res = CliRunner().invoke(cli, ["describe-video", str(video), "-p",
                                   str(SHIPPED / "tinyworld-video-eagle3.yaml"), "--frames", "2",
                                   "--max-new-tokens", "16", "--device", "cpu", "--compare", "--json",
                                   "--set", "drafting.length=fixed"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = next(json.loads(line) for line in res.stdout.splitlines() if '"input"' in line)
    assert record["settings"]["target"] == "zoo:tinyworld/qwen-video-target-deep"
    assert record["eagle3"]["model"] == "zoo:tinyworld/qwen-video-deep-eagle3"
    assert record["compare"]["identical"] is True
    stats = record["stats"]
    assert stats["num_accepted_tokens"] >= stats["new_tokens"] // 2, stats   # a trained head
    assert stats["num_draft_tokens"] > stats["num_accepted_tokens"], stats   # and rejections


def test_the_shipped_image_profile_is_the_deep_generator_and_equals_hf_generate():
    """tinyworld-image: ADT-Tree on the 24-layer generator (zoo/deepen.py --family image)
    gives the 64 codes of transformers' own guided greedy image generation."""
    import torch

    from vlmspec_cli.tasks.imagegen import ImageJob, image_request

    session = build_session(shipped("tinyworld-image"))
    lm = session.target
    assert lm.model.config.text_config.num_hidden_layers == 24
    ad = lm.adapter
    lm.model.generation_config.generation_kwargs = {"boi_token_id": ad._special(lm, "boi_token_id")}
    prompt = "a red circle on a blue background"
    res = session.engine.generate(image_request(session, ImageJob("t", prompt, 0, 0, 0)))
    ids = ad.prompt_ids(lm, ad.prompt_text(lm, [Message("user", prompt)]))[:1]
    hf = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                           do_sample=False, guidance_scale=ad.guidance_scale(lm))
    assert res.tokens == hf[0].tolist()
    assert res.state.stats.num_accepted_tokens > 0


def test_every_tinyworld_profile_decodes_on_one_thread():
    """README: the tinyworld profiles ship runtime.threads 1 (prefills on auto);
    tinyworld-selfquant, which includes no other profile, had auto."""
    names = sorted(p.stem for p in SHIPPED.glob("tinyworld-*.yaml"))
    assert len(names) >= 10
    for name in names:
        runtime = load_profile(str(SHIPPED / f"{name}.yaml")).runtime
        assert runtime.threads == 1 and runtime.prefill_threads == "auto", name


def test_every_shipped_profile_drafts_at_auto_length_or_says_why_not():
    """Issue 60: auto is the draft length everywhere it applies (chains, trees, heads,
    videos, images); a shipped profile that pins fixed says why on that line."""
    import re

    import yaml

    from vlmspec_cli.drafters import method_class

    def pinned(path):
        """``path``'s lines that set length fixed (block or flow style), then those of the
        profiles it includes."""
        text = path.read_text()
        own = [line for line in text.splitlines() if re.search(r"\blength:\s*fixed\b", line)]
        include = (yaml.safe_load(text) or {}).get("include")
        if include and not include.endswith(".yaml"):
            include += ".yaml"
        return own + (pinned(SHIPPED / include) if include else [])

    profiles = sorted(SHIPPED.glob("*.yaml"))
    assert len(profiles) >= 20
    for path in profiles:
        prof = load_profile(str(path))
        lines = pinned(path)
        for line in lines:
            assert "#" in line and len(line.split("#", 1)[1].strip()) > 20, (path.name, line)
        # fixed only where a line (here or in a profile it includes) pins it and says why
        assert prof.drafting.length == "auto" or lines, path.name
        if not lines and method_class(prof.method).drafts and prof.generation.batch_size == 1:
            assert prof.drafting.length == "auto", path.name
    assert load_profile(str(SHIPPED / "tinyworld-image.yaml")).drafting.length == "auto"


def test_model_on_the_default_without_method_decodes_with_what_it_has(tmp_path):
    """The default's head was trained for its own target: `--model OTHER` without
    --method decodes with the draft model's chain (the profile names a draft), or
    target-only without one, saying so in one line; the head stays where it fits."""
    from vlmspec_cli.runtime.models.loading import resolve_model_source
    from vlmspec_cli.session import method_for_models

    # a target no head is shipped for: the 1-layer draft's folder (the 8-layer target's
    # folder would do no such thing: it is the zoo's llava-target, whose head is shipped)
    other = str(resolve_model_source("zoo:tinyworld/llava-draft"))
    kept, note = method_for_models(shipped("tinyworld-caption"))
    assert kept.method == "hidden" and note == ""
    chain, note = method_for_models(shipped("tinyworld-caption", f"target.model={other}"))
    assert chain.method == "chain" and note.startswith("method hidden reads a hidden model "
                                                       "trained for another target")
    assert "decoding with chain with draft zoo:tinyworld/llava-deep-draft" in note
    alone, note = method_for_models(shipped("tinyworld-caption", f"target.model={other}",
                                            "draft.model=null"))
    assert alone.method == "none" and "decoding with none" in note
    env = {k: v for k, v in os.environ.items() if k != "VLMSPEC_PROFILES"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    image = sorted((ROOT / "examples" / "images").glob("*.png"))[0]
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(image), "--model", other,
                           "--draft", "zoo:tinyworld/llava-draft", "--max-new-tokens", "8",
                           "--json", "--device", "cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["method"] == "chain" and "decoding with chain" in proc.stderr
