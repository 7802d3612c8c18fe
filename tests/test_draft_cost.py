"""runtime/length/draft_cost.py: a draft that cannot pay, known before it runs (a CPU, a float draft
doing as many multiply-adds per token as the target), and AutoGamma.rule_out; as a user
sees it, the default profile with its target as the draft."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from vlmspec_cli.runtime.length.draft_cost import cannot_pay, multiply_adds
from vlmspec_cli.runtime.length.draft_length import AutoGamma


def _config(**over):
    text = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, vocab_size=100) | over
    return SimpleNamespace(text_config=SimpleNamespace(**text))


def _lm(config, device="cpu", dtype=torch.float32, quantized=False):
    model = SimpleNamespace(config=config, hf_quantizer=object() if quantized else None)
    return SimpleNamespace(model=model, device=torch.device(device), dtype=dtype)


def test_multiply_adds_by_hand():
    # head_dim 16: q and o 64·64 each, k and v 64·32 each = 12288; MLP 3·64·128 = 24576;
    # two layers, and the head 64·100
    assert multiply_adds(_config()) == 2 * (12288 + 24576) + 6400
    assert multiply_adds(SimpleNamespace(hidden_size=64)) is None   # not a decoder's config
    assert multiply_adds(_config(num_attention_heads=0)) is None     # broken: no division by 0
    assert multiply_adds(_config(hidden_size="wide")) is None


def test_the_target_as_its_own_draft_cannot_pay_on_a_cpu_only():
    target = _lm(_config())
    reason = cannot_pay(target, _lm(_config()))
    assert reason == "1x the target's multiply-adds per token: cannot pay on a CPU"
    assert cannot_pay(target, _lm(_config(num_hidden_layers=3))) is not None   # larger still
    # a GPU; a smaller draft; a narrower dtype; a quantized draft (bitsandbytes' fused 4-bit
    # kernel reads an eighth of the bytes: measured instead) or target: not ruled out
    assert cannot_pay(_lm(_config(), "cuda"), _lm(_config(), "cuda")) is None
    assert cannot_pay(target, _lm(_config(num_hidden_layers=1))) is None
    # one layer as wide as two of the target's: as much arithmetic, half the operators
    assert cannot_pay(target, _lm(_config(num_hidden_layers=1, intermediate_size=400))) is None
    assert cannot_pay(target, _lm(_config(), dtype=torch.bfloat16)) is None
    assert cannot_pay(target, _lm(_config(), quantized=True)) is None
    assert cannot_pay(_lm(_config(), quantized=True), _lm(_config(), quantized=True)) is None
    assert cannot_pay(target, None) is None


def test_ruled_out_drafting_stays_off_and_says_why():
    policy = AutoGamma(5)
    policy.rule_out("too dear")
    state = SimpleNamespace(length=None, tokens=[], draft_deferred=False,
                            stats=SimpleNamespace(draft_length=None))
    policy.start(state)
    assert policy.off and not policy.measures_prefill   # its prefill never runs
    for _ in range(200):                                # no probe, ever
        assert policy.choose(state, 5) == 0
        policy.observe(state, 0, levels=0, fed=1, drafted=0, accepted=0, draft_s=0.0,
                       verify_s=0.01)
    policy.finish(state)
    section = state.stats.draft_length
    assert section["rounds_drafted"] == 0 and section["rounds_plain"] == 200
    assert section["off_reason"] == "too dear"


def test_the_target_drafting_for_itself_decodes_alone_and_the_summary_says_why():
    """The default profile with its own target as the draft (auto, on a CPU): no round
    drafts, the draft is never prefilled, the outputs are target-only's, and the record
    and the summary table name the reason (acceptance rows left out: nothing drafted)."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "vlmspec_cli", "caption", "examples/images/scene1.png",
         "examples/images/scene2.png", "--set", "draft.model=zoo:tinyworld/llava-target-deep",
         "--max-new-tokens", "8", "--compare", "--json"],
        cwd=root, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, COLUMNS="200", PYTHONPATH=str(root)))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 2 and all(r["compare"]["identical"] for r in records)
    for r in records:
        assert r["stats"]["num_draft_tokens"] == 0
        assert "multiply-adds" in r["stats"]["draft_length"]["off_reason"]
    assert "drafting off" in proc.stderr and "cannot pay on a CPU" in proc.stderr
    assert "tokens per target pass" not in proc.stderr
    assert "none (auto, at most 12)" in proc.stderr and "0 drafted" in proc.stderr
    advice = [line for line in proc.stderr.splitlines() if "vlmspec calibrate" in line]
    assert len(advice) == 1 and "drafting did not pay here and was switched off" in advice[0]
