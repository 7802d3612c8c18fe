"""Your own models, as docs/own-models.md walks them: a tiny
random-weight Qwen2.5-VL pair saved with ``save_pretrained`` next to a profile file that
names them by relative path, run from another directory through caption, describe-video
(the caption profile becomes a video one), profile, calibrate and a hidden-state head
trained for it. And the shipped heads and twigs: ``-m hidden`` / ``-m twig`` take the one
trained for the profile's target, or refuse one trained for another target; ``-m eagle3``
(no default head) takes the one shipped for the target."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from PIL import Image

from conftest import ROOT
from families import qwen2_5_vl
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile

SHIPPED_DEFAULT = str(ROOT / "profiles" / "tinyworld-caption.yaml")   # the 32-layer target


def invoke(*argv):
    return CliRunner().invoke(cli, [str(a) for a in argv], catch_exceptions=False)


@pytest.mark.parametrize("method,key,shipped", [
    ("hidden", "hidden.model", "zoo:tinyworld/llava-deep-hidden"),
    ("twig", "twig.model", "zoo:tinyworld/llava-deep-twig")])
def test_method_takes_the_head_or_twig_trained_for_the_target(method, key, shipped):
    """The schema's default head and twig were trained on the 8-layer target; on the
    shipped default's 32-layer target, -m picks the ones shipped for it, and says so (the
    shipped default names its own head: its section keeps it, and nothing is said)."""
    res = invoke("caption", ROOT / "examples" / "images", "-p", SHIPPED_DEFAULT, "-m", method,
                 "--dry-run")
    assert res.exit_code == 0, res.output
    section = res.stdout.split(f"\n{method}:\n", 1)[1]
    assert section.splitlines()[0].strip() == f"model: {shipped}"
    named = load_profile(SHIPPED_DEFAULT).hidden.model == shipped and method == "hidden"
    assert (f"using {shipped}" in res.stderr) != named
    assert named or f"{key} zoo:tinyworld/llava-" in res.stderr


@pytest.mark.parametrize("command,profile,shipped", [
    ("describe-video", "tinyworld-video", "zoo:tinyworld/qwen-video-deep-eagle3"),
    ("caption", "tinyworld-caption", "zoo:tinyworld/llava-deep-eagle3")])
def test_eagle3_takes_the_head_shipped_for_the_target(command, profile, shipped):
    """eagle3 has no default head: -m eagle3 on a shipped profile whose target has one
    shipped takes it and says so, leaving the rest of the eagle3: section the user's."""
    inputs = ROOT / "examples" / ("videos" if command == "describe-video" else "images")
    res = invoke(command, inputs, "-p", ROOT / "profiles" / f"{profile}.yaml", "-m", "eagle3",
                 "--set", "eagle3.tree=true", "--dry-run")
    assert res.exit_code == 0, res.output
    section = res.stdout.split("\neagle3:\n", 1)[1].splitlines()
    assert [line.strip() for line in section[:2]] == [f"model: {shipped}", "tree: true"]
    assert f"eagle3.model not set; using {shipped}" in res.stderr


def test_eagle3_without_a_head_for_the_target_is_refused():
    res = invoke("caption", ROOT / "examples" / "images", "-m", "eagle3", "--dry-run")  # 8 layers
    assert res.exit_code == 2 and res.stdout == ""
    assert "method 'eagle3' needs a head: set eagle3.model" in res.stderr


@pytest.mark.parametrize("method,hint", [("hidden", "python -m vlmspec_cli.zoo.hidden --target"),
                                         ("twig", "--set twig.model=none --set twig.layers=K")])
def test_method_refuses_a_head_or_twig_trained_for_another_target(tmp_path, method, hint):
    res = invoke("caption", ROOT / "examples" / "images", "--set", f"target.model={tmp_path}",
                 "-m", method, "--dry-run")
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert f"was trained for target zoo:tinyworld/llava-target, not {tmp_path}" in line
    assert hint in line


# ----------------------------------------------------------- docs/own-models.md's walk
def readme_examples():
    """scripts/readme_examples.py as a module (it extracts the README's and docs' examples)."""
    import importlib.util
    import sys

    name = "readme_examples"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "readme_examples.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _readme_walk():
    """docs/own-models.md's "A model folder, end to end": its python block (the models), its
    yaml block (the profile) and its commands, as the page writes them."""
    import importlib.util
    import re
    import shlex

    module = readme_examples()
    page = ROOT / "docs" / "own-models.md"
    readme = page.read_text()
    start = readme.index("## A model folder, end to end")
    first = readme[:start].count("\n") + 1
    last = first + readme[start:readme.index("The adapter is picked by", start)].count("\n")
    examples = [ex for ex in module.extract(page) if first <= ex.line <= last]
    (build,) = [ex.text for ex in examples if ex.kind == "python"]
    (written,) = [ex.text for ex in examples if ex.text.startswith("cat > ")]
    path, profile = re.fullmatch(r"cat > (\S+) <<'EOF'\n(.*\n)EOF", written, re.S).groups()
    assert path == "my-models/my-vlm.yaml"
    commands = [shlex.split(ex.text, comments=True) for ex in examples
                if ex.kind == "bash" and ex.text != written]
    return build, profile, commands


# what the page runs for real, cut to seconds: the last value of an option wins
CHEAPER = {"caption": ["--max-new-tokens", "4"], "describe-video": ["--max-new-tokens", "4", "--frames", "4"],
           "profile": ["--repeats", "3", "--warmup", "0"],
           "calibrate": ["--budget", "1", "--gammas", "2", "--top", "1", "--max-new-tokens", "4"],
           "vlmspec_cli.zoo.hidden": ["--stage1", "4", "--stage2", "2", "--feedback", "1",
                                      "--max-new-tokens", "4"]}


def test_the_readme_walk_runs_on_a_tiny_random_model(tmp_path, monkeypatch, capsys):
    """save_pretrained -> a profile beside the folders (model paths read from its folder)
    -> caption, describe-video (a caption profile, made a video one), profile, calibrate
    (its written profile decodes), a hidden-state head trained for the target; every
    decode equals target-only. Run from another directory than the models'."""
    from vlmspec_cli.zoo.hidden import main as train_head

    build, profile, commands = _readme_walk()
    for name in ("images", "videos"):
        (tmp_path / "examples" / name).mkdir(parents=True)
    for image in sorted((ROOT / "examples" / "images").glob("*.png"))[:2]:
        (tmp_path / "examples" / "images" / image.name).write_bytes(image.read_bytes())
    video = ROOT / "examples" / "videos" / "red-circle-left-to-right.mp4"
    (tmp_path / "examples" / "videos" / video.name).write_bytes(video.read_bytes())
    monkeypatch.chdir(tmp_path)
    exec(compile(build, "docs/own-models.md (A model folder, end to end)", "exec"), {"__name__": "walk"})
    assert {p.name for p in (tmp_path / "my-models" / "target").iterdir()} >= {
        "config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja",
        "preprocessor_config.json"}
    (tmp_path / "my-models" / "my-vlm.yaml").write_text(profile)
    assert [c[:2] for c in commands] == [
        ["vlmspec", "caption"], ["vlmspec", "describe-video"], ["vlmspec", "profile"],
        ["vlmspec", "calibrate"], ["vlmspec", "caption"], ["python", "-m"], ["vlmspec", "caption"]]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for argv in commands:
        if argv[0] == "python":
            module, args = argv[2], argv[3:]
            with pytest.raises(SystemExit) as done:
                train_head(args + CHEAPER[module])
            assert done.value.code == 0, capsys.readouterr().err
            continue
        args = argv[1:] + CHEAPER[argv[1]]
        if argv[1] in ("caption", "describe-video"):
            args += ["--json"] + (["--compare"] if "--compare" not in args else [])
        res = invoke(*args)
        assert res.exit_code == 0, (argv, res.output)
        if argv[1] in ("caption", "describe-video"):
            records = [json.loads(line) for line in res.stdout.splitlines()]
            assert records and all(r["error"] is None and r["compare"]["identical"] for r in records)
            if argv[1] == "describe-video":
                assert records[0]["task"] == "video"
            if "hidden.model=my-models/head" in args:
                assert records[0]["method"] == "hidden" and records[0]["stats"]["num_drafts"] > 0
    tuned = (tmp_path / "my-models" / "tuned.yaml").read_text()
    assert "include: my-vlm.yaml" in tuned and "hardware:" in (tmp_path / "my-models" / "hw.yaml").read_text()
    # the profile's model paths are its folder's, whatever the current directory
    monkeypatch.chdir(elsewhere)
    res = invoke("caption", tmp_path / "examples" / "images", "-p", tmp_path / "my-models" / "tuned.yaml",
                 "--max-new-tokens", "4", "-q")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2, res.output
    res = invoke("caption", tmp_path / "examples" / "images", "-p", tmp_path / "my-models" / "my-vlm.yaml",
                 "-m", "hidden", "--dry-run")
    assert res.exit_code == 2 and "python -m vlmspec_cli.zoo.hidden --target" in res.stderr
