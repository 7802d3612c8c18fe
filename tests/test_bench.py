"""``vlmspec bench``: methods side by side on an MMSpec-format workload. The plan and the
report's arithmetic without models; the command end to end on the shipped sample
(examples/mmspec/, small --limit and --max-new-tokens) through CliRunner and once as a
subprocess: per-category table, JSON records, PNG, resume, every lossless method identical
to target-only, one stderr line per bad sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from vlmspec_cli.cli import cli
from vlmspec_cli.tasks.bench_report import OVERALL, build_report, percentile
from vlmspec_cli.tasks.records import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "examples" / "mmspec" / "mmspec.jsonl")
FAST = ["--max-new-tokens", "8", "-q"]


def run(args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


# -- without models ----------------------------------------------------------------------------

def test_each_method_gets_what_it_needs_beside_the_profiles_own():
    """Beside the shipped default (its target's hidden-state head): twig takes the twig
    shipped for its deep target, TABED pairs the draft's input with text, chain drafts with
    the profile's draft; every one is checked, and target-only comes first whatever the
    order asked."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.tasks.bench import method_names, method_profiles

    base = load_profile(str(ROOT / "profiles" / "tinyworld-caption.yaml"))
    names = method_names(base, ["twig", "hidden", "tabed", "chain", "twig"])
    assert names == ["none", "twig", "hidden", "tabed", "chain"]
    profiles = method_profiles(base, names)
    assert profiles["hidden"].hidden.model == "zoo:tinyworld/llava-deep-hidden"
    assert profiles["twig"].twig.model == "zoo:tinyworld/llava-deep-twig"
    assert list(profiles["tabed"].drafting.inputs) == ["multimodal", "text"]
    assert profiles["hidden"] == base and profiles["none"].method == "none"
    assert profiles["chain"].method == "chain" and profiles["chain"].draft == base.draft
    ensemble = load_profile(str(ROOT / "profiles" / "tinyworld-tabed.yaml"))    # M, T, C, P
    profiles = method_profiles(ensemble, method_names(ensemble, ["chain", "tree", "tabed"]))
    assert list(profiles["chain"].drafting.inputs) == list(profiles["tree"].drafting.inputs) \
        == ["multimodal"]
    assert profiles["tabed"] == ensemble


def _rec(method, sample, category, wall, tokens, hashes, accepted=0, rounds=None):
    rounds = rounds if rounds is not None else tokens
    return {"method": method, "label": method, "source": f"f#{sample}", "category": category,
            "lossless": True, "error": None, "wall_s": wall, "new_tokens": tokens,
            "turns": [{"latency_s": wall / len(hashes), "tokens_sha256": h} for h in hashes],
            "stats": {"new_tokens": tokens, "num_drafts": rounds, "num_draft_tokens": 2 * rounds,
                      "num_accepted_tokens": accepted, "accepted_per_pos": [accepted, 0],
                      "wall_s": wall}}


def test_report_arithmetic():
    """speedup = Σ target-only wall / Σ method wall over the same samples; MAT = 1 +
    accepted/rounds; identity compares every reply's token hash."""
    recs = [_rec("none", 1, "a", 2.0, 10, ["x"]), _rec("none", 2, "b", 6.0, 30, ["y", "z"]),
            _rec("chain", 1, "a", 1.0, 10, ["x"], accepted=6, rounds=4),
            _rec("chain", 2, "b", 2.0, 30, ["y", "DIFF"], accepted=20, rounds=10)]
    report = build_report(recs, ["none", "chain"], greedy=True, reference="none")
    rows = {(r.category, r.method): r for r in report.rows}
    assert report.categories == ["a", "b"]
    assert rows["a", "chain"].speedup == 2.0 and rows["b", "chain"].speedup == 3.0
    overall = rows[OVERALL, "chain"]
    assert overall.speedup == pytest.approx(8 / 3, abs=1e-4)
    assert overall.mat == pytest.approx(1 + 26 / 14, abs=1e-4)
    assert overall.tokens_per_s == pytest.approx(40 / 3, abs=0.01)
    assert (overall.identical, overall.compared) == (1, 2)
    assert report.mismatches() == [overall]
    assert rows[OVERALL, "none"].identical is None and rows[OVERALL, "none"].mat == 1.0
    assert overall.p50_s == pytest.approx(1.0) and overall.p90_s == pytest.approx(1.0)
    sampled = build_report(recs, ["none", "chain"], greedy=False, reference="none")
    assert not sampled.mismatches() and all(r.identical is None for r in sampled.rows)


def test_percentile():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.9) == 3.0
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile(list(range(11)), 0.9) == pytest.approx(9.0)


def test_bar_chart_is_a_png():
    from vlmspec_cli.plot import Bars, bar_chart_png

    import io
    data = bar_chart_png(["a", "overall"], [Bars("none", [1.0, 1.0], ["MAT 1.00"] * 2),
                                            Bars("chain", [2.5, None], ["MAT 3.10", ""])],
                         title="t", ylabel="speedup", reference=1.0, reference_label="ref")
    img = Image.open(io.BytesIO(data))
    assert img.format == "PNG" and img.width >= 2 * 110
    with pytest.raises(ValueError):
        bar_chart_png([], [])


def test_usage_errors_come_before_any_model_loads(tmp_path, monkeypatch, one_at_a_time):
    monkeypatch.setattr("vlmspec_cli.session.build_session",
                        lambda *a, **k: pytest.fail("loaded a model"))
    res = run([SAMPLE, "--methods", "none,chian"])
    assert res.exit_code == 2 and "unknown method 'chian' (did you mean 'chain'?)" in res.stderr
    res = run([SAMPLE, "--methods", f"none,{one_at_a_time}", "--batch-size", "2"])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1
    assert f"'{one_at_a_time}' decodes one request at a time" in res.stderr
    res = run([SAMPLE, "--categories", "charts"])
    assert res.exit_code == 2 and "no sample of category 'charts'" in res.stderr
    png = tmp_path / "p.png"
    png.write_bytes(b"not mine")
    for force in ([], ["--force"]):   # not "use --force": it would not help
        res = run([SAMPLE, "--plot", str(png), *force])
        assert res.exit_code == 2 and "not a PNG image vlmspec wrote" in res.stderr
        assert "even with --force" in res.stderr and png.read_bytes() == b"not mine"
    res = run([SAMPLE, "--out", SAMPLE])
    assert res.exit_code == 2 and "is also an input" in res.stderr


# -- end to end ----------------------------------------------------------------------------------

def test_methods_side_by_side_json_png_and_resume(tmp_path):
    out, png = tmp_path / "bench.jsonl", tmp_path / "bench.png"
    args = [SAMPLE, "--methods", "none,chain,tree,hidden", "--limit", "6", "--max-new-tokens", "8",
            "--out", str(out), "--plot", str(png)]
    res = run([*args, "--json"])
    assert res.exit_code == 0, res.stderr
    recs = records(res.stdout)
    assert len(recs) == 6 * 4 and all(r["error"] is None for r in recs)
    assert all(r["schema"] == SCHEMA and r["task"] == "bench" for r in recs)   # as every record
    assert {r["category"] for r in recs} == {"general vqa", "text vqa", "image captioning",
                                             "chart understanding", "complex reasoning",
                                             "multi-turn conversation"}
    by = {(r["method"], r["sample"]): r for r in recs}
    for (method, sample), r in by.items():     # lossless: every reply is target-only's
        assert [t["tokens_sha256"] for t in r["turns"]] == \
            [t["tokens_sha256"] for t in by["none", sample]["turns"]], (method, sample)
        assert r["lossless"] and len(r["turns"]) == len(r["prompt"].split("\n"))
    assert by["chain", "tw_006"]["turns"][2]["prompt"] == "what is nine minus five?"
    err = res.stderr
    for text in ("multi-turn conversation", "overall", "6/6", "MAT", "p90 ms"):
        assert text in err
    assert Image.open(png).format == "PNG"
    assert len(out.read_text().splitlines()) == 24
    again = run([*args, "--plot", str(tmp_path / "again.png")])      # resumes: nothing decoded
    assert again.exit_code == 0 and "skipping 24 record(s) (sample, method) already recorded" in again.stderr
    assert "6/6" in again.stderr and len(out.read_text().splitlines()) == 24


@pytest.mark.quick
def test_bad_samples_fail_alone_one_line_each(tmp_path):
    Image.open(ROOT / "examples" / "mmspec" / "images" / "general_vqa" / "tw_001.png").save(
        tmp_path / "ok.png")
    lines = [
        json.dumps({"id": "two", "image": "ok.png", "turns": ["what colour is the square?",
                                                              "where is it?"], "topic": "general vqa"}),
        "this is not json",
        json.dumps({"id": "lost", "image": "missing.png", "turns": ["q"], "topic": "general vqa"}),
        json.dumps({"id": "extra", "image": "ok.png", "turns": ["describe the image."],
                    "topic": "image captioning", "category": "a scene", "answer": "ignored"}),
    ]
    data = tmp_path / "hand.jsonl"
    data.write_text("\n".join(lines) + "\n")
    res = run([str(data), "--methods", "none,chain", "--json", "--max-new-tokens", "8"])
    assert res.exit_code == 1
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 2, res.stderr
    assert f"{data}:2: not valid JSON" in errors[0]
    assert f"{data}:3: image not found: missing.png" in errors[1]
    recs = records(res.stdout)
    good = sorted((r["sample"], r["method"]) for r in recs if r["error"] is None)
    assert good == [("extra", "chain"), ("extra", "none"), ("two", "chain"), ("two", "none")]
    assert sorted(r["line"] for r in recs if r["error"]) == [2, 3]


def test_batches_and_sampling(tmp_path):
    """--batch-size 2 gives every sample its unbatched target-only tokens; at T > 0 identity
    is not claimed."""
    res = run([SAMPLE, "--methods", "none,chain", "--limit", "4", "--batch-size", "2", "--json",
               "--max-new-tokens", "8"])
    assert res.exit_code == 0, res.stderr
    recs = records(res.stdout)
    assert len(recs) == 8 and {r["batch_size"] for r in recs} == {2}
    alone = records(run([SAMPLE, "--methods", "none", "--limit", "4", "--json", *FAST]).stdout)
    hashes = {r["sample"]: [t["tokens_sha256"] for t in r["turns"]] for r in alone}
    assert all([t["tokens_sha256"] for t in r["turns"]] == hashes[r["sample"]] for r in recs)
    res = run([SAMPLE, "--methods", "none,chain", "--limit", "2", "-t", "0.8",
               "--max-new-tokens", "8"])
    assert res.exit_code == 0 and "n/a (T > 0)" in res.stderr


def test_subprocess_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "vlmspec_cli", "bench", SAMPLE, "--limit", "2", "--max-new-tokens",
         "8", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    recs = records(proc.stdout)      # default: the profile's method and target-only
    assert sorted({r["method"] for r in recs}) == ["chain", "none"] and len(recs) == 4
    assert "vlmspec bench" in proc.stderr and "overall" in proc.stderr


def test_a_users_own_head_is_benched_not_the_shipped_one(tmp_path):
    """`vlmspec bench --methods hidden --set hidden.model=HEAD` from a profile whose own
    method is another: HEAD (a copy of the shipped head, so no shipped one by path) is
    what the hidden row decodes with; a shipped head for another target is still replaced."""
    import shutil

    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.runtime.models.loading import resolve_model_source
    from vlmspec_cli.tasks.bench import method_profiles

    head = tmp_path / "my-head"
    shutil.copytree(resolve_model_source("zoo:tinyworld/llava-deep-hidden"), head)
    path = str(ROOT / "profiles" / "tinyworld-caption.yaml")
    base = load_profile(path, ["method=chain", f"hidden.model={head}"])
    assert method_profiles(base, ["none", "hidden"])["hidden"].hidden.model == str(head)
    base = load_profile(path, ["method=chain", "hidden.model=zoo:tinyworld/llava-hidden"])
    assert method_profiles(base, ["none", "hidden"])["hidden"].hidden.model \
        == "zoo:tinyworld/llava-deep-hidden"
