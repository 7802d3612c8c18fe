"""Batches of videos and of conversations (issue 61): describe-video on the tinyworld
Qwen2.5-VL video target (3-D positions, each video's own rope offset) decodes videos of
different lengths together at B = 3 and 8, each row the tokens it decodes alone at T = 0,
target-only, with the plain draft reading the video and with the hidden-state and EAGLE-3
heads' chains;
the CLI's records at --batch-size 3 equal B = 1's in shape and output, and --out resumes as
at B = 1. ``caption --chat`` conversations batch the same way."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

import videofiles
from test_batch import batched_equals_alone
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session
from vlmspec_cli.tasks.video_io import clip_from_arrays
from vlmspec_cli.zoo import video as world

CPU = {"target.device": "cpu", "draft.device": "cpu"}
FRAMES = [4, 8, 16, 8, 4, 12]          # prompts of different lengths
LIMITS = [24, 8, 16, 12, 4, 20]        # rows finish at different rounds
METHODS = {"none": ("tinyworld-video", ["method=none"]),      # method → (profile, settings)
           "chain": ("tinyworld-video", ["method=chain"]),
           "hidden": ("tinyworld-video", []),
           "eagle3": ("tinyworld-video-eagle3", [])}   # an M-RoPE head: each row its offset


def _videos() -> list[Request]:
    reqs = []
    for i, (frames, limit) in enumerate(zip(FRAMES, LIMITS)):
        script = world.random_script(random.Random(940_000 + i))
        clip = clip_from_arrays(world.render_script(script, frames), fps=frames / world.DURATION)
        reqs.append(Request([Message("user", world.QUESTIONS[i % 3], videos=(clip,))],
                            max_new_tokens=limit))
    return reqs


@pytest.fixture(scope="module")
def alone():
    session = build_session(load_profile("tinyworld-video", ["method=none"], cli=CPU))
    return [session.engine.generate(r).tokens for r in _videos()]


@pytest.mark.parametrize("batch_size", [3, 8])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_batched_videos_equal_each_video_alone(alone, method, batch_size):
    profile, sets = METHODS[method]
    session = build_session(load_profile(
        profile, ["drafting.length=fixed", f"generation.batch_size={batch_size}", *sets], cli=CPU))
    reqs = _videos()
    results = batched_equals_alone(session, reqs, alone, batch_size, "video")
    if method != "none":
        assert sum(r.state.stats.num_accepted_tokens for r in results) > 0


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _shape(record: dict) -> dict:
    """A record's keys, nested (what is written, not its values)."""
    return {k: _shape(v) if isinstance(v, dict) else type(v).__name__ for k, v in record.items()}


def test_cli_describe_video_batch_size_records_and_resume(tmp_path):
    folder = tmp_path / "clips"
    folder.mkdir()
    paths = []
    for i, n in enumerate([6, 12, 9, 15]):
        frames = list(world.render_script(world.random_script(random.Random(950_000 + i))))[:n]
        paths.append(videofiles.write_video(folder / f"v{i}.mp4", frames, fps=world.FPS))
    args = ["describe-video", str(folder), "--json", "-q", "--max-new-tokens", "12",
            "--fps", "4"]          # clips of different durations: prompts of different lengths
    one = run(args + ["--out", str(tmp_path / "one.jsonl")])
    out = tmp_path / "many.jsonl"
    many = run(args + ["--batch-size", "3", "--out", str(out)])
    assert one.exit_code == many.exit_code == 0, many.output
    a, b = _records(one.stdout), _records(many.stdout)
    assert sorted(r["input"] for r in a) == sorted(r["input"] for r in b) == sorted(map(str, paths))
    by_input = {r["input"]: r for r in a}
    for r in b:
        assert r["output"] == by_input[r["input"]]["output"] and r["error"] is None
        assert _shape(r) == _shape(by_input[r["input"]])      # records unchanged in shape
    # resume: a rerun decodes nothing; a record removed is decoded again, alone in its batch
    again = run(args + ["--batch-size", "3", "--out", str(out)])
    assert again.exit_code == 0 and again.stdout == ""
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[1:]) + "\n")
    redo = run(args + ["--batch-size", "3", "--out", str(out)])
    assert [r["input"] for r in _records(redo.stdout)] == [json.loads(lines[0])["input"]]
    kept = {r["input"]: r["output"] for r in _records(out.read_text())}
    assert kept == {r["input"]: r["output"] for r in map(json.loads, lines)}


def test_cli_chat_batch_size_equals_one_at_a_time(tmp_path):
    """--chat conversations of different lengths (one, two and three turns; with and
    without images) at --batch-size 3 write B = 1's outputs, and resume."""
    from PIL import Image

    Image.new("RGB", (40, 30), (200, 30, 30)).save(tmp_path / "a.png")
    Image.new("RGB", (24, 48), (30, 40, 220)).save(tmp_path / "b.png")
    user = lambda text, images=(): {"role": "user", "text": text, "images": list(images)}  # noqa: E731
    chats = [{"id": "c1", "messages": [user("describe the image.", ["a.png"])]},
             {"id": "c2", "messages": [user("what is in this image?", ["a.png"]),
                                       {"role": "assistant", "text": "a red square."},
                                       user("and in this one?", ["b.png"])]},
             {"id": "c3", "messages": [user("say something about shapes.")]},
             {"id": "c4", "messages": [user("how many shapes are there?", ["b.png"])]},
             {"id": "c5", "messages": [user("describe the image.", ["b.png"]),
                                       {"role": "assistant", "text": "a blue square."},
                                       user("what colour is the background?")]}]
    chat = tmp_path / "c.jsonl"
    chat.write_text("".join(json.dumps(c) + "\n" for c in chats))
    args = ["caption", "--chat", str(chat), "--json", "-q", "--max-new-tokens", "16"]
    one = run(args)
    out = tmp_path / "r.jsonl"
    many = run(args + ["--batch-size", "3", "--compare", "--out", str(out)])
    assert one.exit_code == many.exit_code == 0, many.output
    a = {r["input"]: r for r in _records(one.stdout)}
    b = {r["input"]: r for r in _records(many.stdout)}
    assert set(a) == set(b) and len(b) == 5
    assert all(a[k]["output"] == b[k]["output"] and b[k]["compare"]["identical"] for k in a)
    assert len({len(r["tokens"]) if "tokens" in r else r["stats"]["new_tokens"]
                for r in b.values()}) > 1      # rows of different lengths
    again = run(args + ["--batch-size", "3", "--out", str(out)])
    assert again.exit_code == 0 and again.stdout == ""
