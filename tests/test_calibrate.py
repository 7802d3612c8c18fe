"""`vlmspec calibrate`: searches every method the profile's task allows (chains × inputs × γ,
ensembles, draft trees dynamic and static, hidden-state heads, twigs × θ; ADT-Tree and
trees for images; chains and heads for videos), picks the choice a known machine dictates,
deterministically when the latency model comes from a hardware profile, and writes a
profile that decodes exactly what the target alone decodes."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from corpus import make_broken_model_dir, write_foreign_yaml, write_user_notes
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile, profile_to_dict, with_settings
from vlmspec_cli.session import build_session
from vlmspec_cli.tasks.calibrate import Candidate, _batch_candidates
from vlmspec_cli.tasks.calibrate_model import LatencyModel, tau_for_gamma
from vlmspec_cli.tasks.calibrate_io import sample_requests
from vlmspec_cli.tasks.calibrate_space import (ADT_BETAS, IMAGE_TREE_SHAPES, TREE_SHAPES,
                                               TWIG_THRESHOLDS)
from vlmspec_cli.tasks.inputs import expand_inputs

# `vlmspec profile` timed briefly on one thread (the thread search has its own test)
QUICK = ("--repeats", "3", "--threads", "1")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cal")
    samples = root / "samples"
    samples.mkdir()
    for i, (_, im) in enumerate(fresh_scenes(3, seed=4711)):
        im.save(samples / f"s{i}.png")
    hw = root / "hw.yaml"
    res = CliRunner().invoke(cli, ["profile", *QUICK, "--warmup", "1", "--contexts", "64",
                                   "--write", str(hw), "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    base = root / "base.yaml"
    # the hardware profile times the draft model; the head's and the twig's per-level costs
    # are given too (as a user would add them), so no candidate's cost is timed per run
    base.write_text("include: [tinyworld-caption, hw.yaml]\nname: base\nhardware:\n  measurements:\n"
                    "    draft_level_ms: {hidden: 0.6, twig: 1.2}\n")
    return root, samples, base


def _calibrate(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, ["calibrate", *args, "--top", "1", "--margin", "100", "--json", "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _written_is_winner(path, base_source: str, winner: dict, pinned: dict | None = None) -> None:
    """The written profile is the base plus what --set pinned and the winner's settings,
    nothing else."""
    tuned = load_profile(str(path))
    expected = with_settings(load_profile(base_source), {**(pinned or {}), **winner["settings"]})
    strip = lambda p: {k: v for k, v in profile_to_dict(p).items() if k not in ("name", "description")}  # noqa: E731
    assert strip(tuned) == strip(expected)


def test_calibrate_measures_the_default_and_is_deterministic(setup):
    """Whether the choice is *right* is tested against known answers below; here: the
    profile's own configuration is always decoded for real, every candidate decoded so far
    equals target-only, the choice repeats, and --write never overwrites silently."""
    root, samples, base = setup
    args = [str(samples), "--profile", str(base), "--gammas", "2,4", "--max-new-tokens", "16"]
    first = _calibrate(args + ["--write", str(root / "tuned.yaml")])
    cands = {c["label"]: c for c in first["candidates"]}
    own = [c for c in first["candidates"] if with_settings(load_profile(str(base)), c["settings"])
           == load_profile(str(base))]
    gamma = load_profile(str(base)).drafting.gamma
    # the shipped default chooses γ per round (drafting.length auto), up to its γ
    assert len(own) == 1 and own[0]["label"].endswith(f"chain γ auto ≤ {gamma}")
    assert own[0]["speedup"] is not None
    assert all(c["mismatches"] == 0 for c in cands.values())
    winner = cands[first["winner"]]
    assert winner["tau_model"] > 1.5 and first["latency"] == "hardware profile"
    tuned_text = (root / "tuned.yaml").read_text()
    again = CliRunner().invoke(cli, ["calibrate", *args, "-q", "--write", str(root / "tuned.yaml")],
                               catch_exceptions=False)
    assert again.exit_code == 2 and "exists (use --force" in again.stderr   # no silent overwrite
    assert (root / "tuned.yaml").read_text() == tuned_text
    second = _calibrate(args + ["--write", str(root / "tuned.yaml"), "--force"])
    # deterministic: τ at T=0 and every cost from the included hardware profile
    assert all(c["cost"] == "table" for c in first["candidates"])
    assert second["winner"] == first["winner"]
    assert [c["label"] for c in second["candidates"]] == [c["label"] for c in first["candidates"]]
    assert [c["predicted"] for c in second["candidates"]] == [c["predicted"] for c in first["candidates"]]
    _written_is_winner(root / "tuned.yaml", str(base), winner)
    assert load_profile(str(root / "tuned.yaml")).hardware.latency_ratio   # the base included


def test_pinned_settings_are_typed_and_local_paths_absolute(tmp_path, monkeypatch):
    """What --write adds for each --set: the loaded value (typed), a folder that exists
    here written absolute (a relative one would resolve against the written profile's
    folder), a name that is no path kept as given."""
    from vlmspec_cli.tasks.calibrate_io import pinned_settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydraft").mkdir()
    sets = ["draft.model=mydraft", "drafting.gamma=3", "drafting.inputs=[text]",
            "captioner.model=zoo:tinyworld/captioner"]
    pinned = pinned_settings(load_profile("tinyworld-caption", sets), sets)
    assert pinned == {"draft.model": str(tmp_path / "mydraft"), "drafting.gamma": 3,
                      "drafting.inputs": ["text"], "captioner.model": "zoo:tinyworld/captioner"}


def _known_machine(tmp_path, draft_ms: float) -> str:
    """A made-up hardware profile: flat verification (10 ms for any k), a draft-model step
    of ``draft_ms`` per row, a hidden-head or twig level of 4 x ``draft_ms``."""
    hw = tmp_path / "known.yaml"
    hw.write_text("include: tinyworld-caption\nname: known\nhardware:\n  measurements:\n"
                  "    target_verify_ms: {64: {1: 10.0, 2: 10.0, 5: 10.0, 64: 10.0}}\n"
                  f"    draft_step_ms: {{1: {{64: {draft_ms}}}, 2: {{64: {2 * draft_ms}}}}}\n"
                  f"    draft_level_ms: {{hidden: {4 * draft_ms}, twig: {4 * draft_ms}}}\n")
    return str(hw)


@pytest.mark.parametrize("draft_ms", [0.0, 1000.0])
def test_calibrate_finds_the_known_answer_of_a_hardware_profile(setup, tmp_path, draft_ms):
    """Two made-up machines whose best choice is known without measuring anything: with
    free drafting and a flat verification cost the modelled speedup is τ itself, so the
    best-accepted candidate wins; with draft steps of 100 target steps, τ(γ) ≤ 1 + γ·P(k ≥ 1)
    makes γ = 1 of the best one-row chain the best drafting candidate (an ensemble's rows,
    a tree's levels and a head's or twig's dearer levels cost more), and no drafting pays
    there: target-only decoding (method none) wins. A sort in the wrong direction, or γ or
    a tree's depth wrong in the model, picks otherwise. Every method calibrate claims is
    probed, and the written winner loads and decodes exactly target-only's tokens."""
    root, samples, _ = setup
    one = tmp_path / "one"
    one.mkdir()
    (one / "s0.png").write_bytes((samples / "s0.png").read_bytes())
    hw, tuned = _known_machine(tmp_path, draft_ms), tmp_path / "tuned.yaml"
    out = _calibrate([str(one), "--profile", hw, "--gammas", "1,4", "--max-new-tokens", "16",
                      "--set", "sampling.seed=99", "--write", str(tuned)])
    cands = out["candidates"]
    winner = next(c for c in cands if c["label"] == out["winner"])
    assert winner["mismatches"] == 0 and not out["skipped"]
    # every method, γ ∈ {1, 4} and the profile's own, every tree shape dynamic and static,
    # the hidden head as chains and trees, the twig at every θ
    # (and target-only, measured: the answer when nothing is faster)
    assert {c["method"] for c in cands} == {"chain", "tabed", "tree", "hidden", "twig", "none"}
    own = load_profile(hw).drafting.gamma
    drafting = [c for c in cands if c["method"] != "none"]
    assert own not in (1, 4) and {c["gamma"] for c in drafting if c["tree"] is None} == {1, 4, own}
    trees = {(tuple(c["tree"]), c["settings"]["tree.policy"]) for c in cands if c["method"] == "tree"}
    assert trees == {(s, p) for s in TREE_SHAPES for p in ("dynamic", "static")}
    assert any(c["method"] == "hidden" and c["tree"] for c in cands)
    assert {c["settings"]["twig.threshold"] for c in cands if c["method"] == "twig"} == set(TWIG_THRESHOLDS)
    assert all(c["cost"] == "table" for c in cands)          # nothing timed: deterministic
    if draft_ms == 0.0:
        assert winner["tau_model"] == max(c["tau_model"] for c in drafting)
        assert winner["predicted"] == pytest.approx(winner["tau_model"], abs=1e-3)
    else:
        best_one = max(c["tau_model"] for c in cands if c["method"] == "chain" and c["gamma"] == 1)
        top = max(drafting, key=lambda c: c["predicted"])
        assert (top["method"], top["gamma"], top["tau_model"]) == ("chain", 1, best_one)
        assert top["predicted"] < 0.1 and winner["method"] == "none"
        # (a candidate measured faster than target-only, by less than --margin 100: the note
        # names it; none measured faster: it says so)
        assert out["note"].startswith("target-only decoding was modelled fastest")
    _written_is_winner(tuned, hw, winner, {"sampling.seed": 99})
    profile = load_profile(str(tuned))
    session = build_session(profile)
    request = sample_requests(profile, expand_inputs([str(one / "s0.png")]))[0][0]
    assert session.engine.generate(request).tokens == session.baseline_engine().generate(request).tokens


def test_calibrate_image_searches_adt_and_trees(tmp_path):
    """generate-image profiles: SAMPLES are prompts; ADT-Tree bounds × β and fixed trees
    are probed; the written winner generates the target-only image."""
    tuned = tmp_path / "img.yaml"
    out = _calibrate(["-p", "tinyworld-image", "a red circle", "--write", str(tuned)])
    cands = out["candidates"]
    assert {c["method"] for c in cands} == {"adt", "tree", "none"}
    assert {c["settings"].get("adaptive_tree.beta") for c in cands if c["method"] == "adt"} >= set(ADT_BETAS)
    assert {tuple(c["tree"]) for c in cands if c["method"] == "tree"} == set(IMAGE_TREE_SHAPES)
    assert all(c["mismatches"] == 0 for c in cands)
    profile = load_profile(str(tuned))
    session = build_session(profile)
    request = sample_requests(profile, ["a red circle"], session.target)[0][0]
    assert session.engine.generate(request).tokens == session.baseline_engine().generate(request).tokens


def test_calibrate_video_searches_chain_and_hidden(tmp_path):
    from conftest import ROOT

    video = ROOT / "examples" / "videos" / "red-circle-left-to-right.mp4"
    tuned = tmp_path / "vid.yaml"
    out = _calibrate(["-p", "tinyworld-video", str(video), "--gammas", "2,4", "--max-new-tokens", "12",
                      "--write", str(tuned)])
    cands = out["candidates"]
    assert {c["method"] for c in cands} == {"chain", "hidden", "none"}
    assert any(c["method"] == "hidden" and c["tree"] for c in cands)
    assert all(c["mismatches"] == 0 for c in cands)
    assert load_profile(str(tuned)).method == next(c["method"] for c in cands if c["label"] == out["winner"])
    # the task it was calibrated for is written (the include alone named it before)
    assert out["schema"] == 1
    assert out["task"] == "video" and "\ntask: video\n" in tuned.read_text()


def test_batch_sizes_for_a_folder(setup):
    """The winner of a folder is also decoded --batch-size 2 at a time; its tokens are
    target-only's (sizes larger than the folder are not tried)."""
    root, samples, base = setup
    profile = load_profile(str(base), cli={"generation.max_new_tokens": 12})
    requests = sample_requests(profile, expand_inputs([str(samples)]))[0]
    reference = [build_session(profile).baseline_engine().generate(r).tokens for r in requests]
    winner = Candidate("chain", "chain M γ=4", {"method": "chain", "drafting.gamma": 4}, 4, speedup=1.0)
    out = _batch_candidates(profile, winner, requests, 1.0, reference, True)
    assert [c.settings["generation.batch_size"] for c in out] == [2]
    assert out[0].mismatches == 0 and out[0].speedup > 0
    assert load_profile(str(base)).generation.batch_size == 1


def test_tau_model_and_latency_model():
    hist = [2, 1, 0, 3]       # rounds accepting 0, 1, 2, 3 proposals (probed at γ=3)
    assert tau_for_gamma(hist, 3) == 1 + (1 + 9) / 6
    assert tau_for_gamma(hist, 1) == 1 + (1 + 3) / 6
    model = LatencyModel({1: 2.0, 3: 2.2, 5: 2.6}, {1: 0.5, 2: 0.6})
    assert model._at(model.verify_ms, 4) == pytest.approx(2.4)
    assert model.predicted_speedup(3.0, 2, 1) == pytest.approx(3.0 * 2.0 / (2 * 0.5 + 2.2))
    assert model.predicted_tree_speedup(3.0, 2, 2, 4) == pytest.approx(3.0 * 2.0 / (2 * 0.6 + 2.6))


def test_measured_latency_prices_candidates_by_their_probes_rounds():
    """Latency timed by the calibration itself: a candidate's wall over the samples is
    n·start + (N / τ)·round·share from its probe's medians, its prediction target-only's
    measured wall over that; the share of a shorter γ's round comes from the tables'
    verification line (through every entry, not one noisy one), never ≤ 0."""
    from vlmspec_cli.runtime.stats import SpecStats
    from vlmspec_cli.tasks.calibrate_model import RoundsModel, Run

    stats = SpecStats(new_tokens=120)
    base = Run(wall=1.2, walls=[0.3, 0.4, 0.5], outputs=[], stats=stats)
    rounds = RoundsModel.of_probe(base, {"round_ms": 15.0, "start_ms": 20.0})
    assert rounds.speedup(4.0) == pytest.approx(1200 / (3 * 20 + 30 * 15))
    assert rounds.speedup(4.0, 0.8) == pytest.approx(1200 / (3 * 20 + 30 * 12))
    assert RoundsModel.of_probe(base, {"rounds": 5, "rounds_drafting": 0}) is None   # never drafted
    # k ≥ 2 only: (2, 12), (3, 13), (4, 15), (9, 19); T_p(1) is the plain step
    model = LatencyModel({1: 10.0, 2: 12.0, 3: 13.0, 4: 15.0, 9: 19.0}, {1: 0.5})
    intercept, slope = model.verify_line()
    assert slope == pytest.approx(28.5 / 29.0) and intercept == pytest.approx(14.75 - 4.5 * slope)
    assert model.line_round_ms(2, 3, 0.5) == pytest.approx(1.0 + intercept + 4 * slope)
    # a falling table is taken flat at its mean; one entry beyond T_p(1): flat at it
    assert LatencyModel({1: 10.0, 2: 14.0, 5: 12.0}, {}).verify_line() == (13.0, 0.0)
    assert LatencyModel({1: 10.0, 8: 12.5}, {}).verify_line() == (12.5, 0.0)
    # Eq. 1 over whole requests (Amdahl): 4 prefills of 25 ms, 100 steps of T_p(1) = 10 ms
    whole = LatencyModel({1: 10.0}, {}, prefill_ms=25.0)
    assert whole.with_prefill(3.0, 4, 100) == pytest.approx(1100 / (100 + 1000 / 3.0))
    assert LatencyModel({1: 10.0}, {}).with_prefill(3.0, 4, 100) == 3.0   # no prefill time
    # one slow entry far out: the line at 2 tokens falls below T_p(1), which bounds it
    steep = LatencyModel({1: 10.0, 2: 10.0, 3: 10.0, 40: 200.0}, {})
    assert sum(steep.verify_line()) + steep.verify_line()[1] < 10.0
    assert steep.line_round_ms(0, 1, 0.0) == 10.0


def test_a_probes_candidates_are_priced_by_its_own_timed_rounds(setup, monkeypatch):
    """A chain probe decoded at its largest γ, latency measured now: each γ's prediction is
    the probe's rounds shortened by the share the tables give γ's round (levels at the
    draft step, tokens on the verification line), over τ(γ)."""
    from vlmspec_cli.tasks import calibrate as cal
    from vlmspec_cli.tasks.calibrate_space import Probe

    _, samples, base = setup
    profile = load_profile(str(base), ["generation.max_new_tokens=16"])
    requests = sample_requests(profile, expand_inputs([str(samples)]))[0]
    timed, real = [], cal.time_rounds
    monkeypatch.setattr(cal, "time_rounds", lambda *a, **kw: timed.append(real(*a, **kw)) or timed[-1])
    session = build_session(profile)
    base_run = cal._decode(session.baseline_engine(), requests)
    # a line of intercept 10 and slope 0.5; a draft step of 0.25 ms
    model = LatencyModel({1: 10.0, 2: 11.0, 9: 14.5}, {1: 0.25}, measured=True)
    probe = Probe("chain", {"method": "chain", "drafting.inputs": ["multimodal"]}, "chain M",
                  replay=True, rows=1)
    cands = cal.probe_candidates(profile, probe, requests, [2, 4], model, base_run, True,
                                 session.target)
    summary = timed[0].summary()
    rounds = cal.RoundsModel.of_probe(base_run, summary)
    levels, nodes = summary["levels_per_round"], summary["drafted_per_round"]
    assert [c.gamma for c in cands] == [2, 4] and all(c.cost == "rounds" for c in cands)
    line = lambda lv, nd: lv * 0.25 + 10.0 + 0.5 * (nd + 1)   # noqa: E731
    for c in cands:
        share = line(min(c.gamma, levels), min(c.gamma, nodes)) / line(levels, nodes)
        assert c.predicted == pytest.approx(rounds.speedup(c.tau_model, share), rel=1e-3)
    assert cands[0].predicted != pytest.approx(rounds.speedup(cands[0].tau_model), rel=1e-3)
    # the tables (a hardware profile's) with its prefill time: Eq. 1 over whole requests
    assert LatencyModel.from_hardware(profile.hardware).prefill_ms == profile.hardware.prefill_ms > 0
    table = LatencyModel({1: 10.0, 2: 11.0, 9: 14.5}, {1: 0.25}, prefill_ms=30.0)
    cands = cal.probe_candidates(profile, probe, requests, [2, 4], table, base_run, True,
                                 session.target)
    n, tokens = len(base_run.walls), base_run.stats.new_tokens
    for c in cands:
        eq1 = table.predicted_speedup(c.tau_model, c.gamma, 1)
        assert c.cost == "table" and c.predicted == pytest.approx(table.with_prefill(eq1, n, tokens), rel=1e-3)
        assert 1.0 < c.predicted < eq1


def test_the_profiles_own_configuration_is_probed_and_decoded_whatever_the_budget(setup, monkeypatch):
    """--budget spent at once: the one probe that runs is the search's probe of the
    profile's own configuration (moved to the front, not left where the search lists it),
    and the profile as it is (auto) is decoded for real although the budget is over."""
    from vlmspec_cli.tasks import calibrate as cal
    from vlmspec_cli.tasks.calibrate_space import Probe, own_probe

    _, samples, base = setup
    # (named to sort after its twin at the same modelled speed: not the first finalist)
    profile = load_profile(str(base), ["drafting.length=auto", "generation.max_new_tokens=12",
                                       "name=zz"])
    inputs = list(profile.drafting.inputs)
    other = Probe("chain", {"method": "chain", "drafting.inputs": ["text"]}, "chain T",
                  replay=True, rows=1)
    same = Probe("chain", {"method": "chain", "drafting.inputs": inputs}, "chain own inputs",
                 replay=True, rows=1)
    assert inputs != ["text"]
    monkeypatch.setattr(cal, "probes", lambda p, d, **kw: [other, same, own_probe(p)])
    requests = sample_requests(profile, expand_inputs([str(samples)]))[0]
    result = cal.calibrate(profile, requests, gammas=[2, 3], top=1, budget_s=1e-9)
    probed = {c.label.rsplit(" γ", 1)[0] for c in result.candidates if c.method == "chain" and c.settings}
    assert probed == {"chain own inputs"} and any("chain T (budget)" in s for s in result.skipped)
    own = next(c for c in result.candidates if c.settings == {})
    ranked = [c for c in result.candidates if c.method != "none"]
    assert ranked.index(own) > 0 and own.speedup is not None and own.mismatches == 0


def test_calibrate_needs_samples_and_names_bad_ones(tmp_path):
    res = CliRunner().invoke(cli, ["calibrate"])
    assert res.exit_code == 2 and "no SAMPLES" in res.output
    # a sample that fails is an input that failed (exit 1, as `caption gone.png`), also
    # when none is left to calibrate on
    res = CliRunner().invoke(cli, ["calibrate", str(tmp_path / "gone.png"), "-q"])
    assert res.exit_code == 1 and "gone.png" in res.output and "no usable samples" in res.output


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
        for force in ([], ["--force"]):   # said alike: --force would not help
            line = _refused([str(sample), "--write", str(target), *force, *fast])
            assert str(target) in line and "is not a profile written by `vlmspec calibrate`" in line
            assert "even with --force" in line and target.read_bytes() == before
    # a profile a person wrote is kept too: --force replaces only what calibrate wrote
    mine = root / "mine.yaml"
    mine.write_text("name: mine\ninclude: tinyworld-caption\ndrafting: {gamma: 3}\n")
    line = _refused([str(sample), "--write", str(mine), "--force", *fast])
    assert "is not a profile written by `vlmspec calibrate`" in line and "gamma: 3" in mine.read_text()
    line = _refused([str(sample), "--write", str(root / "mine.yaml" / "x.yaml"), *fast])
    assert "is not a folder" in line     # found before the work, not after it


@pytest.mark.quick
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


def test_the_pick_can_be_target_only():
    """Target-only decoding (method none) is a candidate, modelled at 1.0x and measured by
    definition. The fastest measured wins, unless the modelled best measured within the
    margin of it; whenever the winner is not the fastest measured or not the modelled best,
    the note says why in one line."""
    from vlmspec_cli.tasks.calibrate import _pick

    def cand(label, predicted, speedup):
        return Candidate("chain", label, {}, predicted=predicted, speedup=speedup)

    none = Candidate("none", "none (target only)", {"method": "none"}, 0, predicted=1.0, speedup=1.0)
    best, other = cand("a", 3.0, 1.3), cand("b", 2.0, 1.35)
    assert _pick([best, other], none, margin=0.1) == (best, "a, modelled best, is kept at 1.30x: "
                                                      "b measured 1.35x, within --margin 10% (timing noise)")
    assert _pick([best, other], none, margin=0.03) == (other, "measured fastest; a, modelled best, "
                                                       "measured 1.30x")
    assert _pick([other, cand("c", 1.5, 1.2)], none, margin=0.03) == (other, "")
    slow, fast = cand("a", 3.0, 0.5), cand("b", 2.0, 1.05)
    winner, note = _pick([slow, fast], none, margin=0.5)
    assert winner is fast and "a, modelled best, measured 0.50x" in note
    winner, note = _pick([cand("a", 3.0, 0.8), cand("b", 2.0, 0.85)], none, margin=0.1)
    assert winner is none and "target-only decoding was measured fastest" in note
    assert _pick([cand("a", 3.0, 0.95)], none, margin=0.1)[0].label == "a"   # within the noise
    assert _pick([cand("a", 0.9, None)], none, margin=0.1)[0] is none         # modelled


def _useless_draft(root):
    """The tinyworld draft with its decoder layers drawn at random: it proposes nonsense."""
    from vlmspec_cli.zoo.scrambled import scrambled_draft

    return scrambled_draft(root, "llava-draft", seed=1234)


def test_calibrate_answers_none_when_target_only_is_fastest(setup, tmp_path):
    """With a draft that never guesses right, every configuration tried decodes slower than
    the target alone: the written profile says method none (and its task), and the output
    says why, with what was measured: the spread per sample and the prediction error.
    (γ fixed: the shipped auto length would switch such a draft off, near target-only. The
    target named by its folder, not its zoo name: calibrate also tries the hidden-state
    head and the twig shipped for the zoo's target, which predict well and, when their
    probes started within the budget, could win.)"""
    from vlmspec_cli.runtime.models.loading import resolve_model_source

    _, samples, _ = setup
    base = tmp_path / "bad.yaml"
    target = resolve_model_source("zoo:tinyworld/llava-target")
    base.write_text(f"include: tinyworld-caption\nname: bad\ntarget:\n  model: {target}\n"
                    f"draft:\n  model: {_useless_draft(tmp_path / 'd')}\n"
                    "drafting:\n  length: fixed\n")
    tuned = tmp_path / "tuned.yaml"
    res = CliRunner().invoke(cli, ["calibrate", str(samples / "s0.png"), "--profile", str(base),
                                   "--gammas", "4", "--max-new-tokens", "16", "--budget", "1",
                                   "--top", "1", "--margin", "0.1", "--json", "--write", str(tuned)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["method"] == "none" and out["winner"] == "none (target only)"
    # (modelled or measured fastest, as the latency measured here says)
    assert out["note"].startswith("target-only decoding was") and out["note"] in res.stderr
    assert load_profile(str(tuned)).method == "none"
    text = tuned.read_text()
    assert "\ntask: caption\n" in text and "measured fastest here: method none" in text
    measured = [c for c in out["candidates"] if c["speedup"] is not None and c["method"] != "none"]
    assert measured and all(c["speedup"] < 1 for c in measured)
    assert not {"hidden", "twig"} & {c["method"] for c in out["candidates"]}
    # latency measured here (no hardware profile): each candidate priced by its probe's rounds
    assert out["latency"] == "measured"
    assert all(c["cost"] == "rounds" for c in out["candidates"] if c["method"] != "none")
    for c in measured:
        assert c["speedup_min"] <= c["speedup_median"] <= c["speedup_max"]
        assert c["prediction_error"] == pytest.approx(c["predicted"] / c["speedup"] - 1, abs=1e-3)
    assert out["prediction_error"]["measured"] == len(measured)
    walls = out["target_only"]["sample_wall_s"]
    assert walls["min"] <= walls["median"] <= walls["max"]
    assert "prediction error over" in res.stderr and "per sample" in res.stderr


def test_an_auto_profile_is_probed_at_fixed_lengths_and_measured_as_it_is(setup, monkeypatch):
    """drafting.length auto: a probe must draft its largest γ every round to stand for
    every γ, so probes and candidates pin drafting.length fixed; the profile as it is
    (auto) is a candidate modelled at its best fixed γ and decoded for real."""
    from vlmspec_cli.tasks import calibrate as cal
    from vlmspec_cli.tasks.calibrate_space import Probe, own_probe

    _, samples, base = setup
    profile = load_profile(str(base), ["drafting.length=auto", "generation.max_new_tokens=16"])
    chain_m = Probe("chain", {"method": "chain", "drafting.inputs": ["multimodal"]}, "chain M",
                    replay=True, rows=1)
    monkeypatch.setattr(cal, "probes", lambda p, d, **kw: [chain_m, own_probe(p)])
    lengths = []     # drafting.length of every session calibrate builds
    real = cal.build_session
    monkeypatch.setattr(cal, "build_session",
                        lambda p, **kw: (lengths.append(p.drafting.length), real(p, **kw))[1])
    requests = sample_requests(profile, expand_inputs([str(samples)]))[0]
    result = cal.calibrate(profile, requests, gammas=[2, 4], top=1, budget_s=600)
    own = next(c for c in result.candidates if c.settings == {})
    assert own.label.endswith(f"γ auto ≤ {profile.drafting.gamma}") and own.speedup is not None and own.mismatches == 0
    chains = [c for c in result.candidates if c.method == "chain" and c.settings
              and "generation.batch_size" not in c.settings]
    assert {c.gamma for c in chains} == {2, 4}
    assert all(c.settings["drafting.length"] == "fixed" for c in chains)
    assert own.predicted == max(c.predicted for c in chains)
    assert lengths[0] == "auto" and "fixed" in lengths and lengths.count("auto") >= 2


def test_finalists_are_timed_beside_target_only_sample_by_sample():
    """A finalist's speedup compares each sample decoded by target-only and by the candidate
    back to back (which goes first alternating), not against target-only timed minutes
    earlier: a busy stretch on a shared machine falls on both sides of a pair."""
    from types import SimpleNamespace

    from vlmspec_cli.runtime.stats import SpecStats
    from vlmspec_cli.tasks.calibrate import _paired

    calls = []

    class Engine:
        drafter = None

        def __init__(self, name):
            self.name = name

        def generate(self, req):
            calls.append((self.name, req))
            stats = SpecStats()
            stats.new_tokens = 3
            return SimpleNamespace(state=SimpleNamespace(stats=stats), tokens=[req, self.name])

    base, cand = _paired(Engine("base"), Engine("cand"), [0, 1, 2])
    assert calls == [("base", 0), ("cand", 0), ("cand", 1), ("base", 1), ("base", 2), ("cand", 2)]
    assert base.outputs == [[0, "base"], [1, "base"], [2, "base"]]
    assert cand.outputs == [[0, "cand"], [1, "cand"], [2, "cand"]]
    assert len(base.walls) == len(cand.walls) == 3 and base.stats.new_tokens == cand.stats.new_tokens == 9
    assert base.wall >= sum(base.walls) > 0


def test_the_written_profile_finds_its_base_from_any_folder(tmp_path, monkeypatch):
    """A base found by name in ./profiles was included by that name, which the written
    profile then found only from that folder ("include 'mybase' not found" elsewhere); a
    shipped base is included by name, any other by its path."""
    from vlmspec_cli.profile import resolve_profile_path
    from vlmspec_cli.profile.loader import _packaged_dir
    from vlmspec_cli.tasks.calibrate_io import include_for

    project = tmp_path / "proj"
    (project / "profiles").mkdir(parents=True)
    (project / "profiles" / "mybase.yaml").write_text("name: mybase\ninclude: tinyworld-small\n"
                                                      "generation: {max_new_tokens: 8}\n")
    monkeypatch.chdir(project)
    base = str(resolve_profile_path("mybase"))
    written = [project / "profiles" / "t1.yaml", tmp_path / "other" / "t2.yaml"]
    for path in written:
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"name: {path.stem}\ninclude: {include_for(base, path)}\n")
    shipped = _packaged_dir() / "tinyworld-caption.yaml"   # (tests/profiles has its own)
    assert include_for(str(shipped), written[0]) == "tinyworld-caption"
    monkeypatch.chdir(tmp_path)              # another folder: no ./profiles here
    for path in written:
        assert load_profile(str(path)).generation.max_new_tokens == 8


def test_a_missing_head_or_twig_folder_is_a_usage_error(tmp_path):
    """A typo in --hidden ./head was listed among the candidates "not tried" (exit 0)."""
    scene = str(Path(__file__).resolve().parent.parent / "examples" / "images" / "scene1.png")
    (tmp_path / "afile").write_text("x")
    for option, value, why in (("--hidden", str(tmp_path / "nope"), "no such folder"),
                               ("--twig", str(tmp_path / "afile"), "is not a folder")):
        res = CliRunner().invoke(cli, ["calibrate", str(scene), option, value, "--budget", "1"])
        assert res.exit_code == 2, res.output
        assert f"'{option}': {value}: {why}" in res.output


def test_image_calibration_refuses_empty_prompts_and_paths():
    """An image profile's SAMPLES are prompts: an empty one (refused by generate-image) and
    a path (an image given with an image profile) were calibrated on as text, exit 0."""
    scene = str(Path(__file__).resolve().parent.parent / "examples" / "images" / "scene1.png")
    res = CliRunner().invoke(cli, ["calibrate", "-p", "tinyworld-image", "", " ", scene,
                                   "--budget", "1", "--top", "1", "-q"])
    assert res.exit_code == 1, res.output      # inputs that failed, as in any batch
    assert "prompt 1: empty prompt" in res.output and "prompt 2: empty prompt" in res.output
    assert f"prompt 3: '{scene}' names a file or folder" in res.output
    assert "no usable samples" in res.output


def test_a_hardware_profile_of_other_models_is_not_used(setup, tmp_path):
    """`vlmspec profile` records the models it timed; calibrate does not price another
    pair by those tables (the 32-layer target's priced tinyworld-small: 60% off) and says
    why. A hardware profile of the same models is used."""
    from vlmspec_cli.tasks.calibrate_model import hardware_mismatch

    root, _, _ = setup
    hw = load_profile(str(root / "base.yaml"))
    measured = hw.hardware.measurements
    assert measured["target"] == hw.target.model and measured["draft"] == hw.draft.model
    assert hardware_mismatch(hw) is None and LatencyModel.from_hardware(hw.hardware, hw)
    small = tmp_path / "small-hw.yaml"     # (the tests' tinyworld-caption has the small pair)
    small.write_text(f"name: small-hw\ninclude: [tinyworld-small, {root / 'hw.yaml'}]\n"
                     "target: {model: zoo:tinyworld/llava-target-deep}\n")
    other = load_profile(str(small))
    why = hardware_mismatch(other)
    assert why and f"target '{hw.target.model}'" in why and other.target.model in why
    assert LatencyModel.from_hardware(other.hardware, other) is None
    assert LatencyModel.from_hardware(other.hardware) is not None      # (asked without it)


def test_a_model_given_with_model_is_written_into_the_calibrated_profile(setup, tmp_path,
                                                                        monkeypatch):
    """calibrate --model DIR --write tuned.yaml: the written profile names that target (its
    absolute folder, as a --set path is pinned), so `caption -p tuned.yaml` decodes with the
    model it was calibrated for, not the base profile's."""
    from vlmspec_cli.runtime.models.loading import resolve_model_source

    _, samples, _ = setup
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").symlink_to(resolve_model_source("zoo:tinyworld/llava-target"))
    res = CliRunner().invoke(cli, ["calibrate", str(samples / "s0.png"), "--model", "mine",
                                   "--gammas", "4", "--max-new-tokens", "8", "--budget", "1",
                                   "--top", "1", "--write", "tuned.yaml", "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert load_profile(str(tmp_path / "tuned.yaml")).target.model == str(tmp_path / "mine")
