"""``--batch-size auto`` (tasks/batch_auto.py): the batch size measured on the folder's
first inputs, bounded by the memory at hand; outputs equal B = 1's; a session that decodes
one request at a time falls back to 1 with one line instead of failing."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import ProfileError, load_profile
from vlmspec_cli.session import build_session
from vlmspec_cli.tasks import batch_auto
from vlmspec_cli.tasks.batch_auto import GROWTH, choose_batch_size, grow
from vlmspec_cli.tasks.caption import CAPTION, image_jobs
from vlmspec_cli.tasks.inputs import expand_inputs


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    for i, (_, image) in enumerate(fresh_scenes(5, seed=77)):
        image.save(root / f"s{i}.png")
    (root / "empty.png").write_bytes(b"")
    return root


def test_b_doubles_while_it_gains_and_stops_at_the_memory_limit():
    seen = []

    def measure(rates):
        return lambda b: seen.append(b) or rates[b]

    # 2 gains 80%, 4 gains 2.8% (< 5%): 2, and 8 is never measured
    assert grow(measure({1: 100.0, 2: 180.0, 4: 185.0}), 64) == (2, {1: 100.0, 2: 180.0,
                                                                     4: 185.0})
    assert seen == [1, 2, 4]
    # every doubling gains: up to the limit, the limit itself where it is no power of two
    rates = {1: 10.0, 2: 20.0, 4: 40.0, 6: 60.0}
    assert grow(measure(rates), 6)[0] == 6
    # a gain just under GROWTH stops it
    assert grow(measure({1: 100.0, 2: 100.0 * GROWTH - 0.01}), 8)[0] == 1
    assert grow(measure({1: 100.0}), 1) == (1, {1: 100.0})


def test_auto_picks_a_b_within_the_memory_budget(folder, monkeypatch):
    profile = load_profile("tinyworld-caption", cli={"generation.batch_size": "auto",
                                                     "generation.max_new_tokens": 12})
    session = build_session(profile)
    jobs = image_jobs(expand_inputs([str(folder)]), profile.generation.prompt)
    make = lambda job: CAPTION.request(session, job)   # noqa: E731
    choice = choose_batch_size(session, make, jobs)
    assert choice.alone is None and 1 in choice.rates and choice.rows in choice.rates
    assert 1 <= choice.rows <= 5                   # five inputs load (empty.png does not)
    assert choice.per_row > 0 and choice.rows * choice.per_row <= choice.budget
    assert f"batch {choice.rows} (auto" in choice.label()
    # memory for two rows only: B is never measured past 2
    monkeypatch.setattr(batch_auto, "free_memory",
                        lambda device: int(2.5 * choice.per_row / batch_auto.BUDGET_SHARE))
    small = choose_batch_size(session, make, jobs)
    assert max(small.rates) <= 2 and small.rows <= 2


def _records(result):
    return {r["input"]: r for r in map(json.loads, result.stdout.splitlines())}


def test_cli_auto_equals_batch_size_one_and_says_its_b(folder):
    args = ["caption", str(folder), "--json", "--max-new-tokens", "16"]
    runner = CliRunner()
    one = runner.invoke(cli, args + ["-q"])
    auto = runner.invoke(cli, args + ["--batch-size", "auto"])
    assert one.exit_code == 1 and auto.exit_code == 1, auto.output   # empty.png fails
    a, b = _records(one), _records(auto)
    assert set(a) == set(b) and len(a) == 6
    for key in a:
        assert a[key]["output"] == b[key]["output"] and a[key]["error"] == b[key]["error"]
    line = next(x for x in auto.stderr.splitlines() if "(auto;" in x)
    assert "tokens/s at B 1:" in line and "budget" in line


def test_a_method_that_decodes_alone_falls_back_to_one_with_one_line(folder, one_at_a_time):
    res = CliRunner().invoke(cli, ["caption", str(folder / "s0.png"), "--json", "--method",
                                   one_at_a_time, "--batch-size", "auto", "--max-new-tokens", "8"])
    assert res.exit_code == 0, res.output
    said = [x for x in res.stderr.splitlines() if "--batch-size auto" in x]
    assert said == [f"--batch-size auto: method '{one_at_a_time}' decodes one request at a "
                    "time; decoding at batch size 1"]
    assert len(_records(res)) == 1


def test_profile_key_and_option_take_a_count_or_auto(folder):
    p = load_profile("tinyworld-caption", ["generation.batch_size=auto"])
    assert p.generation.batch_size == "auto" and p.generation.rows == 1
    assert load_profile("tinyworld-caption", ["generation.batch_size=3"]).generation.rows == 3
    for bad in ("0", "many"):
        with pytest.raises(ProfileError, match="generation.batch_size"):
            load_profile("tinyworld-caption", [f"generation.batch_size={bad}"])
    dry = CliRunner().invoke(cli, ["caption", str(folder), "--batch-size", "auto", "--dry-run"])
    assert dry.exit_code == 0 and "batch_size: auto" in dry.output
    bad = CliRunner().invoke(cli, ["caption", str(folder), "--batch-size", "many"])
    assert bad.exit_code == 2 and "integer or auto" in bad.output
