"""A drafting method is one file: this module adds one (``repeat``: it proposes the last
token again, γ times) and nothing else in the package knows of it; caption (with
--compare), calibrate and profile then run it, and it decodes exactly what the target
alone decodes (ARCHITECTURE.md, "Adding things")."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import ROOT
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import base
from vlmspec_cli.drafters.base import DraftingMethod, register
from vlmspec_cli.runtime.round.draft import Draft
from vlmspec_cli.runtime.round.verify import point_mass

# `vlmspec profile` timed briefly on one thread (the thread search has its own test)
QUICK = ("--repeats", "3", "--threads", "1")


class RepeatLastToken(DraftingMethod):
    """Proposes the last generated token γ times (the first token of a reply: token 0)."""

    tasks = ("caption", "video")
    uses_draft = False
    help = "a toy: the last token again"

    def __init__(self, vocab_size: int = 0, sampling=None) -> None:
        self.vocab_size = vocab_size
        self.sampling = sampling

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "RepeatLastToken":
        return cls(target.vocab_size, sampling)

    @classmethod
    def drafting_inputs(cls, profile) -> list[str]:
        return []

    @classmethod
    def own_probe(cls, profile):
        return True, 0, None

    def propose(self, state, budget: int) -> Draft:
        tokens = [state.tokens[-1] if state.tokens else 0] * budget
        # at T > 0 its q is a point mass on what it proposes (verify.py point_mass)
        probs = None if self.sampling.greedy else point_mass(tokens, self.vocab_size)
        return Draft(tokens, probs)


IMAGES = ROOT / "examples" / "images"


@pytest.fixture(autouse=True, scope="module")
def registered():
    """``@register("repeat")`` as its module would say it, for this module's tests only
    (the rest of the suite sees the shipped methods)."""
    register("repeat")(RepeatLastToken)
    yield
    del base._REGISTRY["repeat"]


def _run(*args: str) -> CliRunner:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_the_toy_method_captions_losslessly(temperature):
    images = sorted(IMAGES.glob("*.png"))[:2]
    common = ["caption", *map(str, images), "--max-new-tokens", "24", "--json", "-q",
              "--temperature", temperature, "--seed", "3"]
    toy = [json.loads(line) for line in _run(*common, "-m", "repeat", "--compare").stdout.splitlines()]
    alone = [json.loads(line) for line in _run(*common, "-m", "none").stdout.splitlines()]
    if temperature == "0":   # at T > 0 the distributions are equal, not each sample
        assert [r["output"] for r in toy] == [r["output"] for r in alone]
    assert all(r["method"] == "repeat" and r["lossless"] and r["drafting_inputs"] == [] for r in toy)
    gamma = toy[0]["gamma"]
    assert gamma == toy[0]["settings"].get("gamma", gamma) and gamma >= 1
    assert sum(r["stats"]["num_draft_tokens"] for r in toy) > 0   # it did draft
    help_text = _run("caption", "--help").stdout
    assert "repeat (a toy: the last token again)" in " ".join(help_text.split())


def test_the_toy_method_calibrates_and_profiles(tmp_path):
    sample = sorted(IMAGES.glob("*.png"))[0]
    res = _run("calibrate", str(sample), "--set", "method=repeat", "--gammas", "2", "--budget", "1",
               "--max-new-tokens", "12", "--top", "1", "--margin", "100", "--json", "-q")
    out = json.loads(res.stdout)
    own = [c for c in out["candidates"] if c["method"] == "repeat"]
    assert own and all(c["mismatches"] == 0 for c in own)
    res = _run("profile", "--set", "method=repeat", *QUICK, "--warmup", "0",
               "--contexts", "32", "--json", "-q")
    rounds = json.loads(res.stdout)["measurements"]["rounds"]
    assert rounds["method"] == "repeat" and rounds["rounds_drafting"] > 0


def test_the_toy_method_benches_beside_the_shipped_ones():
    """vlmspec bench runs it next to chain from the default profile (written for chain), on
    the shipped MMSpec-format sample, and every reply equals target-only's."""
    res = _run("bench", str(ROOT / "examples" / "mmspec" / "mmspec.jsonl"), "--methods",
               "repeat,chain", "--limit", "2", "--max-new-tokens", "8", "--json", "-q")
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    assert sorted({r["method"] for r in recs}) == ["chain", "none", "repeat"]
    ref = {r["sample"]: [t["tokens_sha256"] for t in r["turns"]] for r in recs if r["method"] == "none"}
    assert all([t["tokens_sha256"] for t in r["turns"]] == ref[r["sample"]] for r in recs)
