"""What a model family cannot draft is refused before anything loads, and calibrate skips
it: a tiny random-weight Qwen2.5-VL pair (3-D positions: its draft reads an image through
its own inputs, one drafting input at a time), saved with save_pretrained and loaded by
path. Issue 36: `calibrate` crashed with a traceback on such a profile (its TABED MT*
probe), and `caption -m tabed --inputs M,T` failed only once decoding started."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from PIL import Image

from families import qwen2_5_vl
from vlmspec_cli.cli import cli


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-pair")
    target, draft = qwen2_5_vl(root / "target", seed=1), qwen2_5_vl(root / "draft", seed=2, layers=1)
    shots = root / "shots"
    shots.mkdir()
    Image.new("RGB", (40, 24), (200, 30, 30)).save(shots / "a.png")
    Image.new("RGB", (32, 56), (20, 160, 60)).save(shots / "b.png")
    return target, draft, shots


def _sets(target, draft) -> list[str]:
    return ["--set", f"target.model={target}", "--set", f"draft.model={draft}"]


def _no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")
    for module in ("vlmspec_cli.session", "vlmspec_cli.drafters.draft_model"):
        monkeypatch.setattr(f"{module}.load_model", refuse)


@pytest.mark.parametrize("inputs,why", [("M,T", "one drafting input at a time"),
                                        ("P", "not as embeddings")])
def test_caption_refuses_what_the_family_cannot_draft_before_loading(pair, monkeypatch, inputs, why):
    target, draft, shots = pair
    _no_loading(monkeypatch)
    method = "tabed" if "," in inputs else "chain"
    res = CliRunner().invoke(cli, ["caption", str(shots), "-m", method, "--inputs", inputs, "-q",
                                   *_sets(target, draft)], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and why in lines[0], res.stderr
    assert "3-D positions" in lines[0] and str(draft) in lines[0]


def test_calibrate_skips_what_the_family_refuses(pair):
    """No traceback: the TABED ensembles and chain P are listed as not tried, with the
    reason; so are batch sizes where the winner batches (the Qwen target decodes one
    request at a time)."""
    target, draft, shots = pair
    res = CliRunner().invoke(cli, ["calibrate", str(shots), *_sets(target, draft), "--json",
                                   "--gammas", "2", "--top", "1", "--budget", "60",
                                   "--max-new-tokens", "4"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    skipped = "; ".join(out["skipped"])
    assert "tabed MT*" in skipped and "one drafting input at a time" in skipped, skipped
    assert "chain P" in skipped and "not as embeddings" in skipped, skipped
    assert not any(c["method"] == "tabed" for c in out["candidates"])
    assert "not tried: " in res.stderr and "tabed MT*" in res.stderr
