"""``vlmspec profiles new NAME --model DIR``: a commented profile for a user's own model that
loads as written (``profiles show``, ``-p``) and decodes, written only where vlmspec may
write (never over a file it did not write)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile, profile_keys, profile_to_dict
from vlmspec_cli.runtime.models.loading import resolve_model_source

ROOT = Path(__file__).resolve().parent.parent
IMAGE = str(ROOT / "examples/images/scene1.png")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture()
def folders(tmp_path, monkeypatch):
    """A user's model folders (the tinyworld target and draft under their own names),
    with the current directory a fresh one."""
    monkeypatch.chdir(tmp_path)
    for name, zoo in (("my-vlm", "llava-target"), ("my-draft", "llava-draft"),
                      ("my-video-vlm", "qwen-video-target"), ("my-painter", "janus-target")):
        (tmp_path / name).symlink_to(resolve_model_source(f"zoo:tinyworld/{zoo}"))
    return tmp_path


def _settings(path: Path) -> list[tuple[str, str]]:
    """(dotted key, its line) of every key the file sets."""
    out, section = [], None
    for line in path.read_text().splitlines():
        m = re.match(r"^( *)([a-z_]+):", line)
        if m is None:
            continue
        if not m.group(1):
            section = m.group(2)
        out.append((f"{section}.{m.group(2)}" if m.group(1) else m.group(2), line))
    return out


@pytest.mark.quick
def test_the_written_profile_loads_as_made_is_commented_and_decodes(folders):
    res = run("profiles", "new", "mine", "--model", "./my-vlm", "--draft", "my-draft")
    assert res.exit_code == 0, res.output
    path = folders / "profiles" / "mine.yaml"
    assert res.stdout.strip() == str(Path("profiles") / "mine.yaml")
    assert "method chain (a method with a draft model" in res.stderr
    assert "vlmspec caption IMAGES -p mine" in res.stderr
    text = path.read_text()
    assert text.startswith("# written by `vlmspec profiles new`")
    # every key it sets is a profile key, on a line of its own with a comment saying
    # what it is and what it takes ([…]); sections too say what they are
    settings = _settings(path)
    keys = {k for k, _ in settings}
    assert {"name", "task", "method", "target.model", "draft.model", "drafting.length",
            "drafting.inputs", "sampling.temperature"} <= keys
    sections = {k.split(".")[0] for k in profile_keys()}
    for key, line in settings:
        assert key in profile_keys() or key in sections, key
        assert "  # " in line, line
        if key not in sections:     # a key's comment ends with what it takes
            comment = line.split("  # ", 1)[1]
            rest = text.split(line, 1)[1].splitlines()[1:]
            for more in rest:       # continued on comment lines below it
                if not more.lstrip().startswith("#") or not more.startswith(" " * 20):
                    break
                comment += " " + more.strip()[2:]
            assert re.search(r"\[[^\]]+\]$", comment), (key, comment)
    data = yaml.safe_load(text)
    assert data["target"]["model"] == str(folders / "my-vlm")   # absolute: read from any folder
    assert data["drafting"]["length"] == "auto" and data["method"] == "chain"
    # the round trip: by name (from this folder), by path, and shown resolved
    prof = load_profile("mine")
    assert profile_to_dict(prof) == profile_to_dict(load_profile(str(path)))
    assert (prof.target.model, prof.draft.model) == (str(folders / "my-vlm"), str(folders / "my-draft"))
    shown = run("profiles", "show", "mine")
    assert shown.exit_code == 0 and f"# profile from {path}" in shown.stdout
    assert run("profiles", "mine").stdout == shown.stdout      # show is the default
    res = run("caption", IMAGE, "-p", "mine", "--max-new-tokens", "10", "--compare", "--json", "-q")
    assert res.exit_code == 0, res.output
    record, = [json.loads(line) for line in res.stdout.splitlines()]
    assert record["compare"]["identical"] and record["method"] == "chain"


def test_task_method_and_heads_follow_the_model_and_the_options(folders):
    res = run("profiles", "new", "painter", "--model", "my-painter")     # generates images
    assert res.exit_code == 0, res.output
    prof = load_profile("painter")
    assert (prof.task, prof.method) == ("image", "none")
    assert "no --draft and no head shipped for this target" in res.stderr
    assert "image" in yaml.safe_load((folders / "profiles/painter.yaml").read_text())
    res = run("profiles", "new", "clips", "--model", "my-video-vlm", "--task", "video",
              "--method", "hidden", "--set", "drafting.gamma=7", "--set", "video.fps=2")
    assert res.exit_code == 0, res.output
    prof = load_profile("clips")
    assert (prof.task, prof.method, prof.drafting.gamma, prof.video.fps) == ("video", "hidden", 7, 2.0)
    assert prof.hidden.model == "zoo:tinyworld/qwen-video-hidden"   # the head shipped for it
    # no head shipped for the target: null in the file, and one line says it must be set
    res = run("profiles", "new", "head", "--model", "my-video-vlm", "--method", "eagle3",
              "--out", "elsewhere/head.yaml")
    assert res.exit_code == 0, res.output
    assert load_profile("elsewhere/head.yaml").eagle3.model is None
    assert "before it decodes: method 'eagle3' needs a head" in res.stderr
    assert "-p elsewhere/head.yaml" in res.stderr


@pytest.mark.parametrize("args, message", [
    (["--method", "adt"], "--method adt: method 'adt' adapts trees to an image-token grid"),
    (["--method", "chian"], "--method chian: unknown method 'chian' (did you mean 'chain'?)"),
    (["--task", "video"], "--task video: './my-vlm' (family llava) is for task caption"),
    (["--set", "drafting.gama=3"], "--set drafting.gama=3: unknown key 'drafting.gama'"),
])
def test_what_cannot_be_written_is_one_line_and_writes_nothing(folders, args, message):
    res = run("profiles", "new", "mine", "--model", "./my-vlm", *args)
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {message}") and res.stderr.count("\n") == 1, res.stderr
    assert not (folders / "profiles").exists()


def test_never_over_a_file_it_did_not_write(folders):
    path = folders / "profiles" / "mine.yaml"
    assert run("profiles", "new", "mine", "--model", "my-vlm").exit_code == 0
    first = path.read_text()
    res = run("profiles", "new", "mine", "--model", "my-vlm", "--draft", "my-draft")
    assert res.exit_code == 2 and "exists (use --force to overwrite)" in res.stderr
    assert path.read_text() == first
    res = run("profiles", "new", "mine", "--model", "my-vlm", "--draft", "my-draft", "--force")
    assert res.exit_code == 0 and "replaced profiles" in res.stderr
    assert load_profile("mine").draft.model == str(folders / "my-draft")
    mine = folders / "hand.yaml"          # a profile a person wrote: never, even with --force
    mine.write_text("name: hand\nmethod: none\n")
    res = run("profiles", "new", "hand", "--model", "my-vlm", "--out", mine, "--force")
    assert res.exit_code == 2 and "is not a profile written by `vlmspec profiles new`" in res.stderr
    assert mine.read_text() == "name: hand\nmethod: none\n"
    for name, why in (("tinyworld-caption", "is the name of profile"), ("a/b", "a profile name, not a file")):
        res = run("profiles", "new", name, "--model", "my-vlm")
        assert res.exit_code == 2 and why in res.stderr


def test_its_help_is_quick_and_fits_80_columns():
    """--help imports no torch (every --help stays well under a second) and keeps to 80
    columns."""
    import subprocess
    import sys

    code = ("import sys\nfrom click.testing import CliRunner\nfrom vlmspec_cli.cli import cli\n"
            "res = CliRunner().invoke(cli, ['profiles', 'new', '--help'], terminal_width=80)\n"
            "assert res.exit_code == 0 and '--model DIR|ID' in res.output, res.output\n"
            "assert all(len(line) <= 80 for line in res.output.splitlines()), res.output\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
