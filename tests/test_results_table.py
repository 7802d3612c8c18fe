"""bench/RESULTS.md is what bench/results.py writes from the runs bench/runs/current.yaml
lists (stale: fails), every run it lists is committed, the script reads each kind of file
as recorded (a small fixture of every kind, numbers worked by hand), and bench/ holds only
scripts, RESULTS.md, history/ and runs/, with no reference left to a path that moved."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402  (bench/results.py)


def _manifest() -> dict:
    return yaml.safe_load((ROOT / "bench" / "runs" / "current.yaml").read_text(encoding="utf-8"))


def _tracked(*paths: str) -> set[str]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return set(out.splitlines())


def test_results_md_is_what_the_script_writes_from_the_recorded_runs():
    text = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    assert text == results.render(_manifest()), "stale: run python bench/results.py"
    assert results.main(["--check"]) == 0


def test_a_changed_number_or_run_makes_it_stale(tmp_path):
    # the check can fail: RESULTS.md with one number changed, and a run file changed
    stale = tmp_path / "RESULTS.md"
    text = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    first = re.search(r"\| (\d+\.\d\d)x \|", text)     # the first speedup, whatever it is
    changed = f"| {float(first.group(1)) + 0.01:.2f}x |"
    stale.write_text(text[:first.start()] + changed + text[first.end():], encoding="utf-8")
    assert stale.read_text(encoding="utf-8") != text
    assert results.main(["--check", "--out", str(stale)]) == 1
    manifest = _manifest()
    run = next(r for r in manifest["runs"] if r["kind"] == "load")
    data = json.loads((ROOT / run["file"]).read_text(encoding="utf-8"))
    data["rows"][0]["speedup"] += 0.1
    copy = tmp_path / run["file"]
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps(data), encoding="utf-8")
    for other in manifest["runs"]:
        for key in ("file", "wall_from"):
            if other.get(key) and not (tmp_path / other[key]).exists():
                (tmp_path / other[key]).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / other[key], tmp_path / other[key])
    assert results.render(manifest, tmp_path) != text


def test_every_run_it_lists_is_committed_and_says_where_it_came_from():
    manifest = _manifest()
    files = [r[k] for r in manifest["runs"] for k in ("file", "wall_from") if r.get(k)]
    assert files and set(files) <= _tracked(*files), "a listed run that is not committed"
    for run in manifest["runs"]:
        assert run["file"].startswith("bench/runs/") and run["hardware"], run
        data = results.read_file(ROOT / run["file"], run["kind"])
        data = data if isinstance(data, dict) else {}
        has = {"machine": isinstance(data.get("machine"), dict), "command": "command" in data,
               "commit": bool((data.get("machine") or {}).get("commit"))}
        needed = [k for k, there in has.items() if not there]
        if needed:                          # the manifest must say it, and where from
            assert all(run.get(k) for k in needed + ["source"]), (run, needed)
    text = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    for run in manifest["runs"]:
        assert f"]({run['file'].removeprefix('bench/')})" in text, run["file"]


# --- the script's reading, on a fixture of every kind -----------------------------------

def _record(method, source, category, wall, hashes, accepted, rounds):
    return {"method": method, "source": source, "category": category, "label": method,
            "error": None, "wall_s": wall, "temperature": 0.0,
            "turns": [{"tokens_sha256": h} for h in hashes],
            "stats": {"num_accepted_tokens": accepted, "num_drafts": rounds}}


def _fixture(root: Path) -> dict:
    runs = root / "bench" / "runs" / "d"
    runs.mkdir(parents=True)
    load = {"machine": {"cpus": 2, "cpu": "TestCPU", "torch": "9.9", "commit": "abc1234"},
            "command": "python bench/load.py --rows demo", "note": "",
            "rows": [{"workload": "demo", "variant": "default", "method": "hidden", "gamma": 12,
                      "draft_length": "auto", "competitors": 0, "speedup": 3.0645,
                      "ci95": [2.8758, 3.2804], "passes": 3, "inputs": 18, "identical": 18,
                      "mean_acceptance_length": 5.028, "loadavg_before": [0.37, 1.5, 2.0]}]}
    (runs / "load.json").write_text(json.dumps(load))
    records = [  # two samples in two categories; the second's chain differs in its 2nd reply
        _record("none", "s1", "a", 1.0, ["x"], 0, 10),
        _record("chain", "s1", "a", 0.5, ["x"], 10, 5),
        _record("none", "s2", "b", 3.0, ["y", "z"], 0, 20),
        _record("chain", "s2", "b", 1.0, ["y", "Z"], 6, 4),
        dict(_record("chain", "s3", "b", 0.1, ["q"], 1, 1), error="boom"),   # failed: left out
    ]
    (runs / "bench.json").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    calibrate = {"winner": "chain γ=5", "skipped": [], "candidates": [
        {"method": "chain", "label": "chain γ=5", "tau": 3.5, "speedup": 2.5,
         "speedup_min": 2.0, "speedup_median": 2.4, "speedup_max": 3.1, "predicted": 2.6,
         "mismatches": 0},
        {"method": "chain", "label": "chain γ=3", "tau": None, "speedup": None,
         "predicted": 2.1},
        {"method": "none", "label": "none", "tau": 1.0, "speedup": 1.0, "predicted": 1.0}]}
    (runs / "calibrate.json").write_text(json.dumps(calibrate))
    (runs / "calibrate.txt").write_text("winner: chain γ=5\nwall 12.50 s\n")
    tests = [{"test": "chain: speculative", "vs": "target-only", "equal": True},
             {"test": "chain: speculative", "vs": "target-only", "equal": False},
             {"test": "chi2 chain", "passed": True}, {"test": "cuda graphs", "wall_s": 1}]
    (runs / "tests.jsonl").write_text("\n".join(json.dumps(t) for t in tests) + "\n")
    folder = {"machine": {"hardware": "TestCPU (2 CPUs)", "torch": "9.9", "threads": 1,
                          "load_average": [4.5, 4.0, 3.0]},
              "args": {"max_new_tokens": 48, "passes": 2}, "inputs": ["a.png", "b.png"],
              "rows": [{"row": "target-only B=8", "method": "target-only", "batch_size": 8,
                        "vs_target_only": 1.0, "mismatches": 0, "tokens_per_s": 100.0},
                       {"row": "chain γ=5 B=8", "method": "chain", "batch_size": 8,
                        "vs_target_only": 1.149, "tau": 2.96, "mismatches": 0,
                        "tokens_per_s": 118.7},
                       {"row": "hidden γ=5 B=8", "method": "hidden", "batch_size": 8,
                        "vs_target_only": 1.29, "tau": 3.66, "mismatches": 1,
                        "tokens_per_s": 133.3}]}
    (runs / "folder.json").write_text(json.dumps(folder))
    useless = {"machine": {"cpus": 2, "cpu": "TestCPU", "torch": "9.9", "commit": "abc1234"},
               "command": "python bench/useless_drafts.py --control", "rows": [
                   {"row": "llava15-7b", "competitors": 2, "speedup": 0.9647, "passes": 3,
                    "inputs": 18, "identical": 18, "loadavg_before": [2.1, 1.0, 1.0],
                    "first_request_speedup": [0.9716, 0.9855, 1.02],
                    "over_control": {"ratio": 0.9674, "ci95": [0.93, 1.0123]}},
                   {"row": "llava15-7b (control)", "competitors": 2, "speedup": 0.9972,
                    "passes": 3, "inputs": 18, "identical": 18,
                    "loadavg_before": [2.1, 1.0, 1.0]}]}
    (runs / "useless.json").write_text(json.dumps(useless))
    (runs / "paired.txt").write_text("target-only  wall   48.24 s  speedup 1.00x  rounds  2304  "
                                     "identical 36/36\nadt fixed    wall   16.03 s  speedup "
                                     "3.01x  rounds   381  identical 36/35\nnoise\n")
    given = {"commit": "def5678", "command": "the command", "machine": "the machine",
             "source": "by hand"}
    return {"workloads": {"demo": "the demo", "mmspec": "questions", "calibrate": "calibrate"},
            "runs": [{"file": "bench/runs/d/load.json", "kind": "load", "hardware": "CPU"},
                     {"file": "bench/runs/d/bench.json", "kind": "bench", "hardware": "CPU",
                      **given},
                     {"file": "bench/runs/d/calibrate.json", "kind": "calibrate",
                      "hardware": "CPU", "wall_from": "bench/runs/d/calibrate.txt", **given},
                     {"file": "bench/runs/d/paired.txt", "kind": "paired", "hardware": "CPU",
                      "workload": "image", **given},
                     {"file": "bench/runs/d/folder.json", "kind": "folder", "hardware": "CPU",
                      "methods": ["hidden"], **given},
                     {"file": "bench/runs/d/useless.json", "kind": "useless", "hardware": "CPU"},
                     {"file": "bench/runs/d/tests.jsonl", "kind": "gpu-tests", "hardware": "GPU",
                      **given}]}


def _rows(text: str, title: str) -> list[list[str]]:
    block = text.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split(" | ")]
            for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_each_kind_of_run_is_read_as_recorded(tmp_path):
    manifest = _fixture(tmp_path)
    text = results.render(manifest, tmp_path)
    assert text.index("## CPU") < text.index("## GPU")
    [load] = _rows(text, "the demo — `hidden`, γ auto ≤ 12")
    assert load[:6] == ["0", "3.06x", "2.88-3.28", "3 × 6", "5.03", "18/18"]
    assert load[6:] == ["`abc1234`", "2 CPUs TestCPU, torch 9.9, load avg 0.37",
                        "`python bench/load.py --rows demo`",
                        "[bench/runs/d/load.json](runs/d/load.json)"]
    # Σ none wall / Σ chain wall; MAT 1 + Σ accepted / Σ rounds; identical: every reply
    a, b, overall = _rows(text, "questions — `chain`, chain")
    assert a[:5] == ["a", "1", "2.00x", "3.00", "1/1"]
    assert b[:5] == ["b", "1", "3.00x", "2.50", "0/1"]
    assert overall[:5] == ["overall", "2", f"{4.0 / 1.5:.2f}x", f"{1 + 16 / 9:.2f}", "1/2"]
    assert overall[5:] == ["`def5678`", "the machine", "`the command`",
                           "[bench/runs/d/bench.json](runs/d/bench.json)"]
    [cal] = _rows(text, "calibrate")              # only what was decoded for real
    assert cal[:5] == ["chain γ=5", "3.50", "2.50x (2.00-2.40-3.10)", "2.60x", "0"]
    assert "winner: chain γ=5; 1 more candidates modelled only" in text
    assert "12.50 s wall (`bench/runs/d/calibrate.txt`)" in text
    [hidden] = _rows(text, "folder: 2 inputs, ≤ 48 new tokens, 2 passes — `hidden`")
    assert hidden[:7] == ["hidden γ=5 B=8", "8", "1.29x", "3.66", "1", "133.3", "`def5678`"]
    assert hidden[7] == "TestCPU (2 CPUs), torch 9.9, 1 thread(s), load avg 4.50"
    assert "new tokens, 2 passes — `chain`" not in text     # not among the run's methods
    [adt] = _rows(text, "image — `adt`")       # target-only's line is the reference
    assert adt[:5] == ["fixed", "16.03", "3.01x", "381", "36/35"]
    [useless] = _rows(text, "useless")     # the A/A control folded into "÷ control"
    assert useless == ["llava15-7b", "2", "0.96x", "0.97 (0.93-1.01)", "0.97x, 0.99x, 1.02x",
                       "3 × 6", "18/18", "`abc1234`", "2 CPUs TestCPU, torch 9.9, load avg 2.10",
                       "`python bench/useless_drafts.py --control`",
                       "[bench/runs/d/useless.json](runs/d/useless.json)"]
    tests = _rows(text, "gpu tests")
    assert [t[:3] for t in tests] == [["chain: speculative", "target-only", "1/2"],
                                      ["chi2 chain", "(χ² test passed)", "1/1"]]
    assert "| `bench/runs/d/bench.json` | bench | in the file | by hand |" in text


def test_an_unknown_kind_is_refused(tmp_path):
    manifest = _fixture(tmp_path)
    manifest["runs"][0]["kind"] = "lod"
    with pytest.raises(ValueError, match="unknown kind 'lod'"):
        results.render(manifest, tmp_path)


# --- bench/ itself ----------------------------------------------------------------------

def test_bench_holds_scripts_results_history_and_runs_only():
    top = {p.split("/")[1] for p in _tracked("bench") if p.count("/") >= 1}
    loose = sorted(n for n in top if not (n.endswith((".py", ".sh")) or n in
                                          {"RESULTS.md", "README.md", "history", "runs"}))
    assert not loose, f"raw outputs belong in bench/runs/<date>/: {loose}"


def test_every_moved_path_is_where_the_map_says():
    rows = (ROOT / "bench" / "history" / "moved-paths.tsv").read_text().splitlines()[1:]
    assert len(rows) > 300
    for row in rows:
        old, new = row.split("\t")
        assert (ROOT / new).exists(), row
        assert old == "bench/RESULTS.md" or not (ROOT / old).exists(), row   # it is new


# a recorded file named in prose: bench/… with one of these endings, or a bench/runs/ folder
NAMED = re.compile(r"bench/[\w./-]*?(?:\.(?:json|jsonl|txt|err|md|png|yaml|tsv|log)\b|"
                   r"runs/\d{4}-\d\d-\d\d/[\w.-]+/?)")
WHERE = ("README.md", "ARCHITECTURE.md", "docs", "profiles", "scripts", "tests", "vlmspec_cli",
         "bench")


def test_no_reference_to_a_recorded_file_that_is_not_there():
    """Outside the dated log and the raw runs themselves (which keep the paths of their
    day), every recorded file named in prose or code is there (this file's fixture aside)."""
    missing = []
    for top in WHERE:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            rel = path.relative_to(ROOT).as_posix()
            if (not path.is_file() or path.suffix not in {".py", ".md", ".yaml", ".sh"}
                    or rel == "tests/test_results_table.py"
                    or rel.startswith("bench/history/")
                    or rel.startswith("bench/runs/") and not rel.endswith("/README.md")):
                continue
            for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                missing += [f"{rel}:{line_no}: {m.group(0)}" for m in NAMED.finditer(line)
                            if line[m.end():m.end() + 1] not in ("{", "*")    # a pattern
                            and not (ROOT / m.group(0).rstrip("./")).exists()]
    assert not missing, "\n".join(missing)
