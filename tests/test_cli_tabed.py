"""`vlmspec caption` with ensembles, --trace and --chat conversation files (issue 3)."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from conftest import fresh_scenes
from vlmspec_cli.cli import cli

FAST = ["--max-new-tokens", "10", "-q"]


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_tabed_records_weights_and_trace(tmp_path):
    image = tmp_path / "a.png"
    fresh_scenes(1, seed=77)[0][1].save(image)
    trace = tmp_path / "trace.jsonl"
    res = run(["caption", str(image), "--method", "tabed", "--inputs", "M,T,P", "--json",
               "--trace", str(trace), "--set", "ensemble.window=4", *FAST])
    assert res.exit_code == 0, res.output
    (rec,) = records(res.output)
    assert rec["method"] == "tabed" and rec["drafting_inputs"] == ["multimodal", "text", "pooled"]
    assert rec["lossless"] is True
    ens = rec["stats"]["ensemble"]
    assert ens["inputs"] == ["multimodal", "text", "pooled"] and ens["policy"] == "grid"
    # a weight vector per drafted block (the first may come from the prefill's token); the
    # auto draft length may decode plain rounds on a busy machine (no block, no weights),
    # which num_drafts counts too: compare with the rounds that drafted
    drafted = rec["stats"]["draft_length"]["rounds_drafted"]
    assert drafted >= 1 and drafted - 1 <= len(ens["block_weights"]) <= drafted, rec["stats"]
    blocks = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [b["weights"] for b in blocks] == ens["block_weights"]
    assert all(b["request"] == str(image) for b in blocks)


def test_subprocess_tabed_with_one_input_equals_target(tmp_path):
    """`--method tabed --inputs M` (one member, T=0, grid weights) decodes like chain: every
    input done, identical to the target alone."""
    image = tmp_path / "a.png"
    fresh_scenes(1, seed=78)[0][1].save(image)
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(image), "--method",
                           "tabed", "--inputs", "M", "--compare", "--json", "--device", "cpu", *FAST],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(proc.stdout)
    assert rec["error"] is None and rec["compare"]["identical"] is True and rec["output"]


def test_chain_rejects_several_inputs():
    res = run(["caption", "x.png", "--method", "chain", "--inputs", "multimodal,text", "--dry-run"])
    assert res.exit_code == 2 and "use method 'tabed'" in res.output


def test_unknown_input_letter_names_choices():
    res = run(["caption", "x.png", "--inputs", "multimodal,pixels", "--dry-run"])
    assert res.exit_code == 2 and "pixels" in res.output and "multimodal, text, caption, pooled" in res.output


def test_chat_file_good_and_bad_lines(tmp_path):
    scenes = fresh_scenes(2, seed=78)
    for i, (_, im) in enumerate(scenes):
        im.save(tmp_path / f"s{i}.png")
    lines = [
        {"id": "first", "messages": [{"role": "user", "text": "describe the image.", "images": ["s0.png"]}]},
        {"id": "followup", "messages": [
            {"role": "user", "text": "describe the image.", "images": ["s1.png"]},
            {"role": "assistant", "text": "a red circle on the left, on a gray background."},
            {"role": "user", "text": "what colour was the background?"}]},
        {"id": "lost", "messages": [{"role": "user", "text": "describe the image.", "images": ["gone.png"]}]},
        {"id": "mute", "messages": [{"role": "user", "images": ["s0.png"]}]},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"id": "broken", "messages": [\n'
    chat = tmp_path / "chat.jsonl"
    chat.write_text(text)
    out = tmp_path / "out.jsonl"
    res = run(["caption", "--chat", str(chat), "--method", "tabed", "--inputs", "M,T", "--json",
               "--out", str(out), *FAST])
    assert res.exit_code == 1
    recs = {r["input"].split("#")[-1].split(":")[-1]: r for r in records(res.output)}
    assert recs["first"]["error"] is None and recs["first"]["output"]
    assert recs["followup"]["error"] is None and recs["followup"]["prompt"] == "what colour was the background?"
    assert "gone.png" in recs["lost"]["error"] and "line 3" in recs["lost"]["error"]
    assert "has no text" in recs["4"]["error"] and recs["4"]["input"].endswith("chat.jsonl:4")
    assert "not valid JSON" in recs["5"]["error"]
    # stderr names the file and line for each bad one
    assert "chat.jsonl:4" in res.output and "chat.jsonl:5" in res.output
    # a rerun resumes: the two good conversations are skipped, the bad ones retried
    again = run(["caption", "--chat", str(chat), "--method", "tabed", "--inputs", "M,T", "--json",
                 "--out", str(out), *FAST])
    assert {r["input"].split("#")[-1] for r in records(again.output)} >= {"lost"}
    assert not any(r["input"].endswith("#first") for r in records(again.output))


def test_chat_and_inputs_are_exclusive(tmp_path):
    res = run(["caption", "a.png", "--chat", str(tmp_path / "c.jsonl")])
    assert res.exit_code == 2 and "not both" in res.output


def test_missing_chat_file_is_named(tmp_path):
    res = run(["caption", "--chat", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 2 and "nope.jsonl" in res.output


def test_compare_warms_both_sides_up_without_handing_out_captions(tmp_path):
    """--compare decodes a short untimed request on both sides first, skipping an input
    that does not load; the captions it made are forgotten, so the first timed request
    still captions its image (its caption time is its own) and the bad input is reported
    once, in its place."""
    image = tmp_path / "a.png"
    fresh_scenes(1, seed=78)[0][1].save(image)
    missing = tmp_path / "missing.png"
    res = run(["caption", str(missing), str(image), "-p", "tinyworld-tabed", "--compare", "--json",
               *FAST])
    assert res.exit_code == 1
    bad, good = records(res.stdout)
    assert bad["error"] and res.stderr.count("missing.png") == 1
    assert good["compare"]["identical"] and good["stats"]["caption_s"] > 0
