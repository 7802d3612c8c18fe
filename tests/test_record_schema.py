"""The record schema: docs/output-record.md's table lists exactly the fields the records of
each command carry (caption, caption --chat, describe-video, generate-image), every record
says ``"schema": SCHEMA``, and an --out file written before ``schema`` existed still
resumes. One short run of each command (CliRunner, shipped examples) feeds every test."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vlmspec_cli.cli import cli
from vlmspec_cli.tasks.records import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TASKS = ("caption", "chat", "video", "image")
NESTED = ("stats", "compare", "videos")   # documented one level down, as stats.x / videos[].x
FAST = ["-q", "--device", "cpu", "--json"]


def readme_fields() -> dict[str, set[str]]:
    """docs/output-record.md's table: field -> the tasks whose records carry it."""
    text = (ROOT / "docs" / "output-record.md").read_text(encoding="utf-8")
    section = text.split("# Output record\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([^`]+)` \|.*\| ([a-z, ]+) \|$", line)
        if m:
            assert m.group(1) not in rows, f"docs/output-record.md lists {m.group(1)} twice"
            rows[m.group(1)] = set(m.group(2).split(", "))
    assert rows, "docs/output-record.md has no field table"
    return rows


def record_fields(record: dict) -> set[str]:
    """A record's fields as docs/output-record.md names them (stats.x, compare.x, videos[].x)."""
    out = set(record)
    for key in NESTED:
        value = record.get(key)
        items = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
        for item in items:
            out |= {f"{key}[].{k}" if isinstance(value, list) else f"{key}.{k}" for k in item}
    return out


def documented(task: str) -> set[str]:
    return {f for f, tasks in readme_fields().items() if task in tasks}


def run(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each command once, tiny: task -> (its records, the caption run's arguments)."""
    d = tmp_path_factory.mktemp("schema")
    images = [shutil.copy(EXAMPLES / "images" / f"scene{i}.png", d) for i in (1, 2)]
    (d / "bad.png").write_bytes(b"not an image\n")
    chat = d / "chat.jsonl"
    chat.write_text(json.dumps({"id": "c", "messages": [
        {"role": "user", "text": "describe the image.", "images": [images[0]]},
        {"role": "assistant", "text": "a red circle."},
        {"role": "user", "text": "what colour is it?"}]}) + "\n")
    caption_args = ["caption", *images, str(d / "bad.png"), "--out", str(d / "caps.jsonl"),
                    "--compare", "--max-new-tokens", "4", *FAST]
    commands = {
        "caption": caption_args,
        "chat": ["caption", "--chat", str(chat), "--max-new-tokens", "4", "--compare", *FAST],
        "video": ["describe-video", str(EXAMPLES / "videos" / "red-circle-left-to-right.mp4"),
                  "--frames", "2", "--max-new-tokens", "4", "--compare", *FAST],
        "image": ["generate-image", "a red circle", "--set", "acceptance=relaxed", "--heatmap",
                  "--compare", "-o", str(d / "png"), *FAST],
    }
    out = {}
    for task, args in commands.items():
        res = run(args)
        assert res.exit_code == (1 if task == "caption" else 0), (task, res.stderr)
        out[task] = records(res.stdout)
    out["caption_args"], out["caps"] = caption_args, d / "caps.jsonl"
    return out


def method_sections(task: str) -> set[str]:
    """The record fields the package's methods declare for ``task`` (drafters/)."""
    from vlmspec_cli.drafters.base import method_class, method_names
    from vlmspec_cli.profile import load_profile

    kind = "caption" if task == "chat" else task
    profile = load_profile({"caption": None, "video": "tinyworld-video",
                            "image": "tinyworld-image"}[kind])
    sections = set()
    for name in method_names():
        method = method_class(name)
        if method.__module__.startswith("vlmspec_cli.") and kind in method.tasks:
            sections |= set(method.record_fields(profile, kind))
    return sections


def optional_fields(task: str) -> set[str]:
    """Fields only some configurations write: the methods' own sections and the optional
    sections of stats."""
    from vlmspec_cli.runtime.stats import SpecStats

    return method_sections(task) | {f"stats.{f.name}" for f in dataclasses.fields(SpecStats)
                                    if f.default is None}


@pytest.mark.parametrize("task", TASKS)
def test_every_record_has_the_schema_and_only_documented_fields(runs, task):
    assert runs[task], f"{task}: no records"
    for record in runs[task]:
        assert record["schema"] == SCHEMA
        undocumented = record_fields(record) - documented(task)
        assert not undocumented, f"{task} record fields missing from docs/output-record.md: {undocumented}"


@pytest.mark.parametrize("task", TASKS)
def test_the_readme_lists_no_field_a_record_does_not_carry(runs, task):
    seen = set().union(*(record_fields(r) for r in runs[task]))
    never = documented(task) - seen - optional_fields(task)
    assert not never, f"docs/output-record.md lists {task} fields its records do not carry: {never}"


def test_stats_rows_are_every_stats_field():
    from vlmspec_cli.runtime.stats import SpecStats

    names = set(SpecStats().to_dict()) | {
        f.name for f in dataclasses.fields(SpecStats) if f.default is None}
    rows = {f.removeprefix("stats.") for f in readme_fields() if f.startswith("stats.")}
    assert rows == names


def test_every_methods_own_section_is_documented():
    for task in TASKS:
        sections = method_sections(task)
        assert not sections - documented(task), (task, sections - documented(task))


def test_records_written_before_the_schema_field_still_resume(runs):
    """An --out file of records without ``schema`` (an older vlmspec) is read as it is:
    its successful inputs are skipped, its bytes kept, the failed input retried."""
    caps: Path = runs["caps"]
    old = [json.loads(line) for line in caps.read_text().splitlines()]
    assert [r["error"] is None for r in old] == [True, True, False]
    for r in old:
        del r["schema"]
    before = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in old)
    caps.write_text(before)
    res = run(runs["caption_args"])
    assert res.exit_code == 1, res.stderr
    assert [r["input"] for r in records(res.stdout)] == [old[2]["input"]]   # only the bad one
    assert "older vlmspec" not in res.stderr
    text = caps.read_text()
    assert text.startswith(before) and records(text[len(before):])[0]["schema"] == SCHEMA
