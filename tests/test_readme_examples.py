"""The README's shell examples, as written: every one is found (scripts/readme_examples.py
extracts them), every vlmspec command among them parses (its options exist, its values
convert), and each that has --dry-run passes it in a folder holding the inputs the README
names (the script's fixtures), in README order. Running them all for real takes minutes:
that is the script's job (`python scripts/readme_examples.py`, recorded in
bench/RESULTS.md)."""

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
    return readme_examples().extract()


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
            assert sub is not None, f"README:{ex.line}: no command {args[0]}"
            try:
                sub.make_context(args[0], list(args[1:]), parent=ctx)
            except Exception as exc:   # click's usage errors
                pytest.fail(f"README:{ex.line}: {' '.join(args)}: {exc}")


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
            assert res.exit_code == 0, f"README:{ex.line}: {' '.join(args)}: {res.stderr}"
            checked += 1
    assert checked >= 30
