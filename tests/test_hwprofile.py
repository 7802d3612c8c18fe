"""`vlmspec profile`: measures the tinyworld models, writes a hardware profile that loads back
(through include:), checks TABED's Remarks 1-3, and draws a PNG."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from click.testing import CliRunner
from PIL import Image

from corpus import make_broken_model_dir, write_foreign_yaml, write_user_notes

from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import method_class
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.fast.latency import eq1_speedup, remarks, LatencyTables

# `vlmspec profile` timed briefly on one thread (the thread search has its own test)
QUICK = ("--repeats", "3", "--threads", "1")


def test_profile_writes_hardware_yaml_that_loads_back(tmp_path):
    hw, png = tmp_path / "hw.yaml", tmp_path / "hw.png"
    res = CliRunner().invoke(cli, ["profile", *QUICK, "--warmup", "1", "--contexts", "64",
                                   "--write", str(hw), "--plot", str(png), "--tau", "3", "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    user = tmp_path / "mine.yaml"
    user.write_text(f"include: {hw.name}\nname: mine\n")
    p = load_profile(str(user))
    h = p.hardware
    assert 0 < h.latency_ratio < 1
    assert h.target_ms > 0 and h.draft_ms > 0 and h.prefill_ms > 0 and h.dtype == "float32"
    assert h.latency_ratio == round(h.draft_ms / h.target_ms, 4) or abs(h.latency_ratio - h.draft_ms / h.target_ms) < 1e-3
    m = h.measurements
    assert set(m["remarks"]) == {"remark1_target_vs_gamma", "remark2_draft_vs_S", "remark3_draft_vs_B"}
    assert all(isinstance(r["holds"], bool) and r["max_rel_dev"] >= 0 for r in m["remarks"].values())
    verified = load_profile().drafting.gamma + 1    # the measured profile's pending token + γ
    assert 64 in m["target_verify_ms"] and verified in m["target_verify_ms"][64]
    assert set(m["draft_step_ms"]) >= {1, 2, 3, 4} and set(m["target_batch_ms"]) >= {1, 2, 3, 4}
    assert "3.0" in m["expected_speedup"]
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > im.size[1]
    # a rerun neither overwrites silently nor refuses its own files with --force
    before = hw.read_bytes(), png.read_bytes()
    res = CliRunner().invoke(cli, ["profile", "--write", str(hw), "--plot", str(png), "-q"])
    assert res.exit_code == 2 and f"--write {hw}: exists (use --force" in res.stderr
    assert (hw.read_bytes(), png.read_bytes()) == before
    res = CliRunner().invoke(cli, ["profile", *QUICK, "--warmup", "0", "--contexts", "32",
                                   "--write", str(hw), "--plot", str(png), "--force", "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert load_profile(str(user)).hardware.measurements["target_verify_ms"].keys() >= {32}


@pytest.mark.quick
def test_profile_json_to_stdout():
    res = CliRunner().invoke(cli, ["profile", *QUICK, "--warmup", "0", "--contexts", "32",
                                   "--json", "-q", "--set", "method=none"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["draft_ms"] is None and data["latency_ratio"] is None and data["target_ms"] > 0


@pytest.mark.parametrize("args,method", [
    (["-p", "tinyworld-hidden"], "hidden"), (["-p", "tinyworld-twig"], "twig"),
    (["--set", "method=tree"], "tree"), ([], "chain")])
def test_profile_times_the_rounds_of_every_method(args, method):
    """Methods without a separate draft model (hidden head, twig) get their drafting cost
    from timed rounds of their own decoding; trees report nodes and levels apart."""
    res = CliRunner().invoke(cli, ["profile", *args, *QUICK, "--warmup", "0",
                                   "--contexts", "32", "--json", "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    r = data["measurements"]["rounds"]
    assert r["method"] == method and 0 < r["rounds_drafting"] <= r["rounds"]
    assert r["draft_ms_per_round"] > 0 and r["verify_ms_per_round"] > 0
    assert 1 <= r["levels_per_round"] <= data["measurements"]["gamma"]   # ≤ γ, or the tree's depth
    named = load_profile(args[1] if args[:1] == ["-p"] else None, [f"method={method}"])
    own = method_class(method)   # a tree's γ is its depth, its round its nodes + 1
    assert data["measurements"]["gamma"] == own.gamma(named)
    assert str(own.round_width(named)) in data["measurements"]["target_verify_ms"]["32"]
    assert data["measurements"].get("round_width", own.gamma(named) + 1) == own.round_width(named)
    # per round, drafting per level ≤ drafting (≥ 1 level), so their medians are ordered too;
    # equal only if no round drafted more than one level
    assert 0 < r["draft_ms_per_level"] < r["draft_ms_per_round"]
    assert data["measurements"]["verify_over_step"] == pytest.approx(
        data["target_verify_ms"] / data["target_ms"], abs=1e-3)
    if method == "tree":
        assert r["drafted_per_round"] > 2 * r["levels_per_round"]   # 20 nodes over ≤ 5 levels
    else:
        assert r["drafted_per_round"] == r["levels_per_round"]      # a chain: one per level
    if method in ("hidden", "twig"):   # no draft model: the ratio is the method's own
        assert data["draft_ms"] is None
        assert data["latency_ratio"] == pytest.approx(r["draft_per_level_over_target_step"],
                                                      rel=1e-3)
    else:
        assert data["draft_ms"] > 0


def test_profile_of_a_video_profile_times_every_length(tmp_path):
    png = tmp_path / "video.png"
    res = CliRunner().invoke(cli, ["profile", "-p", "tinyworld-video", "--frames", "4,16",
                                   *QUICK, "--warmup", "0", "--contexts", "64",
                                   "--plot", str(png), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    frames = data["measurements"]["frames"]
    assert set(frames) == {"4", "16"}           # JSON keys
    short, long_ = frames["4"], frames["16"]
    assert long_["prompt_tokens"] > short["prompt_tokens"]   # the video's tokens grow
    assert all(f["prefill_ms"] > 0 and f["target_step_ms"] > 0 and f["draft_ms_per_level"] > 0
               for f in (short, long_))
    assert data["measurements"]["rounds"]["method"] == "hidden" and data["latency_ratio"] > 0
    assert "video of 16 frames" in res.stderr
    assert "Remark" not in res.stderr and "remark" not in res.stderr   # under -v only
    (n, total), = _steps(res.stderr)[-1:]    # the frames' steps counted in N up front
    last = [line for line in res.stderr.splitlines() if line.startswith(f"measuring step {n}/")]
    assert n == total and re.fullmatch(rf"measuring step {n}/{n}, ETA ~\S+: video of 16 frames "
                                       r"\(\d+ positions\)", last[0]), last
    with Image.open(png) as im:
        assert im.format == "PNG"
    res = CliRunner().invoke(cli, ["profile", "--frames", "4", "-q"])
    assert res.exit_code == 2 and "--frames" in res.stderr
    # lengths describe-video would not decode are refused before anything is timed
    # (--frames 1,100000 grew past 12 GB building its sample; 1000 was timed at 8011
    # positions on a 4096-position target)
    for frames, sets, reason in (("1,100000", [], "--frames 100000: more than video.max_frames (256)"),
                                 ("1000", ["--set", "video.max_frames=2000"],
                                  "--frames 1000: a video of 1000 frames takes 8011 positions")):
        res = CliRunner().invoke(cli, ["profile", "-p", "tinyworld-video", "--frames", frames,
                                       *sets, "-q"])
        assert res.exit_code == 2 and reason in res.stderr, res.stderr


def test_profile_of_an_image_profile_times_guided_steps_and_tree_sizes(tmp_path):
    hw, png = tmp_path / "img.yaml", tmp_path / "img.png"
    res = CliRunner().invoke(cli, ["profile", "-p", "tinyworld-image", *QUICK,
                                   "--warmup", "0", "--write", str(hw), "--plot", str(png), "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    user = tmp_path / "mine.yaml"
    user.write_text(f"include: [tinyworld-image, {hw.name}]\nname: mine\n")
    h = load_profile(str(user)).hardware
    m = h.measurements
    (s, verify), = m["target_verify_ms"].items()          # the sample prompt's length
    assert set(verify) >= {1, 2, 4, 8, 16, 32, 64}        # up to ADT-Tree's largest trees
    assert h.target_ms == verify[1] and h.draft_ms == m["draft_step_ms"][1][s]
    assert 0 < h.latency_ratio < 1 and h.prefill_ms > 0
    r = m["rounds"]
    assert r["method"] == "adt" and r["rounds_drafting"] > 0
    assert r["drafted_per_round"] > r["levels_per_round"] >= 1   # trees, not chains
    with Image.open(png) as im:
        assert im.format == "PNG"
    for extra in (["--contexts", "64"], ["--compile"]):
        res = CliRunner().invoke(cli, ["profile", "-p", "tinyworld-image", *extra, "-q"])
        assert res.exit_code == 2 and "task 'image'" in res.stderr


def test_remarks_and_eq1():
    tables = LatencyTables(target_verify_ms={10: {1: 1.0, 4: 1.02, 8: 1.2}},
                           draft_step_ms={1: {10: 0.5, 100: 0.51}, 2: {10: 0.52, 100: 0.5}})
    r = remarks(tables)
    assert r["remark1_target_vs_gamma"] == {"max_rel_dev": 0.2, "holds": False}
    assert r["remark2_draft_vs_S"]["holds"] and r["remark3_draft_vs_B"]["holds"]
    # one batch size, one context (an image profile's draft): nothing to compare, not "holds"
    one = remarks(LatencyTables(target_verify_ms={10: {1: 1.0, 4: 1.02}},
                                draft_step_ms={1: {9: 0.5256}}))
    assert one["remark2_draft_vs_S"] is None and one["remark3_draft_vs_B"] is None
    assert one["remark1_target_vs_gamma"]["holds"]
    assert eq1_speedup(3.0, 5, 0.2) == 1.5
    assert abs(eq1_speedup(3.0, 5, 0.2, verify_factor=1.5) - 1.2) < 1e-9


def _refused(args):
    """`vlmspec profile` with a broken target: a refusal comes before any model loads."""
    res = CliRunner().invoke(cli, ["profile", *args, "-q"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-model-type" not in res.stderr, res.stderr
    return lines[0]


def test_write_and_plot_never_destroy_a_file(tmp_path):
    fast = ["--set", f"target.model={make_broken_model_dir(tmp_path / 'broken')}"]
    yaml_file, notes, png = tmp_path / "ci.yaml", tmp_path / "notes.png", tmp_path / "p.png"
    kept = {yaml_file: write_foreign_yaml(yaml_file), notes: write_user_notes(notes)}
    for force in ([], ["--force"]):   # said alike: --force would not help
        assert "is not a hardware profile" in _refused(["--write", str(yaml_file), *force, *fast])
    assert "is not a PNG image" in _refused(["--plot", str(notes), "--force", *fast])
    # a person's photo is a PNG, not one vlmspec wrote: --force does not replace it
    photo = tmp_path / "photo.png"
    Image.new("RGB", (4, 4), "blue").save(photo)
    kept[photo] = photo.read_bytes()
    assert "is not a PNG image vlmspec wrote" in _refused(["--plot", str(photo), "--force", *fast])
    # a user's full profile is a vlmspec profile but not a hardware one: kept too
    mine = tmp_path / "mine.yaml"
    mine.write_text("include: tinyworld-caption\nname: mine\n")
    kept[mine] = mine.read_bytes()
    assert "is not a hardware profile" in _refused(["--write", str(mine), "--force", *fast])
    # a hardware section a person wrote (no `vlmspec profile` header): kept as well
    hand = tmp_path / "hand-hw.yaml"
    hand.write_text("hardware: {latency_ratio: 0.1}\n")
    kept[hand] = hand.read_bytes()
    assert "is not a hardware profile" in _refused(["--write", str(hand), "--force", *fast])
    # the profile it measures is an input, --write and --plot one file is a mistake
    line = _refused(["-p", str(mine), "--write", str(mine), "--force", *fast])
    assert "is an input" in line
    assert "is the --write file too" in _refused(["--write", str(png), "--plot", str(png), *fast])
    assert all(path.read_bytes() == data for path, data in kept.items()) and not png.exists()


def test_subprocess_write_refuses_foreign_yaml(tmp_path):
    target = tmp_path / "ci.yaml"
    before = write_foreign_yaml(target)
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "profile", "--write", str(target),
                           "--force", "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(target) in proc.stderr and target.read_bytes() == before


def test_profile_picks_the_fastest_thread_counts_and_auto_uses_them(tmp_path):
    """`--threads 1,2` decodes the sample requests at each count and writes the count with
    the least time outside the prefill as hardware.threads and the fastest prefill's as
    hardware.prefill_threads; a profile including that file with auto runs on them, an
    explicit count wins (auto: a ceiling, lowered while other processes use the cores:
    test_threads.py), and a plan with neither count never touches the process's count."""
    import torch

    from vlmspec_cli.runtime.threads import PROCESS_THREADS, ThreadPlan
    from vlmspec_cli.session import thread_plan

    hw = tmp_path / "hw.yaml"
    res = CliRunner().invoke(cli, ["profile", "--threads", "1,2", "--repeats", "3", "--warmup", "0",
                                   "--contexts", "32", "--write", str(hw), "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    user = tmp_path / "mine.yaml"
    user.write_text(f"include: {hw.name}\nname: mine\nruntime:\n  threads: auto\n")
    h = load_profile(str(user)).hardware
    job = {int(n): ms for n, ms in h.measurements["threads_job_ms"].items()}
    pre = {int(n): ms for n, ms in h.measurements["threads_prefill_ms"].items()}
    assert set(job) == set(pre) == {1, 2} and all(0 < pre[n] < job[n] for n in job)
    assert h.threads == min(job, key=lambda n: job[n] - pre[n])
    assert h.prefill_threads == min(pre, key=pre.get)
    assert h.device.endswith(f", threads: {h.threads} decoding, {h.prefill_threads} prefilling)")
    both = frozenset({"prefill", "decode"})
    assert thread_plan(load_profile(str(user))) == ThreadPlan(h.prefill_threads, h.threads, auto=both)
    explicit = load_profile(str(user), ["runtime.threads=3"])
    assert thread_plan(explicit) == ThreadPlan(h.prefill_threads, 3, auto=frozenset({"prefill"}))
    bare = load_profile(None, ["runtime.threads=auto"])   # nothing measured: the process's count
    assert thread_plan(bare) == ThreadPlan(PROCESS_THREADS, PROCESS_THREADS, auto=both)
    torch.set_num_threads(3)
    ThreadPlan().enter("prefill"), ThreadPlan().enter("decode")
    assert torch.get_num_threads() == 3
    # one phase set: the other runs at the process's own count, not at the last phase's
    assert thread_plan(load_profile(None, ["runtime.threads=1"])) == ThreadPlan(
        PROCESS_THREADS, 1, auto=frozenset({"prefill"}))


def test_probe_inputs_are_drawn_here_from_the_seed():
    """The probe's image and video (tasks/probe_media.py, not the zoo): tinyworld-sized,
    the same for a seed, another for another seed; the video's shape moves."""
    import random

    from vlmspec_cli.tasks.probe_media import probe_frames, probe_image

    a, b = probe_image(random.Random(3)), probe_image(random.Random(3))
    assert a.size == (64, 64) and a.mode == "RGB" and a.tobytes() == b.tobytes()
    assert len({probe_image(random.Random(s)).tobytes() for s in range(4)}) == 4
    frames = probe_frames(random.Random(0), 5)
    assert len(frames) == 5 and frames[0].shape == (64, 64, 3) and frames[0].dtype == "uint8"
    assert (frames[0] != frames[-1]).any()


def test_the_sense_checks_flag_a_wider_verify_measured_faster_and_eq1_above_tau():
    """Issue 60's run printed T_p(γ+1=5) 2.132 ms below T_p 6.047 ms and an Eq. 1 speedup
    of 4.99x at τ=4: a wider verification cheaper than a narrower one on the same kernels,
    and a speedup above τ, are timed again and, still off, flagged."""
    from vlmspec_cli.tasks.hwprofile import expected_speedups
    from vlmspec_cli.tasks.hwprofile_checks import (Steps, check_eq1, check_verify,
                                                    narrower_faster)

    assert narrower_faster({1: 6.047, 2: 6.1, 5: 2.132}, wide=False) == [(2, 5)]
    assert narrower_faster({1: 6.047, 5: 2.132}, wide=False) == [(1, 5)]
    # a CPU target's several-row forwards run on faster kernels than its one-row step:
    # below T_p(1) is no fault there, below half of it is
    assert narrower_faster({1: 10.0, 2: 8.5, 4: 9.0, 8: 9.6}, wide=True) == []
    assert narrower_faster({1: 6.047, 5: 2.132}, wide=True) == [(1, 5)]
    assert narrower_faster({1: 1.0, 2: 1.05, 8: 1.2, 16: 1.15}, wide=False) == []   # noise
    reports, asked = [], []
    steps = Steps([], reports.append)
    table = {31: {1: 6.047, 2: 6.1, 5: 2.132}, 64: {1: 6.0, 5: 6.3}}

    def still_off(s, ks):
        asked.append((s, ks))
        return {k: table[s][k] for k in ks}

    suspect = check_verify(table, False, still_off, steps)
    assert asked == [(31, [2, 5])]                          # only the offending pair, once
    assert suspect == ["T_p(5) 2.132 ms below T_p(2) 6.100 ms at S=31"]
    assert reports and reports[0].startswith("step 1/1: timing 2, 5 tokens after 31 positions again")
    fixed = check_verify(table, False, lambda s, ks: {2: 6.1, 5: 6.4}, None)
    assert fixed == [] and table[31][5] == 6.4
    expected = expected_speedups(None, 4, 0.112, 2.132 / 6.047)
    assert expected["4.0"]["eq1_measured_verify"] == pytest.approx(4.99, abs=0.02)
    flagged = check_eq1(expected, False, 2.132 / 6.047, 5)
    assert "Eq. 1 speedup at τ=4.0: 5.00x, above τ (T_p(5) measured 0.35 of T_p(1))" in flagged
    assert all("above τ" in f for f in flagged)
    assert check_eq1(expected_speedups(None, 4, 0.112, 1.1), False, 1.1, 5) == []


def test_profile_steps_report_counts_and_an_eta():
    from vlmspec_cli.tasks.hwprofile_checks import Steps

    clock, reports = [0.0], []
    steps = Steps(["verify", "verify", "batch"], reports.append, clock=lambda: clock[0])
    steps("first")
    clock[0] = 10.0
    steps("second")
    clock[0] = 20.0
    steps("third")
    steps("one more")                   # not in the plan: counted, N grows with it
    assert reports[0] == "step 1/3: first"            # nothing timed yet: no ETA
    assert reports[1] == "step 2/3, ETA ~13s: second"    # 10 s per verify, a batch is 40/150
    assert reports[2] == "step 3/3, ETA ~3s: third"
    assert reports[3] == "step 4/4, ETA ~0s: one more"


def _steps(stderr: str) -> list[tuple[int, int]]:
    """(i, N) of each "measuring step i/N…" line, checked to count 1, 2, … without a gap."""
    steps = [tuple(map(int, m)) for m in re.findall(r"^measuring step (\d+)/(\d+)[:,] ", stderr, re.M)]
    assert [i for i, _ in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 4, stderr
    return steps


def test_profile_prints_its_steps_and_says_the_remarks_in_words_under_v():
    """Where stderr is no terminal each step is a line ("measuring step i/N, ETA ~Xs: …"),
    counted up to N exactly; TABED's remarks are sentences, shown under -v only."""
    args = ["profile", *QUICK, "--warmup", "0", "--contexts", "32", "--set", "method=none"]
    res = CliRunner().invoke(cli, [*args, "-v"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    steps = _steps(res.stderr)
    assert steps[-1][0] == steps[-1][1], steps              # the last step is step N/N
    assert "ETA ~" in res.stderr
    assert "TABED's Remark 1: verifying up to 10 tokens costs about one target step;" in res.stderr
    assert "remark1" not in res.stderr and "does not hold" not in res.stderr
    assert isinstance(json.loads(CliRunner().invoke(cli, [*args, "--json", "-q"]).stdout)
                      ["measurements"]["suspect"], list)


def test_the_remarks_said_in_words():
    from vlmspec_cli.cli.hwprofile_table import remark_lines

    lines = remark_lines({"remark1_target_vs_gamma": {"max_rel_dev": 0.5884, "holds": False},
                          "remark2_draft_vs_S": {"max_rel_dev": 0.01, "holds": True},
                          "remark3_draft_vs_B": None})
    assert lines == [
        "TABED's Remark 1: verifying up to 10 tokens costs about one target step; here it "
        "varies by up to 59% with the tokens verified.",
        "TABED's Remark 2: a draft step costs the same at any context length; holds here "
        "(within 1%).",
        "TABED's Remark 3: drafting several rows at once costs about one row; not measured "
        "here (one timing only)."]
