"""A head trained on the user's own workload: ``python -m vlmspec_cli.zoo.hidden --target DIR
--workload FILE.jsonl --out HEAD``. The file holds MMSpec lines and ``--chat`` lines; the
target answers every user turn again, its earlier answers fed back as bench feeds them
(zoo/own_answers.py); a bad line is named on stderr and skipped (exit 1); the head decodes
the target's own tokens. And the broad tinyworld workload (zoo/hidden_broad.py) covers
every topic and never draws with examples/mmspec's seed."""

from __future__ import annotations

import json
import random

import pytest
from PIL import Image

from families import llava_next
from vlmspec_cli.profile import ModelSpec, load_profile
from vlmspec_cli.runtime.models.loading import load_model
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session
from vlmspec_cli.zoo import hidden_broad
from vlmspec_cli.zoo.hidden import main
from vlmspec_cli.zoo.own_answers import Dialogue, UserTurn, answer_dialogues, training_pairs

TRAIN = ["--stage1", "6", "--stage2", "2", "--feedback", "1", "--max-new-tokens", "6"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return llava_next(tmp_path_factory.mktemp("workload_target") / "target", seed=2)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    folder = tmp_path_factory.mktemp("workload")
    (folder / "images").mkdir()
    Image.new("RGB", (50, 30), (200, 30, 30)).save(folder / "images" / "red.png")
    Image.new("RGB", (40, 70), (20, 160, 60)).save(folder / "green.png")
    lines = [
        {"id": "m1", "image": "red.png", "turns": ["what is this?", "and its colour?"],
         "topic": "general vqa"},
        {"id": "c1", "messages": [
            {"role": "user", "text": "describe the image.", "images": ["green.png"]},
            {"role": "assistant", "text": "not the target's words"},
            {"role": "user", "text": "say it shorter."}]},
        {"id": "m2", "image": "missing.png", "turns": ["what is this?"]},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n{not json\n"
    path = folder / "work.jsonl"
    path.write_text(text)
    return path


def _run(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return exit_info.value.code, capsys.readouterr().err


def test_head_for_your_workload_decodes_its_tokens(target, workload, tmp_path, capsys):
    head = tmp_path / "head"
    code, err = _run(capsys, "--target", str(target), "--workload", str(workload),
                     "--out", str(head), *TRAIN)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2, err
    assert "work.jsonl: line 3" in lines[0] and "missing.png" in lines[0]
    assert "work.jsonl: line 4" in lines[1]
    report = json.loads((head / "BUILD_REPORT.json").read_text())
    assert report["conversations"] == 2 and report["samples"] == 0 and report["skipped"] == 2
    profile = load_profile("tinyworld-caption", [f"target.model={target}", "method=hidden",
                                                 f"hidden.model={head}", "hidden.layer=null"])
    session = build_session(profile)
    image = Image.open(workload.parent / "green.png").convert("RGB")
    req = Request([Message("user", "describe the image.", (image,)),
                   Message("assistant", "a picture."), Message("user", "say it shorter.")],
                  max_new_tokens=8)
    res = session.engine.generate(req)
    assert res.tokens == session.baseline_engine().generate(req).tokens
    assert res.state.stats.num_draft_tokens > 0


def test_a_workload_that_is_no_file_is_one_error(target, tmp_path, capsys):
    code, err = _run(capsys, "--target", str(target), "--workload", str(tmp_path / "none.jsonl"),
                     "--out", str(tmp_path / "head"), *TRAIN)
    assert code == 2 and err.count("\n") == 1 and "none.jsonl" in err
    assert not (tmp_path / "head").exists()


def test_later_turns_read_the_targets_own_answers(target):
    lm = load_model(ModelSpec(model=str(target), device="cpu", dtype="float32"), "target")
    image = Image.new("RGB", (32, 32), (30, 40, 220))
    turns = [UserTurn("describe the image.", (image,)), UserTurn("repeat your answer.")]
    [done] = answer_dialogues(lm, [Dialogue(list(turns), "t")], max_new_tokens=5)
    [alone] = answer_dialogues(lm, [Dialogue(turns[:1], "t")], max_new_tokens=5)
    assert done.answers[0] == alone.answers[0] and len(done.answers) == 2
    [req], [tokens] = training_pairs([done], 5)
    assert [m.role for m in req.messages] == ["user", "assistant", "user"]
    assert req.messages[1].text == alone.answers[0] and tokens == done.last_tokens


def test_broad_workload_covers_every_topic_and_not_mmspecs_draw():
    dialogues = hidden_broad.broad_dialogues(300, seed=1)
    assert {d.tag.split(":")[0] for d in dialogues} == set(hidden_broad.TOPICS)
    assert any(len(d.turns) >= 3 for d in dialogues)
    sizes = {im.size for d in dialogues for t in d.turns for im in t.images}
    assert len(sizes) > 10          # odd sizes, crops, not only the 64 px renders
    again = hidden_broad.broad_dialogues(5, seed=1)
    assert [[t.text for t in d.turns] for d in again] == [[t.text for t in d.turns]
                                                         for d in dialogues[:5]]
    with pytest.raises(ValueError, match="mmspec"):
        hidden_broad.broad_dialogues(1, seed=hidden_broad.MMSPEC_SEED)
    image = hidden_broad.photo_like(Image.new("RGB", (64, 64), (0, 0, 0)), random.Random(3))
    assert image.mode == "RGB"
