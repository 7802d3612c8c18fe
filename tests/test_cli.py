"""The command line, through click's CliRunner and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from corpus import make_bad_corpus
from vlmspec_cli import __version__
from vlmspec_cli.cli import cli

FAST = ["--max-new-tokens", "12", "-q"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def images(tmp_path):
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    paths = []
    for i, (_, im) in enumerate(fresh_scenes(4, seed=555)):
        p = d / ("sub" if i == 3 else "") / f"scene{i}.png"
        im.save(p)
        paths.append(p)
    return d, paths


def run(args, input=None):
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_version_and_help():
    assert __version__ in run(["--version"]).output
    out = run(["--help"]).output
    for command in ("caption", "generate-image", "describe-video", "profile", "calibrate", "profiles"):
        assert command in out
    assert "Examples:" in run(["caption", "--help"]).output
    assert "Examples:" in run(["describe-video", "--help"]).output


@pytest.mark.parametrize("command,default", [
    ("caption", "tinyworld-caption"), ("profile", "tinyworld-caption"),
    ("calibrate", "tinyworld-caption"), ("generate-image", "tinyworld-image"),
    ("describe-video", "tinyworld-video")])
def test_help_names_each_commands_default_profile(command, default):
    from vlmspec_cli.profile import DEFAULT_PROFILE, load_profile

    help_text = " ".join(run([command, "--help"]).output.split())
    assert f"[default: {default}]" in help_text
    assert load_profile(default).task == {"generate-image": "image",
                                          "describe-video": "video"}.get(command, "caption")
    assert DEFAULT_PROFILE == "tinyworld-caption"


def test_subprocess_help_of_image_and_video_profiles():
    for command, default in (("generate-image", "tinyworld-image"), ("describe-video", "tinyworld-video")):
        proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", command, "--help"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and f"[default: {default}]" in " ".join(proc.stdout.split())


def test_caption_files_dir_glob_json(images):
    d, paths = images
    res = run(["caption", str(d), "--json", *FAST])
    assert res.exit_code == 0, res.output
    recs = records(res.stdout)
    assert [r["input"] for r in recs] == sorted(str(p) for p in paths)
    for r in recs:
        assert r["error"] is None and r["output"] and r["lossless"] is True and r["seed"] == 0
        assert r["stats"]["new_tokens"] == r["stats"]["num_accepted_tokens"] + r["stats"]["num_drafts"]
    res = run(["caption", str(d / "*.png"), "--json", *FAST])
    assert len(records(res.stdout)) == 3  # the glob is not recursive; sub/ is skipped
    res = run(["caption", str(paths[0]), *FAST])
    assert res.exit_code == 0 and res.stdout.startswith(f"{paths[0]}\t")


def test_caption_stdin_paths(images):
    _, paths = images
    listing = "\n".join(str(p) for p in paths[:2]) + "\n\n# comment\n"
    res = run(["caption", "-", "--json", *FAST], input=listing)
    assert res.exit_code == 0
    assert [r["input"] for r in records(res.stdout)] == [str(p) for p in paths[:2]]


def test_out_resume_skips_done_inputs(images, tmp_path):
    _, paths = images
    out = tmp_path / "caps.jsonl"
    assert run(["caption", str(paths[0]), str(paths[1]), "--out", str(out), *FAST]).exit_code == 0
    first = out.read_text().splitlines()
    assert len(first) == 2
    res = run(["caption", *map(str, paths), "--out", str(out), "--json", *FAST])
    assert res.exit_code == 0
    assert [r["input"] for r in records(res.stdout)] == [str(p) for p in paths[2:]]  # only new ones
    lines = out.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 4
    assert sorted(json.loads(l)["input"] for l in lines) == sorted(map(str, paths))


def test_bad_inputs_reported_batch_completes(images, tmp_path):
    d, paths = images
    bad = tmp_path / "bad"
    expected = make_bad_corpus(bad)
    expected["folder.png"] = "directory holds no image files"  # named explicitly: walked, empty
    out = tmp_path / "caps.jsonl"
    args = [str(paths[0]), str(bad / "missing.png")]
    args += [str(bad / name) for name in expected if name != "missing.png"]
    args += [str(paths[1])]
    res = run(["caption", *args, "--out", str(out), "--json", *FAST])
    assert res.exit_code == 1
    err_lines = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    for name, reason in expected.items():
        hits = [l for l in err_lines if name in l]
        assert len(hits) == 1 and reason in hits[0], (name, err_lines)
    assert len(err_lines) == len(expected)
    recs = [json.loads(l) for l in out.read_text().splitlines()]  # every line parses
    good = [r for r in recs if r["error"] is None]
    assert [r["input"] for r in good] == [str(paths[0]), str(paths[1])]
    assert all(r["output"] is None for r in recs if r["error"])
    # a rerun retries only the failures (which fail again) and skips the good ones
    res = run(["caption", *args, "--out", str(out), "--json", *FAST])
    assert res.exit_code == 1
    assert all(r["error"] for r in records(res.stdout))


def test_bad_directory_entries(tmp_path):
    d = tmp_path / "mixed"
    expected = make_bad_corpus(d)
    fresh_scenes(1, seed=1)[0][1].save(d / "ok.png")
    res = run(["caption", str(d), "--json", *FAST])
    assert res.exit_code == 1
    recs = records(res.stdout)
    assert [r["input"] for r in recs if r["error"] is None] == [str(d / "ok.png")]
    lines = res.stderr.splitlines()
    for name, reason in expected.items():
        # missing.png is not created, and a folder's sub-folders are not its inputs
        if name not in ("missing.png", "folder.png"):
            assert any(name in line and reason in line for line in lines), (name, reason)


def test_profile_errors_exit_2(tmp_path, images):
    _, paths = images
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: x\ndrafting: {gamma: 3\n")
    res = run(["caption", str(paths[0]), "--profile", str(bad_yaml)])
    assert res.exit_code == 2 and "bad.yaml" in res.stderr and "line" in res.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("drafting:\n  gama: 3\n")
    res = run(["caption", str(paths[0]), "--profile", str(unknown)])
    assert res.exit_code == 2 and "drafting.gama" in res.stderr and "drafting.gamma" in res.stderr
    res = run(["caption", str(paths[0]), "--set", "sampling.temprature=1"])
    assert res.exit_code == 2 and "sampling.temperature" in res.stderr
    res = run(["caption", str(paths[0]), "--method", "chian"])
    assert res.exit_code == 2 and "chain" in res.stderr
    assert run(["caption"]).exit_code == 2


def test_options_another_setting_would_use_are_refused_not_ignored(images, tmp_path):
    """--trace with a method that has no per-block trace wrote an empty file without a
    word; --workers / --ray-address without --executor ray were ignored: usage errors now,
    before anything loads or is written."""
    trace = tmp_path / "t.jsonl"
    res = run(["caption", str(images[0]), "--trace", str(trace)])
    assert res.exit_code == 2 and "method 'chain' has no per-block trace" in res.stderr
    assert not trace.exists()
    for option in (["--workers", "3"], ["--ray-address", "auto"]):
        res = run(["caption", str(images[0]), *option])
        assert res.exit_code == 2 and f"{option[0]} is for the Ray actor pool" in res.output


def test_inputs_given_to_a_method_that_reads_none_are_named_not_silently_dropped(images):
    """The default drafts with the target's hidden-state head, which reads no drafting
    input: --inputs changed nothing and said nothing. One line says so now."""
    for method, said in (("hidden", True), ("chain", False), ("tabed", False)):
        res = run(["caption", str(images[0]), "-m", method, "--inputs", "text", "--dry-run"])
        assert res.exit_code == 0, res.output
        assert ("--inputs text: method hidden reads no drafting input" in res.stderr) == said


def test_dry_run_json_is_one_json_object_per_command(images):
    """--dry-run --json printed YAML and comment lines, which no JSON reader takes: one
    object now (the profile, the planned items, how many past the shown)."""
    _, paths = images
    for args, first in (
            (["caption", str(paths[0]), str(paths[1])], {"input": str(paths[0]), "error": None}),
            (["generate-image", "a red circle", "-n", "2"],
             {"file": "images/000-a-red-circle-0.png", "prompt": "a red circle", "seed": 0,
              "error": None, "heatmap": None}),
            (["bench", str(ROOT / "examples/mmspec/mmspec.jsonl"), "-m", "none", "--limit", "1"],
             None)):
        res = run([*args, "--dry-run", "--json"])
        assert res.exit_code == 0, res.output
        plan = json.loads(res.stdout)
        assert plan["planned"] == 2 - (args[0] == "bench") and plan["more"] == 0
        assert plan["profile"]["target"]["model"].startswith("zoo:tinyworld/")
        if first is not None:
            assert plan["items"][0] == first


def test_model_and_draft_point_every_decoding_command_at_folders(images, tmp_path, monkeypatch):
    """--model DIR|ID and --draft DIR|ID on caption, describe-video, generate-image, bench,
    calibrate and profile: the target and the draft without a profile file (one word each
    for --set target.model=… / draft.model=…), read from the current directory, named in
    errors as the user typed them."""
    from vlmspec_cli.runtime.models.loading import resolve_model_source

    _, paths = images
    monkeypatch.chdir(tmp_path)
    target = resolve_model_source("zoo:tinyworld/llava-target")
    (tmp_path / "t").symlink_to(target)
    video = ROOT / "examples/videos/red-circle-left-to-right.mp4"
    for args in (["caption", str(paths[0])], ["describe-video", str(video)],
                 ["generate-image", "a red circle"],
                 ["bench", str(ROOT / "examples/mmspec/mmspec.jsonl"), "-m", "none"]):
        res = run([*args, "--model", "t", "--draft", "zoo:tinyworld/llava-draft", "--dry-run",
                   "--json"])
        assert res.exit_code == 0, (args, res.output)
        prof = json.loads(res.stdout)["profile"]
        assert (prof["target"]["model"], prof["draft"]["model"]) == ("t", "zoo:tinyworld/llava-draft")
    for command in ("calibrate", "profile"):
        assert "--model DIR|ID" in run([command, "--help"]).stdout
    res = run(["caption", str(paths[0]), "--model", " ", "--dry-run"])
    assert res.exit_code == 2 and "an empty name names no model" in res.output
    res = run(["caption", str(paths[0]), "--model", "t", "--set", "target.dtype=float7", "--dry-run"])
    assert res.exit_code == 2


def test_method_is_one_option_on_every_decoding_command_and_calibrate_profile_bench(images):
    """--method NAME beside --model/--draft on caption, describe-video, generate-image,
    calibrate, profile and bench (bench's -m is --methods): the profile's method without
    YAML. An unknown name is one line listing the valid ones, a method of another task one
    line naming the command it is for, both before anything loads."""
    _, paths = images
    video = str(ROOT / "examples/videos/red-circle-left-to-right.mp4")
    mmspec = str(ROOT / "examples/mmspec/mmspec.jsonl")
    for args, method in ((["caption", str(paths[0])], "hidden"), (["describe-video", video], "hidden"),
                         (["generate-image", "a red circle"], "tree"), (["bench", mmspec], "hidden")):
        res = run([*args, "--method", method, "--dry-run", "--json"])
        assert res.exit_code == 0, (args, res.output)
        assert json.loads(res.stdout)["profile"]["method"] == method
    assert "hidden" in json.loads(run(["bench", mmspec, "--method", "hidden", "--dry-run",
                                       "--json"]).stdout)["methods"][1]
    for command in ("calibrate", "profile", "bench"):   # the profile decides the task: each
        help_text = " ".join(run([command, "--help"]).output.split())   # method's are named
        assert "--method NAME" in help_text, command
        assert ("adt (image: ADT-Tree" in help_text) == (command != "bench"), command
    wrong = {"calibrate": [str(paths[0])], "profile": [], "bench": [mmspec, "--dry-run"],
             "caption": [str(paths[0]), "--dry-run"]}
    for command, args in wrong.items():
        res = run([command, *args, "--method", "chian"])
        assert res.exit_code == 2, (command, res.output)
        assert res.stderr.count("\n") == 1 and "unknown method 'chian'" in res.stderr
        assert "chain, eagle3, hidden, none" in res.stderr
        res = run([command, *args, "--method", "adt"])
        assert res.exit_code == 2, (command, res.output)
        assert res.stderr == ("error: method 'adt' adapts trees to an image-token grid: it is "
                              "for generate-image; use method 'tree' here\n"), command
    res = run(["profile", "-p", "tinyworld-image", "--method", "hidden"])
    assert res.exit_code == 2 and "generate-image supports methods none, tree, adt, not 'hidden'" in res.stderr


def test_dry_run_and_profiles_show_resolved_profile(images):
    _, paths = images
    res = run(["caption", str(paths[0]), "--dry-run", "--set", "drafting.gamma=3", "--temperature", "0.5"])
    assert res.exit_code == 0
    assert "gamma: 3" in res.stdout and "temperature: 0.5" in res.stdout and str(paths[0]) in res.stdout
    res = run(["profiles"])
    assert "tinyworld-caption" in res.stdout and "llava15-7b" in res.stdout
    assert "model: llava-hf/llava-1.5-7b-hf" in run(["profiles", "llava15-7b"]).stdout


def test_real_model_profile_fails_clearly_offline(images):
    _, paths = images
    env = {"HF_HUB_OFFLINE": "1"}
    res = CliRunner(env=env).invoke(cli, ["caption", str(paths[0]), "--profile", "llava15-7b", "-q"])
    assert res.exit_code == 2
    assert "llava-hf/llava-1.5-7b-hf" in res.stderr and "unreachable" in res.stderr
    # every model it would load, in one line: the draft too (it named the target alone,
    # and a user who downloaded it met the missing draft at the next run)
    assert "draft 'JackFram/llama-68m'" in res.stderr and res.stderr.count("\n") == 1
    assert "`hf download JackFram/llama-68m`" in res.stderr


@pytest.mark.quick
def test_compare_reports_identical_outputs(images):
    _, paths = images
    res = run(["caption", str(paths[0]), "--compare", "--json", *FAST])
    assert res.exit_code == 0
    (rec,) = records(res.stdout)
    assert rec["compare"]["identical"] is True and rec["compare"]["speedup"] > 0


def test_subprocess_end_to_end(images, tmp_path):
    d, paths = images
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    listing = "\n".join(map(str, paths[:2])) + "\n"
    proc = subprocess.run(
        [sys.executable, "-m", "vlmspec_cli", "caption", "-", str(tmp_path / "nope.png"), "--json",
         "--max-new-tokens", "12"],
        input=listing, capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 1
    recs = records(proc.stdout)
    assert [r["input"] for r in recs if r["error"] is None] == [str(p) for p in paths[:2]]
    assert "nope.png: no such file or directory" in proc.stderr
    assert "vlmspec summary" in proc.stderr  # the table goes to stderr, never stdout
