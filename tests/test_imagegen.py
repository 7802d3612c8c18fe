"""generate-image on the tinyworld Janus generator: lossless tree/ADT drafting of image
tokens, pictures that show the prompt, relaxed acceptance marked lossy, and the CLI's
file handling (atomic PNGs, no overwrite without --force, resume, bad inputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from corpus import write_user_notes
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile
from vlmspec_cli.session import SessionError, build_session, validate_method
from vlmspec_cli.tasks.imagegen import ImageJob, image_request, render, write_new
from vlmspec_cli.zoo import imagegen as zoo_image

PROMPTS = ["a red circle on a blue background", "a small yellow square at the top left on a "
           "green background", "a white triangle on a black background"]
_SESSIONS: dict[tuple, object] = {}


def session_for(*overrides: str):
    key = tuple(overrides)
    if key not in _SESSIONS:
        _SESSIONS[key] = build_session(load_profile("tinyworld-image",
                                                    overrides=["target.device=cpu",
                                                               "draft.device=cpu", *overrides]))
    return _SESSIONS[key]


def generate(session, prompt: str, seed: int = 0):
    return session.engine.generate(image_request(session, ImageJob("t", prompt, 0, 0, seed)))


@pytest.fixture(scope="module")
def greedy_reference():
    """Target-only greedy image tokens per prompt (vlmspec's own decoding)."""
    base = session_for("method=none")
    return {p: generate(base, p).tokens for p in PROMPTS}


def test_target_only_equals_hf_janus_generate(greedy_reference):
    """The adapter's guided logits are Janus' own: HF generate in image mode, greedy, gives
    the same 64 codes."""
    lm = session_for("method=none").target
    ad = lm.adapter
    lm.model.generation_config.generation_kwargs = {"boi_token_id": ad._special(lm, "boi_token_id")}
    for prompt in PROMPTS[:2]:
        ids = ad.prompt_ids(lm, ad.prompt_text(lm, [_user(prompt)]))[:1]
        hf = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                               do_sample=False, guidance_scale=ad.guidance_scale(lm))
        assert hf[0].tolist() == greedy_reference[prompt]
        assert len(greedy_reference[prompt]) == ad.num_image_tokens(lm) == 64


def _user(text):
    from vlmspec_cli.runtime.request import Message

    return Message("user", text)


def test_greedy_images_show_the_prompt(greedy_reference):
    base = session_for("method=none")
    for prompt, colour, background in [(PROMPTS[0], "red", "blue"), (PROMPTS[1], "yellow", "green"),
                                       (PROMPTS[2], "white", "black")]:
        image = render(base, greedy_reference[prompt])
        assert image.size == (32, 32)
        assert zoo_image.image_matches(image, colour, background), prompt
    # and the check can fail: the red/blue picture is not a yellow-on-green one
    assert not zoo_image.image_matches(render(base, greedy_reference[PROMPTS[0]]), "yellow", "green")


TREE_CASES = [
    ("method=tree", "tree.depth=4", "tree.top_k=4", "tree.total_tokens=32"),
    ("method=tree", "tree.depth=2", "tree.top_k=2", "tree.total_tokens=6"),
    ("method=tree", "tree.depth=6", "tree.top_k=3", "tree.total_tokens=16"),
    ("method=tree", "tree.policy=static", "tree.depth=5", "tree.top_k=3"),
    ("method=adt", "adaptive_tree.init=horizontal"),
    ("method=adt", "adaptive_tree.init=vertical", "adaptive_tree.step_top_k=3"),
    ("method=adt", "adaptive_tree.init=random"),
]


@pytest.mark.parametrize("overrides", TREE_CASES, ids=lambda o: " ".join(o))
def test_tree_drafted_images_equal_target_greedy(greedy_reference, overrides):
    session = session_for(*overrides)
    assert session.lossless
    taus = []
    for prompt in PROMPTS:
        res = generate(session, prompt)
        assert res.tokens == greedy_reference[prompt], prompt
        st = res.state.stats
        assert st.new_tokens == 64 and st.num_accepted_tokens + st.num_drafts == 64
        trees = st.trees
        # one shape per round that drafted (the last round may have had no room for a tree)
        assert len(trees["accept_lengths"]) == 64
        assert st.num_drafts - 1 <= len(trees["depths"]) <= st.num_drafts
        taus.append(st.mean_accept_len)
        if "method=adt" in overrides:
            a = session.profile.adaptive_tree
            # (the last rounds may be cut shorter by the tokens left in the grid)
            assert all(d <= a.max_depth for d in trees["depths"])
            assert all(a.min_top_k <= k <= a.max_top_k for k in trees["top_ks"])
            assert len(set(zip(trees["depths"], trees["top_ks"]))) > 1   # it adapts
    # the draft is right often enough that the trees are really walked
    assert sum(taus) / len(taus) > 1.5


def test_relaxed_acceptance_is_opt_in_and_marked_lossy(greedy_reference):
    exact, relaxed = session_for("method=adt"), session_for("method=adt", "acceptance=relaxed",
                                                            "relaxed.delta=0.5")
    assert exact.lossless and not relaxed.lossless
    tau_exact = tau_relaxed = 0.0
    changed = []
    for prompt in PROMPTS:
        res_exact, res_relaxed = generate(exact, prompt), generate(relaxed, prompt)
        assert res_exact.tokens == greedy_reference[prompt], prompt
        tau_exact += res_exact.state.stats.mean_accept_len
        tau_relaxed += res_relaxed.state.stats.mean_accept_len
        changed.append(res_relaxed.tokens != greedy_reference[prompt])
    # Relaxation must really accept draft tokens that exact acceptance rejects: at T = 0
    # that is the only way its output can leave the target's greedy tokens (verify_tree
    # emits the target's own token after every rejection), and it accepts more per round.
    assert any(changed)
    assert tau_relaxed > tau_exact
    # the relaxed image still shows the prompt
    res = generate(relaxed, PROMPTS[0])
    assert zoo_image.image_matches(render(relaxed, res.tokens), "red", "blue")


@pytest.mark.parametrize("overrides,message", [
    (["task=caption", "method=adt"], "generate-image"),
    (["method=chain"], "tree.top_k: 1"),
    (["method=none", "acceptance=relaxed"], "relaxed"),
    (["adaptive_tree.min_depth=5", "adaptive_tree.max_depth=2"], "min_depth"),
])
def test_method_checks_before_loading(overrides, message):
    with pytest.raises(SessionError, match=message):
        validate_method(load_profile("tinyworld-image", overrides=overrides))


# ----------------------------------------------------------------------------- CLI

FAST = ["-q", "--device", "cpu"]


def run(args, **kw):
    return CliRunner().invoke(cli, args, catch_exceptions=False, **kw)


def _records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_cli_writes_pngs_heatmaps_and_records(tmp_path):
    out = tmp_path / "imgs"
    res = run(["generate-image", PROMPTS[0], "a green square on a white background", "--json",
               "--heatmap", "-o", str(out), *FAST])
    assert res.exit_code == 0, res.output
    recs = _records(res.stdout)
    assert [r["prompt"] for r in recs] == [PROMPTS[0], "a green square on a white background"]
    for r in recs:
        assert r["error"] is None and r["lossless"] is True and r["method"] == "adt"
        assert r["seed"] == 0 and len(r["tokens"]) == 64
        assert Image.open(r["file"]).size == (32, 32)
        assert Image.open(r["heatmap"]).size[0] >= 256
        assert r["stats"]["trees"]["policy"] == "adt" and r["stats"]["trees"]["mean_depth"] > 0
    assert sorted(p.name for p in out.iterdir()) == [
        "000-a-red-circle-on-a-blue-background-0.heatmap.png",
        "000-a-red-circle-on-a-blue-background-0.png",
        "001-a-green-square-on-a-white-background-0.heatmap.png",
        "001-a-green-square-on-a-white-background-0.png"]


def test_cli_existing_files_force_and_resume(tmp_path):
    out = tmp_path / "imgs"
    first = run(["generate-image", PROMPTS[0], "-n", "2", "-t", "1", "-o", str(out), *FAST])
    assert first.exit_code == 0, first.output
    files = sorted(out.glob("*.png"))
    assert len(files) == 2 and files[0].read_bytes() != files[1].read_bytes()  # seeds 0 and 1
    before = {f: f.read_bytes() for f in files}
    # rerun without --force: one error line per file, nothing touched, exit 1
    again = run(["generate-image", PROMPTS[0], "-n", "2", "-t", "1", "-o", str(out), *FAST])
    assert again.exit_code == 1
    assert again.stderr.count("exists") == 2 and str(files[0]) in again.stderr
    assert {f: f.read_bytes() for f in files} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]   # no temp files left
    # --skip-existing: resume, nothing to do
    skip = run(["generate-image", PROMPTS[0], "-n", "3", "-t", "1", "-o", str(out), "--json",
                "--skip-existing", *FAST])
    assert skip.exit_code == 0 and len(_records(skip.stdout)) == 1       # only image 2 is new
    assert {f: f.read_bytes() for f in files} == before
    # --force overwrites (greedy now, so both images become the greedy one)
    forced = run(["generate-image", PROMPTS[0], "-n", "2", "-o", str(out), "--force", *FAST])
    assert forced.exit_code == 0
    assert files[0].read_bytes() == files[1].read_bytes() != before[files[0]]


HEATMAP_ARGS = [PROMPTS[0], "--heatmap", "--json", *FAST]


def test_cli_existing_heatmap_refused_before_decoding(tmp_path):
    """NAME.heatmap.png follows the PNG's rules: refused without --force (the image is not
    even decoded), kept by --skip-existing, replaced by --force only if vlmspec wrote it
    (a person's PNG there is refused either way)."""
    out = tmp_path / "imgs"
    png = out / "000-a-red-circle-on-a-blue-background-0.png"
    hmap = out / "000-a-red-circle-on-a-blue-background-0.heatmap.png"
    assert run(["generate-image", *HEATMAP_ARGS, "-o", str(out)]).exit_code == 0
    png.unlink()
    before = hmap.read_bytes()
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), "--dry-run"])   # --json: one object
    assert res.exit_code == 0 and json.loads(res.stdout)["items"] == [
        {"file": str(png), "prompt": PROMPTS[0], "seed": 0, "error": None, "heatmap": str(hmap)}]
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out)])
    assert res.exit_code == 1 and f"heatmap {hmap} exists" in res.stderr
    (rec,) = _records(res.stdout)
    assert rec["error"] and "stats" not in rec and rec["file"] is None   # nothing decoded
    assert not png.exists() and hmap.read_bytes() == before
    # --skip-existing: the heatmap is kept, the missing PNG written
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), "--skip-existing"])
    assert res.exit_code == 0 and png.is_file() and hmap.read_bytes() == before
    (rec,) = _records(res.stdout)
    assert rec["heatmap"] == str(hmap)
    # both there: skipped without decoding
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), "--skip-existing"])
    assert res.exit_code == 0 and _records(res.stdout) == []
    # --force replaces a heatmap vlmspec wrote, atomically (a new file, no temp file left),
    # and says so
    inode = hmap.stat().st_ino
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), "--force"])
    assert res.exit_code == 0 and hmap.stat().st_ino != inode
    assert Image.open(hmap).size[0] >= 256
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    # a person's PNG at the heatmap's name: refused with or without --force, kept
    Image.new("RGB", (4, 4), "white").save(hmap)
    photo = hmap.read_bytes()
    png.unlink()
    for extra in ([], ["--force"], ["--skip-existing"]):
        res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), *extra])
        assert res.exit_code == 1 and "is not a PNG image vlmspec wrote" in res.stderr, res.stderr
        assert "even with --force" in res.stderr and hmap.read_bytes() == photo
        assert not png.exists()   # decided before decoding: nothing written


def test_two_runs_never_write_one_folder_at_once(tmp_path):
    """A run holds its --out-dir (flock on the folder): a second one into it is refused at
    once (exit 2), where both used to decode every image and fail each other's files."""
    import fcntl

    out = tmp_path / "imgs"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)   # as a run under way holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = run(["generate-image", PROMPTS[0], "-o", str(out), *FAST])
        assert res.exit_code == 2 and "another vlmspec generate-image is writing into it" in res.stderr
        assert list(out.iterdir()) == []
    finally:
        os.close(fd)
    assert run(["generate-image", PROMPTS[0], "-o", str(out), *FAST]).exit_code == 0


def test_what_a_run_cannot_do_is_said_not_silent(tmp_path):
    """An empty --prompts-file is named (it said "no PROMPT given"); --heatmap with a
    method that drafts no trees warns (no heatmap was written, without a word); a folder a
    run made and left empty, its models failing to load, is not left behind."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("# nothing yet\n\n")
    res = run(["generate-image", "--prompts-file", str(prompts)])
    assert res.exit_code == 2 and "holds no prompts" in res.stderr
    res = run(["generate-image", "a red circle", "-m", "none", "--heatmap", "--dry-run"])
    assert res.exit_code == 0 and "warning: --heatmap: method 'none' drafts no trees" in res.stderr
    out = tmp_path / "never"
    res = CliRunner(env={"HF_HUB_OFFLINE": "1"}).invoke(
        cli, ["generate-image", "a red circle", "-p", "emu3-gen", "-o", str(out), "-q"])
    assert res.exit_code == 2 and "unreachable" in res.stderr and not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()   # a folder that was there stays, empty or not
    res = CliRunner(env={"HF_HUB_OFFLINE": "1"}).invoke(
        cli, ["generate-image", "a red circle", "-p", "emu3-gen", "-o", str(kept), "-q"])
    assert res.exit_code == 2 and kept.is_dir()


def test_cli_force_never_overwrites_what_is_not_a_png(tmp_path):
    out = tmp_path / "imgs"
    out.mkdir()
    hmap = out / "000-a-red-circle-on-a-blue-background-0.heatmap.png"
    notes = write_user_notes(hmap)
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), "--force"])
    assert res.exit_code == 1 and "is not a PNG image" in res.stderr and str(hmap) in res.stderr
    assert hmap.read_bytes() == notes
    assert not (out / "000-a-red-circle-on-a-blue-background-0.png").exists()
    png = out / "000-a-red-circle-on-a-blue-background-0.png"
    hmap.unlink()
    notes = write_user_notes(png)
    res = run(["generate-image", *HEATMAP_ARGS, "-o", str(out), "--force"])
    assert res.exit_code == 1 and "is not a PNG image" in res.stderr
    assert png.read_bytes() == notes and not hmap.exists()


def test_subprocess_heatmap_not_overwritten(tmp_path):
    hmap = tmp_path / "000-a-red-circle-on-a-blue-background-0.heatmap.png"
    Image.new("RGB", (4, 4), "white").save(hmap)
    before = hmap.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "generate-image", PROMPTS[0],
                           "--heatmap", "-o", str(tmp_path), "--device", "cpu", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "heatmap" in proc.stderr and "exists" in proc.stderr
    assert hmap.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_write_new_never_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a.png"
    target.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        write_new(target, b"new", force=False)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.png"]
    write_new(target, b"new", force=True)
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["a.png"]


def test_write_new_with_force_keeps_the_mode_and_follows_a_link(tmp_path):
    """--force replaced a 0640 file with a 0644 one, and a link with a file (its target
    left stale)."""
    real = tmp_path / "real" / "hw.yaml"
    real.parent.mkdir()
    real.write_bytes(b"old")
    real.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    write_new(link, b"new", force=True)
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert real.stat().st_mode & 0o777 == 0o640
    assert os.listdir(real.parent) == ["hw.yaml"] and sorted(os.listdir(tmp_path)) == [
        "link.yaml", "real"]
    with pytest.raises(FileExistsError):      # without force a link is an existing name
        write_new(link, b"newer", force=False)
    assert real.read_bytes() == b"new"


def test_cli_bad_inputs(tmp_path):
    out = tmp_path / "imgs"
    # an empty prompt fails alone; the other image is written
    res = run(["generate-image", PROMPTS[0], "  ", "-o", str(out), *FAST])
    assert res.exit_code == 1 and "prompt 2: empty prompt" in res.stderr
    assert len(list(out.glob("*.png"))) == 1
    # an --out-dir that cannot be a folder: exit 2 before any model loads, nothing written
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    res = run(["generate-image", PROMPTS[0], "-o", str(blocker / "sub"), *FAST])
    assert res.exit_code == 2 and str(blocker) in res.stderr
    res = run(["generate-image", PROMPTS[0], "-o", str(blocker), *FAST])
    assert res.exit_code == 2 and "is a file" in res.stderr
    assert blocker.read_text() == "x"
    # usage and profile errors name the problem
    assert run(["generate-image", "-o", str(out)]).exit_code == 2
    res = run(["generate-image", "x", "-m", "tabed", "-o", str(out)])
    assert res.exit_code == 2 and "generate-image supports methods" in res.stderr
    res = run(["generate-image", "x", "--set", "adaptive_tree.betta=2", "-o", str(out)])
    assert res.exit_code == 2 and "adaptive_tree.beta" in res.stderr
    res = run(["generate-image", "x", "-p", "tinyworld-caption", "-o", str(out)])
    assert res.exit_code == 2 and "needs task 'image'" in res.stderr
    res = run(["generate-image", "x", "--force", "--skip-existing", "-o", str(out)])
    assert res.exit_code == 2


def test_cli_any_failure_of_one_image_is_its_error_record(tmp_path, monkeypatch):
    """As for captions (tasks/jobs.py): whatever one job raises becomes its error record
    and the batch goes on (exit 1); the other image is written."""
    from vlmspec_cli.tasks import imagegen

    real, calls = imagegen.render, []

    def render(session, tokens):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("boom")
        return real(session, tokens)

    monkeypatch.setattr(imagegen, "render", render)
    out = tmp_path / "imgs"
    res = run(["generate-image", PROMPTS[0], PROMPTS[1], "-m", "none", "--json", "-o", str(out),
               *FAST])
    assert res.exit_code == 1
    first, second = _records(res.stdout)
    assert first["error"] == "failed: KeyError: 'boom'" and first["file"] is None
    assert second["error"] is None and Path(second["file"]).is_file()
    assert len(list(out.glob("*.png"))) == 1


def test_cli_prompts_file_stdin_dry_run(tmp_path):
    out = tmp_path / "imgs"
    res = run(["generate-image", "--prompts-file", "-", "-n", "2", "-o", str(out), "--dry-run"],
              input="# a comment\na red circle\n\na blue square\n")
    assert res.exit_code == 0
    planned = [line for line in res.stdout.splitlines() if line.startswith("# ") and ".png" in line]
    assert len(planned) == 4 and "001-a-blue-square-1.png  seed=1" in planned[-1]
    assert not out.exists()   # a dry run writes nothing
    # the last seed --seed takes: image 1's wraps to the first, which --seed takes back
    top, bottom = str(2 ** 63 - 1), str(-(2 ** 63))
    res = run(["generate-image", "a red circle", "-n", "2", "--seed", top, "-o", str(out), "--dry-run"])
    assert res.exit_code == 0 and f"seed={top}" in res.stdout and f"seed={bottom}" in res.stdout
    res = run(["generate-image", "a red circle", "--seed", bottom, "-o", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output


@pytest.mark.quick
def test_cli_relaxed_records_say_lossy(tmp_path):
    res = run(["generate-image", PROMPTS[0], "--set", "acceptance=relaxed", "--json",
               "-o", str(tmp_path), *FAST])
    assert res.exit_code == 0, res.output
    rec = _records(res.stdout)[0]
    assert rec["lossless"] is False and rec["acceptance"] == "relaxed"
    assert rec["relaxed"] == {"neighbours": 8, "delta": 0.3}


def test_subprocess_generate_image(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "generate-image", PROMPTS[0],
                           "-o", str(tmp_path), "--compare", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.split("\t")[0])
    assert path.is_file() and "speedup vs target-only" in proc.stderr


@pytest.mark.parametrize("costs", ["measured", "off-on"])
def test_adt_auto_depth_equals_target_greedy(greedy_reference, costs):
    """ADT-Tree with drafting.length auto: each round's k caps the depth its own policy
    picks (0: a plain target step), and every image is the target's greedy one; with the
    costs this process measures, and with drafting as dear as a target step (drafting off,
    probes of one level: trees of depth 1 where the policy would go deeper)."""
    from test_draft_length import Costs, use_auto

    from vlmspec_cli.runtime.length.draft_length import AutoGamma

    session = session_for("method=adt", "drafting.length=auto")
    engine = session.engine
    ceiling = session.profile.adaptive_tree.max_depth
    assert engine.policy.auto.ceiling == ceiling and engine.policy.auto.feed_size == engine.drafter.feed_size
    kw = dict(costs=Costs(1.0), probe_after=1, max_backoff=2) if costs == "off-on" else {}
    policy = use_auto(engine, AutoGamma(ceiling, feed_size=engine.drafter.feed_size, **kw))
    ks: list[int] = []
    choose = policy.choose
    policy.choose = lambda state, budget: ks.append(choose(state, budget)) or ks[-1]
    for prompt in PROMPTS:
        ks.clear()
        res = generate(session, prompt)
        assert res.tokens == greedy_reference[prompt], prompt
        st = res.state.stats
        assert st.new_tokens == 64 and st.draft_length["rounds_drafted"] == sum(k > 0 for k in ks)
        depths = st.trees["depths"] if st.trees else []
        assert len(depths) == sum(k > 0 for k in ks)
        assert all(d <= k for d, k in zip(depths, [k for k in ks if k > 0]))   # capped
        if costs == "off-on":
            assert set(ks) == {0, 1} and ks.count(0) > ks.count(1)


def test_an_out_dir_that_cannot_be_a_folder_is_said_as_it_is(tmp_path):
    """A link loop or a broken link as --out-dir said "cannot create ...: File exists"."""
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    os.symlink(tmp_path / "gone", tmp_path / "broken")
    for name, reason in (("a", "too many levels of symbolic links"), ("broken", "a broken symbolic link")):
        res = run(["generate-image", "a red circle", "-o", str(tmp_path / name), *FAST])
        assert res.exit_code == 2 and f"--out-dir {tmp_path / name}: {reason}" in res.stderr, res.stderr


@pytest.mark.parametrize("method", ["tree", "adt", "none"])
def test_a_batch_size_is_refused_in_one_line_before_anything_loads(method, tmp_path):
    """generate-image decodes one image at a time: generation.batch_size > 1 is refused, not
    silently decoded one by one (tree batches captions, so the method check alone let
    ``-m tree --set generation.batch_size=2`` through)."""
    res = run(["generate-image", "a red circle", "-m", method, "--set",
               "generation.batch_size=2", "-o", str(tmp_path / "x"), "--dry-run"])
    assert res.exit_code != 0
    assert "generate-image decodes one image at a time" in " ".join(res.output.split())
    assert not (tmp_path / "x").exists()
