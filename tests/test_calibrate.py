"""`vlmspec calibrate`: ranks drafting variants x γ on tinyworld samples, picks one at least as
good as the default profile (by the model: acceptance x latency cost), deterministically
when the latency model comes from a hardware profile, and writes it as a profile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from corpus import make_broken_model_dir, write_foreign_yaml, write_user_notes
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile
from vlmspec_cli.session import build_session
from vlmspec_cli.tasks.calibrate import TREE_SHAPES, LatencyModel, sample_requests, tau_for_gamma
from vlmspec_cli.tasks.inputs import expand_inputs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cal")
    samples = root / "samples"
    samples.mkdir()
    for i, (_, im) in enumerate(fresh_scenes(3, seed=4711)):
        im.save(samples / f"s{i}.png")
    hw = root / "hw.yaml"
    res = CliRunner().invoke(cli, ["profile", "--repeats", "3", "--warmup", "1", "--contexts", "64",
                                   "--write", str(hw), "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    base = root / "base.yaml"
    base.write_text("include: [tinyworld-caption, hw.yaml]\nname: base\n")
    return root, samples, base


def _calibrate(root, samples, base, write=None, force=False):
    args = ["calibrate", str(samples), "--profile", str(base), "--gammas", "2,4", "--top", "2",
            "--max-new-tokens", "16", "--margin", "100", "--json", "-q"] + (["--write", write] if write else [])
    args += ["--force"] if force else []
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_calibrate_measures_the_default_and_is_deterministic(setup):
    """Whether the choice is *right* is tested against known answers below; here: the
    profile's own configuration is always decoded for real, and the choice repeats."""
    root, samples, base = setup
    first = _calibrate(root, samples, base, write=str(root / "tuned.yaml"))
    cands = {c["label"]: c for c in first["candidates"]}
    winner, default = cands[first["winner"]], cands["chain M γ=5"]   # the profile's own config
    assert default["speedup"] is not None and default["mismatches"] == 0
    assert winner["mismatches"] == 0 and winner["tau"] > 1.5
    tuned_text = (root / "tuned.yaml").read_text()
    again = CliRunner().invoke(cli, ["calibrate", str(samples), "--profile", str(base), "-q",
                                     "--write", str(root / "tuned.yaml")], catch_exceptions=False)
    assert again.exit_code == 2 and "exists (use --force" in again.stderr   # no silent overwrite
    assert (root / "tuned.yaml").read_text() == tuned_text
    second = _calibrate(root, samples, base, write=str(root / "tuned.yaml"), force=True)
    # deterministic: τ at T=0 and the latency model from the included hardware profile
    assert second["winner"] == first["winner"]
    assert [c["label"] for c in second["candidates"]] == [c["label"] for c in first["candidates"]]
    tuned = load_profile(str(root / "tuned.yaml"))
    _is_written_winner(tuned, winner)
    assert tuned.drafting.inputs == winner["inputs"] and tuned.hardware.latency_ratio  # included base


def _is_written_winner(profile, winner: dict) -> None:
    assert profile.method == winner["method"]
    if winner["tree"]:
        t = profile.tree
        assert [t.depth, t.top_k, t.total_tokens] == list(winner["tree"])
    else:
        assert profile.drafting.gamma == winner["gamma"]


@pytest.mark.parametrize("draft_ms", [0.0, 1000.0])
def test_calibrate_finds_the_known_answer_of_a_hardware_profile(setup, tmp_path, draft_ms):
    """Two made-up machines whose best choice is known without measuring anything: with
    free draft steps and a flat verification cost the modelled speedup is τ itself, so the
    best-accepted candidate wins (a deep tree, on these models); with draft steps of 100
    target steps, τ(γ) ≤ 1 + γ·P(k ≥ 1) makes γ = 1 of a one-row chain win (an ensemble's
    rows and a tree's levels cost more). A sort in the wrong direction, or γ or a tree's
    depth wrong in the model, picks otherwise. Every method calibrate claims is probed,
    and the written winner loads and decodes exactly target-only's tokens."""
    root, samples, _ = setup
    one = tmp_path / "one"
    one.mkdir()
    (one / "s0.png").write_bytes((samples / "s0.png").read_bytes())
    hw = tmp_path / "known.yaml"
    hw.write_text("include: tinyworld-caption\nname: known\nhardware:\n  measurements:\n"
                  "    target_verify_ms: {64: {1: 10.0, 2: 10.0, 5: 10.0, 64: 10.0}}\n"
                  f"    draft_step_ms: {{1: {{64: {draft_ms}}}, 2: {{64: {2 * draft_ms}}}}}\n")
    tuned = tmp_path / "tuned.yaml"
    res = CliRunner().invoke(cli, ["calibrate", str(one), "--profile", str(hw), "--gammas", "1,4",
                                   "--top", "1", "--max-new-tokens", "16", "--margin", "100",
                                   "--write", str(tuned), "--json", "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    cands = {c["label"]: c for c in out["candidates"]}
    winner = cands[out["winner"]]
    assert winner["mismatches"] == 0
    # chains and ensembles at γ ∈ {1, 4} and the profile's own 5, and every tree shape
    assert {c["gamma"] for c in cands.values() if c["tree"] is None} == {1, 4, 5}
    assert {tuple(c["tree"]) for c in cands.values() if c["tree"]} == set(TREE_SHAPES)
    assert {c["method"] for c in cands.values()} == {"chain", "tabed", "tree"}
    if draft_ms == 0.0:
        assert winner["tau_model"] == max(c["tau_model"] for c in cands.values())
        assert winner["predicted"] == pytest.approx(winner["tau_model"], abs=1e-3)
    else:
        assert winner["method"] == "chain" and winner["gamma"] == 1
    # the written profile is the winner, and decodes what the target alone decodes
    profile = load_profile(str(tuned))
    _is_written_winner(profile, winner)
    session = build_session(profile)
    request = sample_requests(profile, expand_inputs([str(one / "s0.png")]))[0][0]
    assert session.engine.generate(request).tokens == session.baseline_engine().generate(request).tokens


def test_tau_model_and_latency_model():
    hist = [2, 1, 0, 3]       # rounds accepting 0, 1, 2, 3 proposals (probed at γ=3)
    assert tau_for_gamma(hist, 3) == 1 + (1 + 9) / 6
    assert tau_for_gamma(hist, 1) == 1 + (1 + 3) / 6
    model = LatencyModel({1: 2.0, 3: 2.2, 5: 2.6}, {1: 0.5, 2: 0.6})
    assert model._at(model.verify_ms, 4) == pytest.approx(2.4)
    assert model.predicted_speedup(3.0, 2, 1) == pytest.approx(3.0 * 2.0 / (2 * 0.5 + 2.2))


def test_calibrate_needs_samples_and_names_bad_ones(tmp_path):
    res = CliRunner().invoke(cli, ["calibrate"])
    assert res.exit_code == 2 and "no SAMPLES" in res.output
    res = CliRunner().invoke(cli, ["calibrate", str(tmp_path / "gone.png"), "-q"])
    assert res.exit_code == 2 and "gone.png" in res.output


# ------------------------------------------------- --write never destroys (checked before work)
def _refused(args, cwd=None):
    """Run calibrate with a broken target model: a refusal must come before any model loads
    (loading would fail with another message)."""
    res = CliRunner().invoke(cli, ["calibrate", *args, "-q"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-model-type" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture()
def quick(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sample = tmp_path / "s0.png"
    fresh_scenes(1, seed=4712)[0][1].save(sample)
    broken = make_broken_model_dir(tmp_path / "broken")
    return tmp_path, sample, ["--set", f"target.model={broken}", "--gammas", "2"]


def test_write_refuses_existing_and_foreign_files(quick):
    root, sample, fast = quick
    for make in (write_user_notes, write_foreign_yaml):
        target = root / "mine.yaml"
        before = make(target)
        line = _refused([str(sample), "--write", str(target), *fast])
        assert str(target) in line and "exists (use --force" in line
        line = _refused([str(sample), "--write", str(target), "--force", *fast])
        assert "is not a vlmspec profile" in line and "even with --force" in line
        assert target.read_bytes() == before
    line = _refused([str(sample), "--write", str(root / "mine.yaml" / "x.yaml"), *fast])
    assert "is not a folder" in line     # found before the work, not after it


def test_write_never_shadows_or_overwrites_what_it_includes(quick):
    root, sample, fast = quick
    for force in ([], ["--force"]):
        # the reported bug: profiles/tinyworld-caption.yaml including tinyworld-caption
        line = _refused([str(sample), "--write", "tinyworld-caption", *force, *fast])
        assert "would shadow profile 'tinyworld-caption'" in line
        line = _refused([str(sample), "-p", "tinyworld-tabed", "--write", "tinyworld-caption",
                         *force, *fast])
        assert "would shadow profile 'tinyworld-caption'" in line     # included by the base
        assert not (root / "profiles").exists()
    base = root / "base.yaml"
    base.write_text("include: tinyworld-caption\nname: base\n")
    before = base.read_bytes()
    line = _refused([str(sample), "-p", str(base), "--write", str(base), "--force", *fast])
    assert "is the base profile" in line and base.read_bytes() == before
    # a sample is an input, whatever its name
    line = _refused([str(sample), "--write", str(sample), "--force", *fast])
    assert "is an input" in line and sample.read_bytes()[:4] == b"\x89PNG"
    assert CliRunner().invoke(cli, ["profiles"]).exit_code == 0   # the folder still works


def test_subprocess_write_tinyworld_caption_refused(quick):
    root, sample, fast = quick
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "calibrate", str(sample),
                           "--write", "tinyworld-caption", *fast], capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "would shadow profile 'tinyworld-caption'" in proc.stderr
    assert not (root / "profiles").exists()
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(sample), "--dry-run"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr
