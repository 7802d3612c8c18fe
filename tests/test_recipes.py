"""`vlmspec run RECIPE.yaml`: validation, execution, exit codes and resume."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from corpus import write_foreign_json, write_user_notes
from vlmspec_cli.cli import cli
from vlmspec_cli.cli.recipe_paths import path_params, step_paths
from vlmspec_cli.cli.recipes import Recipe, Step, run_recipe

ROOT = Path(__file__).resolve().parent.parent


def run(args):
    return CliRunner().invoke(cli, ["run", *args], catch_exceptions=False)


def write(path: Path, text: str) -> Path:
    path.write_text(text.lstrip("\n"), encoding="utf-8")
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


@pytest.fixture()
def folder(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    for i, (_, im) in enumerate(fresh_scenes(3, seed=7301)):
        im.save(d / f"s{i}.png")
    return d


GOOD_STEP = '  - caption: {inputs: [imgs], out: caps.jsonl, max_new_tokens: 8, quiet: true}\n'


@pytest.mark.parametrize("body, expected", [
    (GOOD_STEP + "  - captoin: {inputs: [imgs]}\n",
     "r.yaml:5: step 2: unknown command 'captoin' (did you mean 'caption'?)"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], max_tokens: 8}\n",
     "r.yaml:5: step 2: unknown option 'max_tokens' for caption (did you mean 'max_new_tokens'?)"),
    (GOOD_STEP + "  - caption:\n      inputs: ['${foldr}']\n",
     "r.yaml:5: step 2: undefined variable ${foldr} (did you mean ${folder}?)"),
    (GOOD_STEP + "  - [caption, imgs]\n", "r.yaml:5: step 2: a step is a one-key mapping"),
    (GOOD_STEP + "  - {caption: {inputs: [imgs]}, profiles: {}}\n",
     "r.yaml:5: step 2: a step is a one-key mapping"),
    (GOOD_STEP + "  - run: {}\n", "r.yaml:5: step 2: 'run' cannot be a step"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], max_new_tokens: 0}\n",
     "r.yaml:5: step 2: invalid value for 'max_new_tokens' of caption: 0 is not in the range"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], batch_size: many}\n",
     "r.yaml:5: step 2: invalid value for 'batch_size' of caption: 'many' is not a valid integer or auto."),
    (GOOD_STEP + "  - caption: {inputs: [imgs], temperature: .inf}\n",
     "r.yaml:5: step 2: invalid value for 'temperature' of caption: 'inf' is not a finite number"),
    (GOOD_STEP + "  - calibrate: {samples: [imgs], gammas: '0,2'}\n",
     "r.yaml:5: step 2: invalid value for 'gammas' of calibrate: 0 is not in the range 1<=x<=64"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], json: yes please}\n",
     "r.yaml:5: step 2: option 'json' of caption is a flag"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], out: [a, b]}\n",
     "r.yaml:5: step 2: option 'out' of caption takes one value, not a list"),
    (GOOD_STEP + "stpes: []\n", "r.yaml:5: unknown key 'stpes' (did you mean 'steps'?)"),
    ("  []\n", "r.yaml:4: 'steps' must be a non-empty list of one-key mappings like "
                "'- caption: {inputs: [DIR]}'"),
    (GOOD_STEP + "  - caption: {inputs: [imgs}\n", "r.yaml:5:28: invalid YAML: expected ','"),
])
def test_invalid_recipe_exits_2_and_runs_nothing(tmp_path, monkeypatch, body, expected):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", "name: t\nvars: {folder: imgs}\nsteps:\n" + body)
    res = run(["r.yaml"])
    assert res.exit_code == 2, res.output
    assert f"error: {expected}" in res.stderr
    assert not (tmp_path / "caps.jsonl").exists() and not (tmp_path / "r.state.json").exists()
    assert "step 1 (caption)" not in res.stderr  # step 1 is valid but was not started


@pytest.mark.parametrize("body, expected", [
    (GOOD_STEP + "  - caption: {inputs: [imgs], set: [drafting.gama=3]}\n",
     "r.yaml:5: step 2 (caption): --set drafting.gama=3: unknown key 'drafting.gama' (did you "
     "mean 'drafting.gamma'?)"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], method: chian}\n",
     "r.yaml:5: step 2 (caption): unknown method 'chian' (did you mean 'chain'?)"),
    (GOOD_STEP + "  - caption: {inputs: [imgs], profile: nope}\n",
     "r.yaml:5: step 2 (caption): unknown profile 'nope'"),
    (GOOD_STEP + "  - bench: {dataset: mm.jsonl, methods: 'none,tre'}\n",
     "r.yaml:5: step 2 (bench): unknown method 'tre' (did you mean 'tree'?)"),
])
def test_profiles_overrides_and_methods_are_checked_before_step_1(tmp_path, monkeypatch, folder,
                                                                    body, expected):
    """A step's profile, --set overrides and method(s), as its command would load them:
    they passed --dry-run and stopped the recipe at that step, after the steps before it
    had run (a profile step takes minutes)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.jsonl").write_text((ROOT / "examples/mmspec/mmspec.jsonl").read_text())
    write(tmp_path / "r.yaml", "name: t\nvars: {folder: imgs}\nsteps:\n" + body)
    for extra in (["--dry-run"], []):
        res = run(["r.yaml", *extra])
        assert res.exit_code == 2 and f"error: {expected}" in res.stderr, res.stderr
        assert res.stderr.count("error:") == 1 and "of 2:" not in res.stderr
    assert not (tmp_path / "caps.jsonl").exists() and not (tmp_path / "r.state.json").exists()


def test_hostile_recipe_and_state_files_are_one_line_errors(tmp_path, monkeypatch):
    """A recipe nested 100k deep, an alias bomb, a Latin-1 recipe, a FIFO as the recipe
    (a subprocess: the old read blocked), a state file of 100k-deep JSON: one line, exit
    2, no traceback, nothing changed."""
    import corpus

    monkeypatch.chdir(tmp_path)
    deep = write(tmp_path / "deep.yaml", "steps: " + "[" * corpus.DEEP + "]" * corpus.DEEP + "\n")
    bomb = write(tmp_path / "bomb.yaml", corpus.billion_laughs().replace(
        "generation: {prompt: *l8}", "steps: [{caption: {inputs: *l8}}]"))
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\u00e9\nsteps: []\n".encode("latin-1"))
    good = write(tmp_path / "r.yaml", "steps:\n" + GOOD_STEP)
    state = tmp_path / "deep.state.json"
    state.write_text("[" * corpus.DEEP + "]" * corpus.DEEP)
    os.mkfifo(tmp_path / "fifo.yaml")
    before = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in tmp_path.glob("*")
              if p.is_file()}
    for args, expected in (
            ([str(deep)], f"{deep}: nested more than 64 levels deep"),
            ([str(bomb)], f"{bomb}: its aliases expand it past 1.0 MiB"),
            ([str(latin1)], f"{latin1}: not UTF-8 text"),
            ([str(good), "--state", str(state)],
             f"state file {state}: exists and is not a vlmspec recipe state file")):
        res = run([*args, "--dry-run"])
        errors = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(errors) == 1, res.stderr[-2000:]
        assert errors[0].startswith(f"error: {expected}"), errors[0]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "run", "fifo.yaml", "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: fifo.yaml: is a FIFO (named pipe), not a recipe"
    assert {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in tmp_path.glob("*")
            if p.is_file()} == before


def test_unused_var_and_bad_var_syntax(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", "vars: {folder: imgs}\nsteps:\n" + GOOD_STEP.replace("[imgs]", "['${folder}']"))
    res = run(["r.yaml", "--var", "foldr=x"])
    assert res.exit_code == 2 and "--var foldr: the recipe has no variable 'foldr' (did you mean 'folder'?)" in res.stderr
    res = run(["r.yaml", "--var", "folder"])
    assert res.exit_code == 2 and "expected KEY=VALUE" in res.stderr


def test_dry_run_prints_resolved_argv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", """
vars: {folder: imgs, out: caps.jsonl, seed: null}
steps:
  - caption: {inputs: ["${folder}", -odd.png], out: "${out}", drafting_inputs: "M,T", set: [drafting.gamma=3, sampling.top_p=0.9],
              json: false, compare: true, seed: "${seed}", temperature: 0.5}
  - profiles: {name: tinyworld-caption}
""")
    (tmp_path / "imgs").mkdir()     # a step with none of its inputs there is refused
    res = run(["r.yaml", "--dry-run", "--var", "out=x y.jsonl", "--var", "folder=imgs"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        "vlmspec caption --out 'x y.jsonl' --inputs M,T --set drafting.gamma=3 --set sampling.top_p=0.9 --compare "
        "--temperature 0.5 -- imgs -odd.png",
        "vlmspec profiles tinyworld-caption",
    ]
    assert sorted(os.listdir(tmp_path)) == ["imgs", "r.yaml"]


def test_shipped_recipes_validate(monkeypatch):
    monkeypatch.chdir(ROOT)     # the recipe's ../examples/images, as the cwd names it
    res = run(["recipes/caption-folder.yaml", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.stdout == ("vlmspec caption examples/images --profile tinyworld-caption "
                          "--out captions.jsonl --quiet\n")
    res = run([str(ROOT / "recipes" / "calibrate-then-caption.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert [l.split()[:2] for l in res.stdout.splitlines()] == [
        ["vlmspec", "profile"], ["vlmspec", "calibrate"], ["vlmspec", "caption"]]
    assert res.stdout.splitlines()[2].endswith("--profile calibrated --out captions.jsonl --quiet")


def test_paths_a_step_reads_resolve_against_the_recipe_and_vars_against_the_cwd(tmp_path,
                                                                                monkeypatch):
    """Next to the recipe first (then the current directory); a --var value from the
    current directory; what a step writes stays in the current directory; a step whose
    inputs are none of them there is refused before anything runs, --dry-run included,
    unless an earlier step writes it."""
    (tmp_path / "book" / "pics").mkdir(parents=True)
    (tmp_path / "book" / "prompts.txt").write_text("a red circle\n")
    (tmp_path / "work" / "mine").mkdir(parents=True)
    (tmp_path / "work" / "mine" / "x.png").write_bytes(b"")
    recipe = write(tmp_path / "book" / "r.yaml", """
vars: {folder: pics, other: pics}
steps:
  - caption: {inputs: ["${folder}", "${other}/x.png"], out: caps.jsonl}
  - generate-image: {prompts_file: prompts.txt, out_dir: imgs}
  - caption: {inputs: [imgs], chat: caps.jsonl}
""")
    monkeypatch.chdir(tmp_path / "work")
    res = run([str(recipe), "--dry-run", "--var", "other=mine"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        f"vlmspec caption {tmp_path / 'book' / 'pics'} mine/x.png --out caps.jsonl",
        f"vlmspec generate-image --prompts-file {tmp_path / 'book' / 'prompts.txt'} --out-dir imgs",
        "vlmspec caption imgs --chat caps.jsonl"]
    res = run([str(recipe), "--dry-run", "--var", "folder=nowhere", "--var", "other=mine"])
    assert res.exit_code == 0, res.output       # one input of step 1 is there
    res = run([str(recipe), "--var", "folder=nowhere", "--var", "other=nowhere"])
    assert res.exit_code == 2 and res.stdout == "" and os.listdir(".") == ["mine"]
    (line,) = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert line.startswith(f"error: {recipe}:3: step 1 (caption): INPUTS nowhere: no such file")


def test_two_steps_run_then_rerun_skips(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", """
name: two
vars: {out: caps.jsonl, gamma: 3}
steps:
  - caption: {inputs: [imgs], out: "${out}", max_new_tokens: 8, quiet: true}
  - profiles: {name: tinyworld-caption, set: ["drafting.gamma=${gamma}"]}
""")
    res = run(["r.yaml"])
    assert res.exit_code == 0, res.output
    recs = lines(tmp_path / "caps.jsonl")
    assert sorted(r["input"] for r in recs) == [f"imgs/s{i}.png" for i in range(3)]
    assert all(r["error"] is None and r["output"] for r in recs)
    assert "gamma: 3" in res.stdout
    state = json.loads((tmp_path / "r.state.json").read_text())
    assert sorted(state["steps"]) == ["1", "2"]

    before = (tmp_path / "caps.jsonl").read_bytes()
    res = run(["r.yaml"])
    assert res.exit_code == 0
    assert "step 1 (caption): done in an earlier run, skipped" in res.stderr
    assert "step 2 (profiles): done in an earlier run, skipped" in res.stderr
    assert "gamma: 3" not in res.stdout and (tmp_path / "caps.jsonl").read_bytes() == before
    assert "would be skipped" in run(["r.yaml", "--dry-run"]).stderr
    assert "would be skipped" not in run(["r.yaml", "--dry-run", "--restart"]).stderr

    res = run(["r.yaml", "--var", "gamma=4"])  # step 2's argv changed: it reruns, step 1 not
    assert res.exit_code == 0
    assert "step 1 (caption): done" in res.stderr and "step 2 (profiles): done" not in res.stderr
    assert "gamma: 4" in res.stdout and (tmp_path / "caps.jsonl").read_bytes() == before
    res = run(["r.yaml"])  # back to gamma 3: the state now holds gamma 4's step 2
    assert "gamma: 3" in res.stdout and "step 1 (caption): done" in res.stderr

    res = run(["r.yaml", "--restart", "--state", "elsewhere.json"])
    assert res.exit_code == 0 and "skipped" not in res.stderr and "gamma: 3" in res.stdout
    assert "step 1 (caption) of 2" in res.stderr
    assert (tmp_path / "caps.jsonl").read_bytes() == before  # caption resumed: nothing added
    assert sorted(json.loads((tmp_path / "elsewhere.json").read_text())["steps"]) == ["1", "2"]


def test_a_done_step_runs_again_when_its_inputs_or_outputs_changed(folder, tmp_path, monkeypatch):
    """The state says done, the files say otherwise: an image added to the folder is
    captioned at the rerun (the step resumes: the others are not decoded again), a deleted
    --out is made again; a step that does not resume by itself (bench) runs again only when
    what it wrote is gone."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", """
name: changed
steps:
  - caption: {inputs: [imgs], out: caps.jsonl, max_new_tokens: 8, quiet: true}
  - bench: {dataset: mm.jsonl, methods: none, limit: 1, max_new_tokens: 4, out: b.jsonl, quiet: true}
""")
    (tmp_path / "mm.jsonl").write_text((ROOT / "examples/mmspec/mmspec.jsonl").read_text().splitlines()[0]
                                       .replace('"image":"', f'"image":"{ROOT}/examples/mmspec/images/') + "\n")
    assert run(["r.yaml"]).exit_code == 0
    (_, im), = fresh_scenes(1, seed=7302)
    im.save(folder / "s3.png")
    res = run(["r.yaml"])
    assert res.exit_code == 0, res.output
    assert "step 1 (caption): done in an earlier run, but what it reads changed" in res.stderr
    assert "step 2 (bench): done in an earlier run, skipped" in res.stderr
    recs = lines(tmp_path / "caps.jsonl")
    assert sorted(r["input"] for r in recs) == [f"imgs/s{i}.png" for i in range(4)]   # once each
    res = run(["r.yaml"])
    assert "step 1 (caption): done in an earlier run, skipped" in res.stderr
    (folder / "notes.txt").write_text("not an image: caption never reads it\n")
    res = run(["r.yaml"])   # the fingerprint is of the images the command decodes
    assert "step 1 (caption): done in an earlier run, skipped" in res.stderr, res.stderr
    (tmp_path / "caps.jsonl").unlink()
    (tmp_path / "b.jsonl").unlink()
    res = run(["r.yaml", "--dry-run"])
    assert "step 1 (caption): done in an earlier run, but --out caps.jsonl is not there: would run again" in res.stderr
    res = run(["r.yaml"])
    assert res.exit_code == 0, res.output
    assert "step 2 (bench): done in an earlier run, but --out b.jsonl is not there" in res.stderr
    assert len(lines(tmp_path / "caps.jsonl")) == 4 and lines(tmp_path / "b.jsonl")


def test_an_input_var_left_empty_is_refused_before_step_1(tmp_path, monkeypatch):
    """--var folder= made INPUTS '': it was not checked (the step loaded its models, then
    failed on '' and wrote an error record), unlike a missing folder."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", 'vars: {folder: imgs}\nsteps:\n'
          '  - caption: {inputs: ["${folder}"], out: caps.jsonl}\n')
    for extra in ([], ["--dry-run"]):
        res = run(["r.yaml", "--var", "folder=", *extra])
        assert res.exit_code == 2 and "r.yaml:3: step 1 (caption): INPUTS '': an empty path" in res.stderr
    assert not (tmp_path / "caps.jsonl").exists()


def test_a_step_writing_what_it_reads_is_refused_by_dry_run_too(folder, tmp_path, monkeypatch):
    """caption's own check refused ``--out`` naming one of its inputs when the step ran
    (after the steps before it); --dry-run passed the recipe. Both refuse it before step 1."""
    monkeypatch.chdir(tmp_path)
    first = sorted(p.name for p in (tmp_path / "imgs").iterdir())[0]
    (tmp_path / "p.yaml").write_text("")
    for step, said in ((f"{{inputs: [imgs/{first}], out: ./imgs/{first}}}",
                        f"--out ./imgs/{first} is also what it reads (INPUTS imgs/{first})"),
                       ("{inputs: [imgs], profile: p.yaml, out: p.yaml}",
                        "--out p.yaml is also what it reads (--profile p.yaml)"),
                       ("{inputs: [imgs], out: r.yaml}",
                        "--out r.yaml is also what it reads (the recipe r.yaml)")):
        write(tmp_path / "r.yaml", "steps:\n" + GOOD_STEP + f"  - caption: {step}\n")
        before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        for extra in (["--dry-run"], []):
            res = run(["r.yaml", *extra])
            assert res.exit_code == 2, res.output
            assert f"r.yaml:3: step 2 (caption): {said}" in res.stderr, res.stderr
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_another_recipes_state_file_is_not_taken_over(folder, tmp_path, monkeypatch):
    """Two recipes named r.yaml in two folders share r.state.json in the current directory:
    the second was told the first's steps were done (the same argv) and rewrote the file
    as its own; now it is refused (exit 2, nothing run) unless --restart."""
    monkeypatch.chdir(tmp_path)
    body = "steps:\n  - caption: {inputs: [imgs], out: caps.jsonl, max_new_tokens: 8, quiet: true}\n"
    write(tmp_path / "r.yaml", body)
    (tmp_path / "other").mkdir()
    write(tmp_path / "other" / "r.yaml", body.replace("[imgs]", f"[{folder}]"))
    assert run(["r.yaml"]).exit_code == 0
    state = (tmp_path / "r.state.json").read_text()
    for extra in ([], ["--dry-run"]):
        res = run(["other/r.yaml", *extra])
        assert res.exit_code == 2 and "records the steps of" in res.stderr and "--restart" in res.stderr
    assert (tmp_path / "r.state.json").read_text() == state
    res = run(["other/r.yaml", "--restart"])
    assert res.exit_code == 0 and "step 1 (caption) of 1" in res.stderr
    assert json.loads((tmp_path / "r.state.json").read_text())["recipe"] == str(tmp_path / "other" / "r.yaml")


def test_exit_1_continues_exit_2_stops(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", """
steps:
  - caption: {inputs: [imgs/s0.png, missing.png], out: caps.jsonl, max_new_tokens: 8, quiet: true}
  - profiles: {name: tinyworld-caption}
  - caption: {inputs: [imgs], out: notes.txt}
  - profiles: {}
""")
    (tmp_path / "notes.txt").write_text("my notes, not a vlmspec JSONL\n")   # step 3: exit 2
    res = run(["r.yaml"])
    assert res.exit_code == 2
    assert "r.yaml:2: step 1 (caption): some inputs failed (exit 1)" in res.stderr
    assert "profile from" in res.stdout  # step 2 ran
    assert "r.yaml:4: step 3 (caption) failed (exit 2); recipe stopped; step 4 not run" in res.stderr
    assert "step 4 (profiles)" not in res.stderr
    assert [r["input"] for r in lines(tmp_path / "caps.jsonl") if r["error"] is None] == ["imgs/s0.png"]
    assert list(json.loads((tmp_path / "r.state.json").read_text())["steps"]) == ["2"]

    write(tmp_path / "r.yaml", (tmp_path / "r.yaml").read_text().replace(
        "{inputs: [imgs], out: notes.txt}",
        "{inputs: [imgs/s1.png, missing.png], max_new_tokens: 4, out: caps3.jsonl}"))
    res = run(["r.yaml"])  # step 1 fails again (exit 1), step 3 now fails an input too
    assert res.exit_code == 1, res.output
    assert "step 2 (profiles): done in an earlier run, skipped" in res.stderr
    assert "step 4 (profiles) of 4" in res.stderr


def test_killed_mid_caption_rerun_neither_duplicates_nor_loses(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    names = []
    for i, (_, im) in enumerate(fresh_scenes(8, seed=7302)):
        im.save(d / f"k{i}.png")
        names.append(f"imgs/k{i}.png")
    write(tmp_path / "recipe.yaml", """
steps:
  - caption: {inputs: [imgs], out: caps.jsonl, max_new_tokens: 8, quiet: true}
  - profiles: {name: tinyworld-caption}
""")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "vlmspec_cli", "run", "recipe.yaml"]
    out = tmp_path / "caps.jsonl"
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the recipe finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = out.read_text().splitlines()
    assert 2 <= len(first) < 8
    assert not (tmp_path / "recipe.state.json").exists()  # step 1 never finished

    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "profile from" in res.stdout  # step 2 ran after the resumed step 1
    recs = lines(out)
    ok = [r["input"] for r in recs if r["error"] is None]
    assert sorted(ok) == names and len(recs) == 8  # one record per image, nothing failed
    assert out.read_text().splitlines()[:len(first) - 1] == first[:-1]  # earlier ones kept
    assert sorted(json.loads((tmp_path / "recipe.state.json").read_text())["steps"]) == ["1", "2"]


def test_state_file_never_overwrites_what_is_not_a_state_file(tmp_path, monkeypatch):
    """The state file (default ./RECIPE-STEM.state.json, or --state) is refused before any
    step runs when it is the recipe or a file that is not a recipe state; dry runs agree."""
    monkeypatch.chdir(tmp_path)
    recipe = write(tmp_path / "r.yaml", "steps:\n" + GOOD_STEP)
    recipe_text = recipe.read_bytes()
    kept = {tmp_path / "r.state.json": write_foreign_json(tmp_path / "r.state.json"),
            tmp_path / "notes.txt": write_user_notes(tmp_path / "notes.txt")}
    for extra in ([], ["--restart"], ["--dry-run"]):
        res = run(["r.yaml", *extra])                       # the default state path
        assert res.exit_code == 2 and "r.state.json: exists and is not a vlmspec recipe state" in res.stderr
        res = run(["r.yaml", "--state", "notes.txt", *extra])
        assert res.exit_code == 2 and "notes.txt" in res.stderr and len(res.stderr.splitlines()) == 1
        res = run(["r.yaml", "--state", "r.yaml", *extra])
        assert res.exit_code == 2 and "is the recipe itself" in res.stderr
    assert all(path.read_bytes() == data for path, data in kept.items())
    assert recipe.read_bytes() == recipe_text and not (tmp_path / "caps.jsonl").exists()
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "run", "r.yaml", "--state", "r.yaml"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "is the recipe itself" in proc.stderr
    assert recipe.read_bytes() == recipe_text


# ------------------------------------------------ the state file is no path a step uses
def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (symbolic links not followed) -> its md5."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = (f"-> {os.readlink(path)}" if path.is_symlink()
                                                else hashlib.md5(path.read_bytes()).hexdigest())
    return out


def assert_refused_untouched(tmp_path, args, before, *needles):
    """``vlmspec run ARGS`` (and its --dry-run) exit 2 with one stderr line holding every
    needle, run no step, print nothing and leave every file as it was."""
    for extra in ([], ["--dry-run"]):
        res = run([*args, *extra])
        assert res.exit_code == 2, res.output
        assert len(res.stderr.splitlines()) == 1, res.stderr
        line = res.stderr.splitlines()[0]
        assert line.startswith("error: state file ") and all(n in line for n in needles), line
        assert " of 1:" not in line and res.stdout == ""      # no step started or shown
        assert snapshot(tmp_path) == before                   # nothing written or changed


CAPTION_TO = "steps:\n  - caption: {{inputs: [imgs], out: {out}, max_new_tokens: 8, quiet: true}}\n"


@pytest.mark.parametrize("out, state", [
    ("caps3.jsonl", "caps3.jsonl"),                 # --state is the step's --out
    ("caps3.jsonl", "sub/../caps3.jsonl"),          # ... through ..
    ("caps3.jsonl", "{tmp}/caps3.jsonl"),           # ... absolute, --out relative
    ("real/caps3.jsonl", "link/caps3.jsonl"),       # ... through a linked folder
])
def test_state_that_a_step_writes_is_refused(folder, tmp_path, monkeypatch, out, state):
    """Data loss: the state written after the step replaced its captions."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real", target_is_directory=True)
    write(tmp_path / "r.yaml", CAPTION_TO.format(out=out))
    state = state.format(tmp=tmp_path)
    before = snapshot(tmp_path)
    assert_refused_untouched(tmp_path, ["r.yaml", "--state", state], before,
                             f"state file {Path(state)}: is --out {out} of step 1 (caption, "
                             "r.yaml:2)", "give another --state PATH")
    assert not any(tmp_path.rglob("caps3.jsonl"))


def test_default_state_name_that_a_step_writes_is_refused(folder, tmp_path, monkeypatch):
    """The default state name (RECIPE-STEM.state.json) as a step's output: refused too."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "caps.yaml", CAPTION_TO.format(out="caps.state.json"))
    before = snapshot(tmp_path)
    assert_refused_untouched(tmp_path, ["caps.yaml"], before,
                             "state file caps.state.json: is --out caps.state.json of step 1 "
                             "(caption, caps.yaml:2)")
    assert not (tmp_path / "caps.state.json").exists()


@pytest.mark.parametrize("state", ["gen/000-a-red-circle-0.png", "gen/notes.state.json",
                                   "lnk/000-a-red-circle-0.png"])
def test_state_in_a_generate_image_out_dir_is_refused(tmp_path, monkeypatch, state):
    """A state path inside --out-dir: the step writes files named by prompts there (the
    image at gen/000-a-red-circle-0.png became the state JSON)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gen").mkdir()
    write_foreign_json(tmp_path / "gen" / "001-kept-0.json")
    (tmp_path / "lnk").symlink_to("gen", target_is_directory=True)
    write(tmp_path / "img.yaml", 'steps:\n  - generate-image: {prompts: ["a red circle"], '
                                 'out_dir: gen, quiet: true}\n')
    before = snapshot(tmp_path)
    assert_refused_untouched(tmp_path, ["img.yaml", "--state", state], before,
                             f"state file {state}: is inside --out-dir gen of step 1 "
                             "(generate-image, img.yaml:2)")
    assert not (tmp_path / "gen" / "000-a-red-circle-0.png").exists()


def test_state_beside_the_steps_paths_runs(tmp_path, monkeypatch):
    """No false alarms: a state next to an --out-dir, or in a folder a step only reads."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "r.yaml", """
steps:
  - caption: {inputs: [.], out: caps.jsonl}
  - generate-image: {prompts: ["a red circle"], out_dir: gen}
""")
    for state in ([], ["--state", "gen.state.json"], ["--state", "gen2/x.json"]):
        res = run(["r.yaml", "--dry-run", *state])
        assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2, res.output


def test_state_write_rechecks_what_a_step_made(tmp_path, monkeypatch, capsys):
    """Every state write checks the file again: a step that made a file at the state path
    (by a path no option shows) keeps it; the run stops with one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    state = tmp_path / "r.state.json"

    @click.command("scribble")
    def scribble():
        state.write_text("the user's notes\n")

    recipe = Recipe(write(tmp_path / "r.yaml", "steps: []\n"), "r", "",
                    [Step(1, 2, "scribble", []), Step(2, 3, "scribble", [])])
    assert run_recipe(recipe, {"scribble": scribble}, state) == 2
    err = capsys.readouterr().err
    assert state.read_text() == "the user's notes\n"
    assert [l for l in err.splitlines() if l.startswith("error:")] == [
        f"error: state file {state}: exists and is not a vlmspec recipe state file: not "
        "overwritten (give another --state PATH); recipe stopped"]
    assert "step 2 (scribble) of 2" not in err


def test_step_paths_come_from_each_commands_click_params():
    """The paths of a step are read off its command's parameters (types and defaults), so
    a new command's file options count without a list; a file-like option of a type that
    is neither click.Path/File nor a string would go unseen, and fails here."""
    looks_like_a_file = re.compile(r"out|dir|trace|write|plot|file|chat|profile|^inputs$|"
                                   r"samples|prompts|^name$|heads|twigs")
    for name, command in cli.commands.items():
        seen = path_params(command)
        for p in command.params:
            if looks_like_a_file.search(p.name or "") and not getattr(p, "is_flag", False):
                assert p.name in seen, f"{name} {p.name}: not counted as a path"
    got = {(s.option, s.path, s.folder)
           for s in step_paths(cli.commands["generate-image"], ["a cat", "--prompts-file", "p.txt"])}
    assert {("PROMPT", "a cat", False), ("--prompts-file", "p.txt", False),
            ("--out-dir", "images", True)} <= got   # the default folder counts
    got = {(s.option, s.path) for s in step_paths(cli.commands["calibrate"],
                                                  ["imgs", "--write", "tuned", "-p", "x.yaml"])}
    assert {("SAMPLES", "imgs"), ("--write", "tuned"), ("--write", "profiles/tuned.yaml"),
            ("--profile", "x.yaml")} <= got
    got = {(s.option, s.path) for s in step_paths(
        cli.commands["caption"], ["--chat", "c.jsonl", "--trace", "t.jsonl", "--out", "-"])}
    assert {("--chat", "c.jsonl"), ("--trace", "t.jsonl")} <= got and ("--out", "-") not in got
    for executor, shards in (("local", set()), ("ray", {("--out", "c.jsonl.shards", True)})):
        got = {(s.option, s.path, s.folder) for s in step_paths(
            cli.commands["caption"], ["imgs", "--out", "c.jsonl", "--executor", executor])}
        assert got & {("--out", "c.jsonl.shards", True)} == shards   # ray: its shard folder


def test_shipped_recipe_runs_from_outside_the_repository(tmp_path, monkeypatch):
    """From a directory outside the repository (a subprocess, as a user runs it): the
    shipped recipes read their example folder next to themselves and write into the current
    directory; a --var folder that is not there stops the run before step 1."""
    images = ROOT / "examples" / "images"
    monkeypatch.chdir(tmp_path)
    res = run([str(ROOT / "recipes" / "calibrate-then-caption.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"vlmspec calibrate {images} " in res.stdout and f"vlmspec caption {images} " in res.stdout
    res = run([str(ROOT / "recipes" / "calibrate-then-caption.yaml"), "--var", "folder=shots/"])
    assert res.exit_code == 2 and "step 3 (caption): INPUTS shots/: no such file" in res.stderr
    assert os.listdir(tmp_path) == []                      # nothing ran, nothing written

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "run",
                           str(ROOT / "recipes" / "caption-folder.yaml"), "--var", "out=caps.jsonl"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = lines(tmp_path / "caps.jsonl")
    assert sorted(r["source"] for r in records) == sorted(str(p) for p in images.glob("*.png"))
    assert all(r["error"] is None and r["output"] for r in records)
    assert sorted(os.listdir(tmp_path)) == ["caps.jsonl", "caption-folder.state.json"]


@pytest.mark.quick
def test_a_shipped_recipe_runs_by_its_name_from_any_folder(tmp_path, monkeypatch):
    """`vlmspec run recipes/caption-folder.yaml` worked only inside the clone; the shipped
    recipes install with the package and run by name, as profiles do (the state file and
    the output in the current folder). A name that is neither a file nor a shipped recipe
    is a usage error naming the shipped ones."""
    from vlmspec_cli.cli.run import shipped_recipes

    assert set(shipped_recipes()) == {p.stem for p in (ROOT / "recipes").glob("*.yaml")}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shots").mkdir()
    shutil.copy(ROOT / "examples" / "images" / "scene1.png", tmp_path / "shots")
    for name in ("caption-folder", "caption-folder.yaml"):
        res = run([name, "--var", "folder=shots", "--dry-run"])
        assert res.exit_code == 0, res.output
        assert res.stdout.startswith("vlmspec caption shots --profile tinyworld-caption --out "
                                     "captions.jsonl"), res.stdout
    res = CliRunner().invoke(cli, ["run", "captions-folder"])
    assert res.exit_code == 2
    assert ("no file 'captions-folder', nor a shipped recipe of that name (shipped: "
            "calibrate-then-caption, caption-folder)") in res.stderr
    assert os.listdir(tmp_path) == ["shots"]
