"""calibrate's budget and search order (tasks/calibrate_plan.py, calibrate_space.next_probe):
every method family probed at least once, the likeliest first, probes sized to the time
left, steps counted with an ETA, and the written winner never slower than a measured
candidate without a line saying why."""

from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import ROOT
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile
from vlmspec_cli.tasks.calibrate_plan import MAX_PAIRED_REPEATS, SearchClock, paired_repeats
from vlmspec_cli.tasks.calibrate_space import Probe, next_probe

IMAGES = ROOT / "examples" / "images"


def _clock(budget_s: float, elapsed: float, samples: int = 6, sample_s: float = 1.0) -> SearchClock:
    clock = SearchClock(budget_s, lambda _m: None, samples=samples, base_wall_s=samples * sample_s,
                        first_sample_s=sample_s)
    clock.start -= elapsed
    clock.per_sample_s.append(sample_s)
    return clock


def test_probes_are_sized_to_the_time_left_and_every_family_gets_one():
    # plenty of time: whole probes
    assert _clock(1000, 0).probe_samples("tree", families_left=3) == 6
    # the budget spent: a family not probed yet still gets one sample, a probed one none
    over = _clock(10, 50)
    assert over.probe_samples("twig", families_left=2) == 1
    over.probed.add("chain")
    assert over.probe_samples("chain", families_left=2) == 0
    # in between: a first probe takes what is left after the finalists' reserve and a sample
    # for each other family not probed yet
    clock = _clock(100, 0)
    room = 100 - clock.reserve()
    assert clock.probe_samples("tabed", families_left=3) == min(6, int(room - 2))
    clock.probed.add("tabed")
    assert clock.probe_samples("tabed", families_left=2) == min(6, int(room - 2))


def test_finalists_fit_only_while_the_budget_lasts():
    assert _clock(100, 0).finalist_fits()
    clock = _clock(100, 0)
    clock.start -= 100 - clock.finalist_s() + 1
    assert not clock.finalist_fits()


def test_short_samples_are_measured_a_few_times_over():
    assert paired_repeats(2.0) == 1
    assert paired_repeats(0.2) == 3
    assert paired_repeats(0.001) == MAX_PAIRED_REPEATS
    assert paired_repeats(0.0) == 1


def test_steps_count_up_with_an_eta_within_the_budget():
    said = []
    clock = _clock(30, 0)
    clock.say, clock.steps = said.append, 4
    clock.step("acceptance of chain M", probes=2, finalists=2)
    clock.step("measuring chain M γ=4", probes=0, finalists=1)
    assert said[0].startswith("step 1/4 · acceptance of chain M · ~") and said[0].endswith(" s left")
    assert said[1].startswith("step 2/4 · measuring chain M γ=4 · ~")
    eta = [float(m.split("~")[1].split(" ")[0]) for m in said]
    # two probes of 6 s and two finalists, then one finalist: within the budget left
    assert eta[0] == round(min(12 + 2 * clock.finalist_s(), clock.left() + clock.finalist_s()))
    assert 0 < eta[1] == round(clock.finalist_s())


def test_every_family_first_the_likeliest_then_the_fastest_modelled():
    def probe(method, label):
        return Probe(method, {}, label)

    queue = [probe("chain", "chain T"), probe("tree", "tree a"), probe("twig", "twig"),
             probe("tabed", "tabed"), probe("eagle3", "eagle3 x"), probe("hidden", "hidden x"),
             probe("tree", "tree b")]
    probed: set[str] = {"chain"}
    order = []
    best = {"chain": 2.0, "tree": 2.5, "twig": 1.2, "tabed": 1.1, "eagle3": 3.0, "hidden": 2.8}
    while queue:
        p = next_probe(queue, probed, best)
        queue.remove(p)
        probed.add(p.method)
        order.append(p.label)
    # the families not probed yet by their declared rank (heads, trees, ensembles, twigs),
    # then what is left by the best modelled so far (tree 2.5 before chain 2.0)
    assert order == ["eagle3 x", "hidden x", "tree a", "tabed", "twig", "tree b", "chain T"]


def test_a_spent_budget_still_probes_every_family_and_ends_soon(tmp_path):
    """--budget 1 on the shipped default profile (its deep target, whose EAGLE-3 head is
    shipped; the suite's tinyworld-caption runs a smaller target): every family the target has (a draft's chain,
    trees and TABED ensembles, the shipped hidden-state and EAGLE-3 heads, the twig) is
    probed once, on one sample; their other variants are listed as skipped; the profile's
    own configuration and the modelled best are decoded for real; the progress counted
    steps; the legend and the winner are printed once each."""
    samples = tmp_path / "s"
    samples.mkdir()
    for name in sorted(p.name for p in IMAGES.glob("*.png"))[:3]:
        (samples / name).write_bytes((IMAGES / name).read_bytes())
    res = CliRunner().invoke(cli, ["calibrate", str(samples), "--budget", "1", "--top", "1",
                                   "-p", str(ROOT / "profiles" / "tinyworld-caption.yaml"),
                                   "--max-new-tokens", "8", "--gammas", "2,4", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    cands = out["candidates"]
    assert {c["method"] for c in cands} == {"chain", "tree", "tabed", "hidden", "eagle3", "twig", "none"}, out["skipped"]
    # the profile's own configuration (its method: the shipped head) on every sample first,
    # then each other family on the one sample the spent budget leaves
    own = load_profile(str(ROOT / "profiles" / "tinyworld-caption.yaml")).method
    assert {c["probe_samples"] for c in cands if c["method"] == own and not c["tree"]} == {3}
    assert all(c["probe_samples"] == 1 for c in cands if c["method"] not in ("none", own))
    assert any(s.endswith("(budget)") for s in out["skipped"])
    measured = [c for c in cands if c["speedup"] is not None and c["method"] != "none"]
    assert len(measured) >= 1 and all(c["mismatches"] == 0 for c in cands)
    assert res.stderr.count("winner: ") == 1 and res.stderr.count("τ: tokens per target pass") == 1
    winner = next(c for c in cands if c["label"] == out["winner"])
    faster = [c for c in measured if c["mismatches"] == 0 and c["speedup"] > (winner["speedup"] or 0)]
    assert not faster or out["note"]      # a faster measured candidate: the note says why


def test_progress_counts_steps(monkeypatch):
    """The progress callback hears "step i/N · … · ~S s left" for every probe and finalist."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.tasks import calibrate as cal
    from vlmspec_cli.tasks.calibrate_io import sample_requests
    from vlmspec_cli.tasks.calibrate_space import own_probe
    from vlmspec_cli.tasks.inputs import expand_inputs

    profile = load_profile("tinyworld-caption", ["generation.max_new_tokens=6", "drafting.length=fixed"])
    chain_t = Probe("chain", {"method": "chain", "drafting.inputs": ["text"]}, "chain T",
                    replay=True, rows=1)
    monkeypatch.setattr(cal, "probes", lambda p, d, **kw: [chain_t, own_probe(p)])
    requests = sample_requests(profile, expand_inputs([str(sorted(IMAGES.glob("*.png"))[0])]))[0]
    said = []
    cal.calibrate(profile, requests, gammas=[2], top=1, budget_s=600, progress=said.append)
    steps = [m for m in said if m.startswith("step ")]
    assert len(steps) >= 3 and all(" s left" in m for m in steps)
    assert [int(m.split()[1].split("/")[0]) for m in steps] == list(range(1, len(steps) + 1))
