"""``python -m vlmspec_cli.zoo.hidden --target DIR SAMPLES --out HEAD``: a hidden-state
head trained for a user's own target (here a tiny random LLaVA-NeXT saved to a folder) on
the user's own images. A bad sample is named on stderr and skipped (exit 1); the head
loads with ``hidden.model`` and decodes the target's own tokens; --out never replaces a
folder that is not a vlmspec head, nor a head without --force."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from families import llava_next
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session
from vlmspec_cli.zoo.hidden import main

TRAIN = ["--stage1", "6", "--stage2", "2", "--feedback", "1", "--max-new-tokens", "6",
         "--prompt", "describe the image."]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return llava_next(tmp_path_factory.mktemp("user_target") / "target", seed=1)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("samples")
    for i, (size, colour) in enumerate([((50, 30), (200, 30, 30)), ((40, 70), (20, 160, 60)),
                                        ((64, 64), (30, 40, 220))]):
        Image.new("RGB", size, colour).save(folder / f"shot{i}.png")
    (folder / "broken.png").write_bytes(b"")        # empty: named on stderr, skipped
    return folder


def _run(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return exit_info.value.code, capsys.readouterr().err


def test_head_for_your_own_target_decodes_its_tokens(target, samples, tmp_path, capsys):
    head = tmp_path / "head"
    code, err = _run(capsys, "--target", str(target), str(samples), "--out", str(head), *TRAIN)
    assert code == 1 and "broken.png" in err and err.count("\n") == 1, err
    report = json.loads((head / "BUILD_REPORT.json").read_text())
    assert report["samples"] == 3 and report["skipped"] == 1
    profile = load_profile("tinyworld-caption", [f"target.model={target}", "method=hidden",
                                                 f"hidden.model={head}", "hidden.layer=null"])
    session = build_session(profile)
    drafted = 0
    for path in sorted(samples.glob("shot*.png")):
        req = Request([Message("user", "describe the image.", (Image.open(path).convert("RGB"),))],
                      max_new_tokens=8)
        res = session.engine.generate(req)
        assert res.tokens == session.baseline_engine().generate(req).tokens
        drafted += res.state.stats.num_draft_tokens
    assert drafted > 0


def test_out_never_replaces_what_is_not_its_own(target, samples, tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code, err = _run(capsys, "--target", str(target), str(samples), "--out", str(foreign), *TRAIN)
    assert code == 2 and "not a vlmspec hidden head" in err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

    head = tmp_path / "head"
    assert _run(capsys, "--target", str(target), str(samples / "shot0.png"), "--out", str(head),
                *TRAIN)[0] == 0
    before = (head / "model.safetensors").read_bytes()
    code, err = _run(capsys, "--target", str(target), str(samples / "shot1.png"), "--out", str(head),
                     *TRAIN)
    assert code == 2 and "--force" in err and (head / "model.safetensors").read_bytes() == before
    code, _ = _run(capsys, "--target", str(target), str(samples / "shot1.png"), "--out", str(head),
                   "--force", *TRAIN)
    assert code == 0 and json.loads((head / "BUILD_REPORT.json").read_text())["samples"] == 1
