"""What --compare promises, in the summary (issue 36): "whether the outputs are identical"
is a row of the summary table (identical n/N and the mismatches), not only a field of
--json; every task's records name target-only's time the same way; a lossy option (twig
pruning) says "lossless: no (why)" in the summary, as relaxed acceptance does for images."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from vlmspec_cli.cli import cli


# every task's compare section (tasks/jobs.py compare_fields), in this order
COMPARE_FIELDS = ["target_only_wall_s", "target_only_tokens_per_s", "speedup", "identical"]


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _row(stderr: str, name: str) -> str:
    """The value of the summary row ``name`` (the table is drawn with box characters), with
    the lines it wraps onto (their first column empty) joined."""
    lines = stderr.splitlines()
    i = next((i for i, line in enumerate(lines) if name in line), None)
    assert i is not None, f"no '{name}' row in:\n{stderr}"
    value = [lines[i].split(name, 1)[1].strip(" │|")]
    for line in lines[i + 1:]:
        cells = line.strip("│|").split("│")
        if len(cells) != 2 or cells[0].strip():
            break
        value.append(cells[1].strip())
    return " ".join(value)


def _shots(folder, n: int, seed: int):
    for i, (_, image) in enumerate(fresh_scenes(n, seed=seed)):
        image.save(folder / f"s{i}.png")
    return str(folder)


def test_caption_compare_summary_says_whether_outputs_are_identical(tmp_path):
    res = run(["caption", _shots(tmp_path, 2, 77), "--compare", "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert all(r["compare"]["identical"] for r in records)
    assert all(list(r["compare"]) == COMPARE_FIELDS for r in records)
    assert _row(res.stderr, "identical to target-only") == "2/2 (0 mismatches)"
    assert "lossless" not in res.stderr
    # the summary shows target-only's rate beside the method's and says what speedup is
    walls = sum(r["compare"]["target_only_wall_s"] for r in records)
    tokens = sum(r["compare"]["target_only_tokens_per_s"] * r["compare"]["target_only_wall_s"]
                 for r in records)
    assert float(_row(res.stderr, "target-only tokens/s")) == pytest.approx(tokens / walls, abs=0.2)
    assert ("speedup: the target alone's decoding wall time over this method's, the same inputs "
            "decoded in this process") in " ".join(res.stderr.split())


def test_twig_pruning_says_lossless_no_and_its_differences_are_no_mismatches(tmp_path):
    res = run(["caption", _shots(tmp_path, 2, 78), "--profile", "tinyworld-twig", "--compare",
               "--max-new-tokens", "8", "--set", "prune.keep=3", "--set", "prune.final_wipe=6"])
    assert res.exit_code == 0, res.output   # lossy: an output may differ without failing
    assert _row(res.stderr, "lossless") == "no (visual-token pruning)"
    assert _row(res.stderr, "identical to target-only").endswith("(may differ: sampled at T > 0, or lossy)")


def test_image_compare_records_use_caption_names_and_the_summary_row(tmp_path):
    res = run(["generate-image", "a red circle on a blue background", "--compare", "--json",
               "-o", str(tmp_path / "imgs"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    record, = [json.loads(line) for line in res.stdout.splitlines()]
    assert list(record["compare"]) == COMPARE_FIELDS   # the same fields as caption's (schema 1)
    assert record["compare"]["identical"] is True
    assert _row(res.stderr, "identical to target-only") == "1/1 (0 mismatches)"


def test_a_run_where_speculation_did_not_pay_ends_with_one_line_of_advice():
    """Slower than the target alone under --compare, or drafting switched off for every
    round but its probes (drafting.length auto): one line saying so and what to try."""
    from vlmspec_cli.cli.common import speed_advice
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.runtime.stats import length_section
    from vlmspec_cli.tasks.jobs import BatchSummary

    prof = load_profile("tinyworld-caption")
    slow = BatchSummary(compared=1, baseline_wall_s=0.9)
    slow.stats.wall_s = 1.0
    assert speed_advice(prof, slow).startswith(
        "decoding was slower than the target alone (0.90x); `vlmspec calibrate INPUTS -p "
        "tinyworld-caption --write tuned` measures")
    off = BatchSummary()
    off.stats.draft_length = length_section(12, [20, 2], probes=2, rates=None)
    assert speed_advice(prof, off).startswith("drafting did not pay here and was switched off")
    mostly = BatchSummary()   # drafting on in some rounds past its probes, off in most
    mostly.stats.draft_length = length_section(12, [30, 4, 6], probes=3, rates=None)
    assert speed_advice(prof, mostly).startswith(
        "drafting paid too rarely here and was off for 30 of 40 rounds: the target decoded "
        "alone in those; `vlmspec calibrate INPUTS -p tinyworld-caption --write tuned`")
    mostly.compared, mostly.baseline_wall_s, mostly.stats.wall_s = 1, 0.5, 1.0   # both: one line
    assert speed_advice(prof, mostly).startswith(
        "decoding was slower than the target alone (0.50x); drafting paid too rarely here")
    half = BatchSummary()     # off in half the rounds: it paid in the others
    half.stats.draft_length = length_section(12, [20, 4, 16], probes=3, rates=None)
    assert speed_advice(prof, half) is None
    paid = BatchSummary(compared=1, baseline_wall_s=2.0)
    paid.stats.wall_s = 1.0
    paid.stats.draft_length = length_section(12, [3, 0, 0, 9], probes=1, rates=None)
    assert speed_advice(prof, paid) is None


def test_compare_takes_turns_at_decoding_an_input_first(tmp_path, monkeypatch):
    """--compare decodes every other input with the target alone first (tasks/jobs.py
    decode_job): the side that decodes an input first pays what the second finds done, and
    with the method always first target-only read 0.83-0.96x against itself beside busy
    processes. The outputs stay identical whichever side goes first."""
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine

    calls: list[tuple[str, int]] = []   # (side, request's id) in decoding order
    real = SpeculativeEngine.generate

    def spy(self, request, *args, **kwargs):
        side = "target-only" if self.drafter.name == "none" else "method"
        calls.append((side, id(request)))
        return real(self, request, *args, **kwargs)

    monkeypatch.setattr(SpeculativeEngine, "generate", spy)
    res = run(["caption", _shots(tmp_path, 4, 79), "--compare", "--max-new-tokens", "6", "--json"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(records) == 4 and all(r["compare"]["identical"] for r in records)
    timed = calls[2:]   # after the warm-up's two short decodes (method, then target-only)
    assert [side for side, _ in calls[:2]] == ["method", "target-only"]
    pairs = [timed[i:i + 2] for i in range(0, len(timed), 2)]
    assert all(a[1] == b[1] for a, b in pairs)          # both sides decode each input in turn
    assert [a[0] for a, _ in pairs] == ["method", "target-only", "method", "target-only"]
