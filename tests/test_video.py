"""describe-video on the tinyworld Qwen2.5-VL target: lossless drafting on fresh videos
(hidden-state head as chain and tree, plain draft reading the video), a draft cache that
holds no visual positions, and the CLI over real files — every container, frame folders,
bad files, resume, records."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from click.testing import CliRunner

import videofiles
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters.inputs import replace_images
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import SessionError, build_session
from vlmspec_cli.tasks.video_io import clip_from_arrays
from vlmspec_cli.zoo import video as world

CPU = {"target.device": "cpu", "draft.device": "cpu"}


@pytest.fixture(scope="module")
def sessions():
    """One session per method on the tinyworld video profile (models load once each)."""
    out = {}
    for name, sets in {"none": ["method=none"], "hidden": [],
                       "hidden-tree": ["hidden.tree=true"],
                       "chain": ["method=chain"],
                       "chain-text": ["method=chain", "drafting.inputs=[text]"]}.items():
        # every round drafts γ (and the draft is prefilled with the target): these tests
        # look at the draft's cache and what it proposes
        out[name] = build_session(load_profile("tinyworld-video", overrides=["drafting.length=fixed", *sets],
                                               cli=CPU))
    return out


def _video_request(seed: int, frames: int) -> tuple[Request, str]:
    script = world.random_script(random.Random(seed))
    clip = clip_from_arrays(world.render_script(script, frames), fps=frames / world.DURATION)
    return (Request([Message("user", world.QUESTIONS[seed % 3], videos=(clip,))], max_new_tokens=40),
            world.describe(script))


@pytest.fixture(scope="module")
def corpus(sessions):
    """Fresh scripts (seeds the zoo never trained on) at 4, 8 and 16 frames, with the
    target's own greedy output."""
    base = sessions["none"].engine
    out = []
    for i, frames in enumerate([4, 8, 8, 16, 8]):
        req, truth = _video_request(910_000 + i, frames)
        out.append((req, truth, base.generate(req).tokens))
    return out


@pytest.mark.parametrize("method", ["hidden", "hidden-tree", "chain", "chain-text"])
def test_video_drafting_equals_target_greedy(sessions, corpus, method):
    engine = sessions[method].engine
    acc = drafts = 0
    for req, _, ref in corpus:
        res = engine.generate(req)
        assert res.tokens == ref
        s = res.state.stats
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(res.tokens)
        assert sum(s.accept_len_hist) == s.num_drafts
        acc, drafts = acc + s.num_accepted_tokens, drafts + s.num_drafts
    assert 1 + acc / drafts > 2.0, f"{method}: the draft barely drafts"


def test_target_describes_fresh_videos(sessions, corpus):
    """The tinyworld target describes fresh videos mostly right (its BUILD_REPORT has the
    full accuracy table): a check that the test corpus is not run on a random model."""
    tok = sessions["none"].target.tokenizer
    right = sum(world.parse_description(tok.decode(ref, skip_special_tokens=True).strip())
                == world.parse_description(truth) for _, truth, ref in corpus)
    assert right >= 3


def test_hidden_draft_cache_has_no_visual_positions(sessions):
    """The head's cache holds text pairs only: its length is the same for a 4-frame and a
    16-frame video of the same script, while the target's prompt grows by the video."""
    engine = sessions["hidden"].engine
    lm = sessions["hidden"].target
    lengths = {}
    for frames in (4, 16):
        req, _ = _video_request(920_001, frames)
        req.max_new_tokens = 1   # stop right after the prefill: compare the prompt part
        res = engine.generate(req)
        ids = lm.adapter.encode(lm, res.state.prompt, None, videos=req.videos)["input_ids"][0]
        n_visual = int(lm.adapter.visual_mask(lm, ids).sum())
        st = res.state.drafter_state
        assert int(st.cache.get_seq_length()) == st.committed == len(ids) - n_visual - 1
        lengths[frames] = (len(ids), n_visual, st.committed)
    assert lengths[16][1] > lengths[4][1] >= 16           # more video tokens …
    assert lengths[16][2] == lengths[4][2]                # … the same draft cache


def test_text_draft_reads_the_prompt_without_the_video(sessions):
    """--inputs text: the draft's cache holds the prompt with the video placeholder turned
    into "\n" (the caption task's text input), far shorter than the target's."""
    engine = sessions["chain-text"].engine
    req, _ = _video_request(920_002, 8)
    state = engine.start(req)
    draft = sessions["chain-text"].draft
    text = replace_images(state.prompt, draft.adapter.image_token(draft), ["\n"])
    expected = len(draft.tokenizer(text)["input_ids"])
    assert int(state.drafter_state.cache.get_seq_length()) == expected
    assert expected < int(state.target_cache.get_seq_length()) - 16


def test_plain_draft_reads_the_video(sessions):
    """The MSD-like baseline does read every video token (its cache has the prompt)."""
    engine = sessions["chain"].engine
    req, _ = _video_request(920_002, 8)
    state = engine.start(req)
    draft_len = int(state.drafter_state.cache.get_seq_length())
    assert draft_len == int(state.target_cache.get_seq_length())


def test_video_methods_checked(sessions):
    with pytest.raises(SessionError, match="describe-video supports methods"):
        build_session(load_profile("tinyworld-video", overrides=["method=tabed"], cli=CPU))
    with pytest.raises(SessionError, match="does not take videos"):
        build_session(load_profile("tinyworld-video", overrides=["target.model=zoo:tinyworld/llava-target",
                                                                 "method=none"], cli=CPU))


# ------------------------------------------------------------------------- the CLI
def run(args, **kw):
    return CliRunner().invoke(cli, args, catch_exceptions=False, **kw)


FAST = ["--max-new-tokens", "24", "-q"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """One fresh script written in every container, plus a frame folder."""
    d = tmp_path_factory.mktemp("videos")
    script = world.random_script(random.Random(930_000))
    frames = list(world.render_script(script))
    paths = [videofiles.write_video(d / f"clip{suffix}", frames, fps=world.FPS)
             for suffix in (".mp4", ".webm", ".mkv", ".gif", ".avi")]
    folder = videofiles.write_frame_folder(d / "frames", frames[::3])
    return d, paths, folder, world.describe(script)


def test_cli_every_container_and_a_frame_folder(clips, tmp_path):
    d, paths, folder, truth = clips
    res = run(["describe-video", *map(str, paths), str(folder), "--json", "--frames", "8", *FAST])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["input"] for r in records] == [*map(str, paths), str(folder)]
    for r in records:
        assert r["task"] == "video" and r["error"] is None and r["lossless"] is True
        assert r["method"] == "hidden" and r["seed"] == 0
        assert r["videos"][0]["frames"] == 8 and r["videos"][0]["size"] == [64, 64]
        s = r["stats"]
        assert s["prefill_s"] > 0 and s["decode_s"] > 0 and 0 < s["prefill_share"] < 1
        # the head's proposals are really accepted (τ is 3.7 on this pair; a head that never
        # drafted, or whose drafts were all rejected, gives exactly 1.0), counted over the
        # rounds that drafted: auto γ may decode plain rounds on a busy machine
        drafted = s["draft_length"]["rounds_drafted"]
        assert drafted >= 1 and s["num_accepted_tokens"] / drafted > 0.5, s
        assert s["mean_acceptance_length"] == pytest.approx(
            1 + s["num_accepted_tokens"] / s["num_drafts"], abs=1e-4)
        assert s["draft_cache"]["entries"] < s["draft_cache"]["prompt_tokens"]
    # every container decodes to a video the target describes in its grammar
    assert all(world.parse_description(r["output"]) for r in records)


@pytest.mark.quick
def test_compare_with_a_failing_input_first_decodes_the_rest(clips, tmp_path):
    """describe-video DIR1 DIR2 --compare, DIR1's frames of different sizes: it ended in a
    traceback from --compare's warm-up and no record for either folder. Now DIR1 fails alone,
    in one line, and DIR2 is decoded and compared."""
    _, _, folder, _ = clips
    mixed = videofiles.write_frame_folder(tmp_path / "mixed", videofiles.indexed_frames(3, 32)
                                          + videofiles.indexed_frames(1, (40, 24)))
    res = run(["describe-video", str(mixed), str(folder), "--compare", "--json", "--frames", "4",
               *FAST])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "frames differ in size" in errors[0], res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["input"] for r in records] == [str(mixed), str(folder)]
    assert records[0]["error"] and records[1]["error"] is None
    assert records[1]["compare"]["identical"] is True


def test_cli_bad_files_fail_alone(clips, tmp_path):
    d, paths, _, _ = clips
    bad = {
        "trunc.mp4": videofiles.write_truncated(tmp_path / "trunc.mp4", keep=0.5),
        "zero.avi": videofiles.write_zero_frame(tmp_path / "zero.avi"),
        "audio.mkv": videofiles.write_audio_only(tmp_path / "audio.mkv"),
    }
    text = tmp_path / "notes.mp4"
    text.write_text("this is not a video\n")
    bad["notes.mp4"] = text
    out = tmp_path / "out.jsonl"
    args = ["describe-video", str(paths[0]), *map(str, bad.values()), "--out", str(out), *FAST]
    res = run(args)
    assert res.exit_code == 1
    err = [line for line in res.stderr.splitlines() if line.strip()]
    for name in bad:
        lines = [line for line in err if name in line]
        assert len(lines) == 1, (name, err)
    assert "audio only" in " ".join(err) and "no frames" in " ".join(err)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5 and sum(r["error"] is None for r in records) == 1
    # rerun: the good video is skipped, the bad ones are tried (and fail) again
    res = run(args[:-1] + ["--json"])
    assert res.exit_code == 1
    assert len(out.read_text().splitlines()) == 9
    assert all(json.loads(line)["error"] for line in res.stdout.splitlines())


def test_cli_usage_and_dry_run(clips, tmp_path):
    d, paths, _, _ = clips
    assert run(["describe-video"]).exit_code == 2
    res = run(["describe-video", str(paths[0]), "--frames", "4", "--fps", "2"])
    assert res.exit_code == 2 and "--frames or --fps" in res.output
    # --frames over a profile that samples by time: the command line wins (fps won, silently)
    res = run(["describe-video", str(paths[0]), "--set", "video.fps=2", "--frames", "3", "--dry-run"])
    assert res.exit_code == 0 and "frames: 3" in res.stdout and "fps: null" in res.stdout, res.stdout
    res = run(["describe-video", str(d), "--dry-run", "--set", "hidden.tree=true"])
    assert res.exit_code == 0 and "tree: true" in res.stdout
    assert all(str(p) in res.stdout for p in paths)
    res = run(["describe-video", str(paths[0]), "--set", "hidden.layr=-1"])
    assert res.exit_code == 2 and "hidden.layer" in res.stderr
    res = run(["caption", "x.png", "--profile", "tinyworld-video"])
    assert res.exit_code == 2 and "task 'video'" in res.stderr
    # a profile's batch size (calibrate writes one for captions) and --batch-size: videos
    # decode together (tests/test_batch_video.py)
    res = run(["describe-video", str(paths[0]), "--set", "generation.batch_size=2", "--dry-run"])
    assert res.exit_code == 0 and "batch_size: 2" in res.stdout, res.output
    res = run(["describe-video", str(paths[0]), "--batch-size", "3", "--dry-run"])
    assert res.exit_code == 0 and "batch_size: 3" in res.stdout, res.output


@pytest.mark.parametrize("inputs", ["caption", "pooled", "C"])
def test_cli_video_inputs_checked_before_loading_and_in_dry_run(clips, inputs):
    _, paths, _, _ = clips
    for extra in (["--dry-run"], []):
        res = run(["describe-video", str(paths[0]), "-m", "chain", "--inputs", inputs, *extra, *FAST])
        assert res.exit_code == 2 and "--inputs multimodal or text" in res.stderr
    res = run(["describe-video", str(paths[0]), "-m", "chain", "--inputs", "text", "--dry-run"])
    assert res.exit_code == 0 and "- text" in res.stdout


def test_cli_subprocess_text_draft(clips):
    """`-m chain --inputs text` works on every video (as --dry-run and the README say) and
    equals the target alone."""
    _, paths, folder, _ = clips
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "describe-video", str(paths[0]),
                           str(folder), "-m", "chain", "--inputs", "text", "--compare", "--json",
                           "--frames", "4", "--device", "cpu", "--max-new-tokens", "16",
                           # every round drafts: auto γ may switch a weak draft off on a
                           # busy machine (0 accepted, the run still right)
                           "--set", "drafting.length=fixed"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["error"] is None and record["drafting_inputs"] == ["text"]
        assert record["compare"]["identical"] is True and record["stats"]["num_accepted_tokens"] > 0


def test_cli_subprocess_fps_compare(clips):
    d, paths, _, _ = clips
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "describe-video", str(paths[2]),
                           "--fps", "2", "--compare", "--json", "--max-new-tokens", "24"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["compare"]["identical"] is True
    assert record["videos"][0]["frames"] == 6      # 3 s at 2 fps


def test_compare_warm_up_moves_past_a_request_that_fails_to_decode():
    """--compare's warm-up decodes the first request that builds; one whose decode raises
    (media its model cannot take) is that input's failure, reported by the timed loop: the
    warm-up goes on to the next instead of ending the batch."""
    from types import SimpleNamespace

    from vlmspec_cli.tasks.jobs import warm_up_compare

    bad, good = (Request([Message("user", t)], max_new_tokens=20) for t in ("bad", "good"))
    warmed = []

    def generate(request):
        if request.messages[0].text == "bad":
            raise ValueError("all input arrays must have the same shape")
        warmed.append(request.max_new_tokens)

    engine = SimpleNamespace(generate=generate, drafter=SimpleNamespace(captioner=None))
    session = SimpleNamespace(engine=engine, baseline_engine=lambda: engine)
    warm_up_compare(session, [lambda: bad, lambda: good])
    assert warmed == [8, 8]      # the good request, short, with the method and target-only
