"""The shell examples of the README and of every docs/ page, as written: every one is found
(scripts/readme_examples.py extracts them, README.md then the pages in mkdocs.yml's nav
order), every vlmspec command among them parses (its options exist, its values convert),
and each that has --dry-run passes it in a folder holding the inputs the pages name (the
script's fixtures), in page order. Running them all for real takes minutes: that is the
script's job (`python scripts/readme_examples.py`, recorded in bench/history/RESULTS-until-2026-12-07.md)."""

from __future__ import annotations

import os
import re
import shlex

import pytest
from click.testing import CliRunner

from conftest import ROOT
from test_own_models import readme_examples
from vlmspec_cli.cli import cli


def _vlmspec_commands(text: str) -> list[list[str]]:
    """The vlmspec command lines of one example (each part of a pipeline, a redirection cut)."""
    out = []
    for part in text.split("\n", 1)[0].split("|"):
        words = shlex.split(part, comments=True)
        if ">" in words:
            words = words[:words.index(">")]
        if words and words[0] == "vlmspec":
            out.append(words[1:])
    return out


@pytest.fixture(scope="module")
def examples():
    return readme_examples().extract_all()


def test_every_page_is_read():
    """README.md first, then every page of docs/ (those the nav names in its order, then
    any it leaves out): an example moved from the README to a page stays checked."""
    module = readme_examples()
    names = [p.relative_to(ROOT).as_posix() for p in module.pages()]
    assert names[0] == "README.md"
    assert sorted(names[1:]) == sorted(p.relative_to(ROOT).as_posix()
                                       for p in (ROOT / "docs").glob("**/*.md"))
    with_examples = {ex.page for ex in module.extract_all()}
    for page in ("README.md", "docs/captioning.md", "docs/own-models.md", "docs/tuning.md",
                 "docs/methods.md", "docs/image-generation.md", "docs/video.md",
                 "docs/python-api.md", "docs/benchmarks.md", "docs/scale-out.md"):
        assert page in with_examples, page


def test_a_page_outside_the_nav_is_read_too(tmp_path):
    module = readme_examples()
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("x\n")
    (tmp_path / "docs" / "a.md").write_text("```bash\nvlmspec caption photo.png\n```\n")
    (tmp_path / "docs" / "b.md").write_text("b\n")
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - B: b.md\n")
    assert [p.name for p in module.pages(tmp_path)] == ["README.md", "b.md", "a.md"]


def test_every_example_is_found_and_each_skip_says_why(examples):
    runs = [ex for ex in examples if not ex.skip]
    assert len(examples) >= 50 and len(runs) >= 40
    assert all(ex.text.startswith(("vlmspec ", "find ", "python -m vlmspec_cli", "cat > "))
               for ex in runs if ex.kind == "bash"), [ex.text for ex in runs]
    assert {ex.kind for ex in runs} == {"bash", "python"}
    names = " ".join(ex.text for ex in runs)
    for command in ("caption", "describe-video", "generate-image", "profile", "calibrate",
                    "run", "bench"):
        assert f"vlmspec {command} " in names


def test_every_vlmspec_example_parses(examples):
    """Each command's own parser, values converted (no model loads, nothing runs)."""
    for ex in examples:
        for args in _vlmspec_commands(ex.text):
            ctx = cli.make_context("vlmspec", list(args), resilient_parsing=True)
            sub = cli.get_command(ctx, args[0])
            assert sub is not None, f"{ex.where}: no command {args[0]}"
            try:
                sub.make_context(args[0], list(args[1:]), parent=ctx)
            except Exception as exc:   # click's usage errors
                pytest.fail(f"{ex.where}: {' '.join(args)}: {exc}")


def test_the_examples_pass_dry_run_in_order(examples, tmp_path, monkeypatch):
    """In a folder with the README's inputs (examples/, recipes/, the script's fixtures):
    every example whose command has --dry-run passes it, but for a profile that an earlier
    example writes (`calibrate --write tuned`, then `--profile tuned`)."""
    module = readme_examples()
    for name in ("examples", "recipes"):
        os.symlink(ROOT / name, tmp_path / name)
    module.make_fixtures(tmp_path)
    monkeypatch.chdir(tmp_path)
    written: set[str] = set()
    checked = 0
    for ex in examples:
        made = re.match(r"cat > (\S+) <<", ex.text)   # a file the README has you write
        if made:
            written.add(made.group(1))
        for args in _vlmspec_commands(ex.text) if not ex.skip and "|" not in ex.text else []:
            sub = cli.commands[args[0]]
            if "--write" in args:
                written.add(args[args.index("--write") + 1])
            if args[:2] == ["profiles", "new"]:   # writes profiles/NAME.yaml
                written.add(args[2])
            if not any(p.name == "dry_run" for p in sub.params):
                continue
            profile = next((args[i + 1] for i, a in enumerate(args) if a in ("-p", "--profile")), None)
            res = CliRunner().invoke(cli, [*args, "--dry-run"], catch_exceptions=False)
            if profile in written:
                continue
            assert res.exit_code == 0, f"{ex.where}: {' '.join(args)}: {res.stderr}"
            checked += 1
    assert checked >= 30
