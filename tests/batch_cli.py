"""The CLI side of the batch tests: a folder of fresh scenes captioned at --batch-size 3
(with --compare) and at 1 by the same arguments must give the same records, and --out at
--batch-size 3 must resume. One helper for every method's batch file (test_batch_trees,
test_batch_heads, test_batch_twig), which each add their own checks on the records."""

from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import fresh_scenes
from vlmspec_cli.cli import cli


def records(result) -> dict[str, dict]:
    """--json's records of a run, by input."""
    return {r["input"]: r for r in map(json.loads, result.stdout.splitlines())}


def batch_equals_alone(tmp_path, args: list[str]) -> tuple[dict, dict]:
    """``caption FOLDER *args --json -q --max-new-tokens 20`` over 4 fresh scenes, alone and
    at --batch-size 3 with --compare: every output the same, identical to target-only, the
    records' fields the same (``compare`` added). Then --out at --batch-size 3 twice: the
    second run resumes and writes nothing. Returns the two runs' records (alone, batched)."""
    for i, (_, image) in enumerate(fresh_scenes(4, seed=91)):
        image.save(tmp_path / f"s{i}.png")
    args = ["caption", str(tmp_path), *args, "--json", "-q", "--max-new-tokens", "20"]
    runner = CliRunner()
    one = runner.invoke(cli, args)
    many = runner.invoke(cli, args + ["--batch-size", "3", "--compare"])
    assert one.exit_code == 0 and many.exit_code == 0, many.output
    a, b = records(one), records(many)
    assert set(a) == set(b) and len(a) == 4
    assert all(a[k]["output"] == b[k]["output"] for k in a)
    assert all(r["compare"]["identical"] for r in b.values())
    assert all(set(a[k]) == set(b[k]) - {"compare"} for k in a)
    out = tmp_path / "caps.jsonl"
    first = runner.invoke(cli, args + ["--batch-size", "3", "--out", str(out)])
    again = runner.invoke(cli, args + ["--batch-size", "3", "--out", str(out)])
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert len(out.read_text().splitlines()) == 4      # the second run resumed: nothing new
    return a, b
