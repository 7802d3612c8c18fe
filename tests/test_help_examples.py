"""Every example in a command's --help that can run here is checked with --dry-run: its
options parse, its profile loads, its methods and categories exist. Two of bench's five
examples failed as printed (a category name cut short, a method refused for the profile's
target) and nothing noticed. Placeholder files (img.png, shots/, clip.mp4, the MMSpec
split) stand for the shipped examples; outputs go to a temporary folder."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from vlmspec_cli.cli import cli

ROOT = Path(__file__).resolve().parent.parent
IMAGE = str(ROOT / "examples/images/scene1.png")
IMAGES = str(ROOT / "examples/images")
VIDEO = str(ROOT / "examples/videos/red-circle-left-to-right.mp4")
VIDEOS = str(ROOT / "examples/videos")
STAND_INS = {"img.png": IMAGE, "a.png": IMAGE, "b.png": IMAGE, "shots/**/*.png": IMAGES,
             "shots/": IMAGES, "imgs/": IMAGES, "clip.mp4": VIDEO, "clip.webm": VIDEO,
             "clip.mkv": VIDEO, "clips/": VIDEOS, "prompts.txt": str(ROOT / "examples/prompts.txt"),
             "MMSpec/dataset/MMSpec/test/mmspec.jsonl": str(ROOT / "examples/mmspec/mmspec.jsonl"),
             "recipes/caption-folder.yaml": str(ROOT / "recipes/caption-folder.yaml"),
             "recipes/calibrate-then-caption.yaml": str(ROOT / "recipes/calibrate-then-caption.yaml"),
             "examples/images/": IMAGES, "examples/videos/": VIDEOS,
             "examples/mmspec/mmspec.jsonl": str(ROOT / "examples/mmspec/mmspec.jsonl")}
WRITES = ("--out", "--plot", "--trace", "--out-dir", "-o", "--write")
DRY_RUN = ("caption", "describe-video", "generate-image", "bench", "run")


def examples(command: str) -> list[str]:
    """The example command lines of ``vlmspec COMMAND --help`` (continuations joined,
    comments and shell redirections cut), those that start with ``vlmspec COMMAND``."""
    text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    block = text.split("Examples:", 1)[1].split("\n\n", 1)[0]
    lines, out = block.replace("\\\n", " ").splitlines(), []
    for line in lines:
        line = re.split(r"\s#\s", line.strip(), maxsplit=1)[0].split(" > ")[0].split(" | ")[0]
        if line.startswith(f"vlmspec {command} "):
            out.append(line)
    return out


def cases():
    for command in DRY_RUN:
        for line in examples(command):
            yield pytest.param(command, line, id=line[:70])


@pytest.mark.parametrize("command, line", list(cases()))
def test_each_help_example_passes_dry_run(command, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(line)[1:]
    if "-" in argv or any(a in ("frames_dir/", "recipe.yaml", "conversations.jsonl") for a in argv):
        pytest.skip("reads stdin or a file of the user's own")
    argv = [STAND_INS.get(a, a) for a in argv]
    argv = [f"{a.split('=')[0]}={STAND_INS.get(a.split('=', 1)[1], a.split('=', 1)[1])}"
            if argv[i - 1] == "--var" else a for i, a in enumerate(argv)]
    for i, a in enumerate(argv[:-1]):
        if a in WRITES:
            argv[i + 1] = str(tmp_path / "out" / Path(argv[i + 1]).name)
    res = CliRunner().invoke(cli, [*argv, "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, f"{line}\n{res.output}"


def test_the_examples_are_found():
    """The parser above finds the examples (a test that found none would pass)."""
    assert len(examples("bench")) == 5 and len(examples("caption")) >= 10
    assert all(len(examples(c)) >= 3 for c in DRY_RUN)


@pytest.mark.parametrize("command", ["caption", "describe-video", "generate-image", "bench",
                                     "calibrate", "profile", "run", "profiles"])
def test_help_fits_80_columns(command):
    """Examples and tables in --help are kept as written (click's \\b): 48 of their lines
    ran past 80 columns and the terminal cut them mid-word."""
    text = CliRunner().invoke(cli, [command, "--help"], terminal_width=80).output
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, long
