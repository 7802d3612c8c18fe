"""bitsandbytes quantization (CPU: 8-bit and 4-bit linear layers): quantized models load
through the profile, decode, and speculative decoding stays lossless relative to the
target actually loaded — a quantized target, or a full target drafted by its own 4-bit
copy (tinyworld-selfquant)."""

from __future__ import annotations

import sys

import pytest

from conftest import fresh_scenes
from vlmspec_cli.profile import ModelSpec, load_profile
from vlmspec_cli.runtime.models.loading import ModelLoadError, load_model, use_fast_path
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session

pytest.importorskip("bitsandbytes", reason="CI installs vlmspec[test], which includes [quant]")

MAX_NEW = 24


@pytest.fixture(scope="module")
def requests_():
    return [Request([Message("user", "describe the image.", (image,))], max_new_tokens=MAX_NEW)
            for _, image in fresh_scenes(5, seed=515)]


def _session(profile: str, *sets: str):
    return build_session(load_profile(profile, overrides=["target.device=cpu", "draft.device=cpu",
                                                          *sets]))


def _greedy(engine, reqs):
    return [engine.generate(r) for r in reqs]


@pytest.mark.parametrize("quantize", ["int8", "nf4"])
def test_quantized_target_lossless_relative_to_itself(requests_, quantize):
    session = _session("tinyworld-caption", f"target.quantize={quantize}")
    linear = {type(m).__name__ for m in session.target.model.modules()}
    assert {"int8": "Linear8bitLt", "nf4": "Linear4bit"}[quantize] in linear
    # bitsandbytes layers run on the fast path too (called as the model's own modules)
    assert session.target.fast is not None
    alone = _greedy(session.baseline_engine(), requests_)
    spec = _greedy(session.engine, requests_)
    assert [r.tokens for r in spec] == [r.tokens for r in alone]
    assert sum(r.state.stats.num_accepted_tokens for r in spec) > 0
    assert all(r.text for r in alone)
    # compiled steps leave bitsandbytes layers eager (and say so)
    assert session.plan_compile(10**9) is False or session.target.fast.compiled is None
    session.profile.runtime.compile = "on"
    session.plan_compile(1)
    assert session.target.fast.compiled is None and "not the quantized target" in session.fast_path_summary()
    use_fast_path(session.target, "off")   # ... and decode what transformers' forward does
    assert [r.tokens for r in _greedy(session.baseline_engine(), requests_)] == [
        r.tokens for r in alone]


def test_self_speculation_from_a_4bit_copy(requests_):
    # a fixed γ: the profile's auto switches such a draft off on a CPU (the next test)
    session = _session("tinyworld-selfquant", "drafting.length=fixed")
    assert "Linear4bit" in {type(m).__name__ for m in session.draft.model.modules()}
    assert "Linear4bit" not in {type(m).__name__ for m in session.target.model.modules()}
    alone = _greedy(session.baseline_engine(), requests_)
    spec = _greedy(session.engine, requests_)
    assert [r.tokens for r in spec] == [r.tokens for r in alone]
    # the 4-bit copy agrees with its full-precision self almost always
    drafted = sum(r.state.stats.num_draft_tokens for r in spec)
    accepted = sum(r.state.stats.num_accepted_tokens for r in spec)
    assert accepted / drafted > 0.8
    # ... and takes far less memory
    assert session.draft.model.get_memory_footprint() < 0.5 * session.target.model.get_memory_footprint()


def test_auto_switches_the_4bit_copy_off_after_measuring_it(requests_):
    """The profile's auto, on a CPU: the 4-bit copy is not ruled out before it runs (a
    4-bit draft may pay where reading weights bounds a step: runtime/length/draft_cost.py), it is
    found dear at the process's first request and drafts little after; outputs are the
    target's."""
    session = _session("tinyworld-selfquant")
    assert session.engine.policy.auto.ruled_out is None
    alone = _greedy(session.baseline_engine(), requests_)
    spec = _greedy(session.engine, requests_)
    assert [r.tokens for r in spec] == [r.tokens for r in alone]
    assert session.engine.policy.auto.dear
    rounds = sum(r.state.stats.num_drafts for r in spec)
    assert sum(r.state.stats.draft_length["rounds_drafted"] for r in spec) <= rounds // 4


def test_missing_bitsandbytes_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)   # import fails
    with pytest.raises(ModelLoadError, match=r"vlmspec\[quant\]"):
        load_model(ModelSpec(model="zoo:tinyworld/llava-draft", quantize="nf4"))


def test_unknown_quantize_value_names_the_key():
    from vlmspec_cli.profile import ProfileError

    with pytest.raises(ProfileError, match="target.quantize"):
        load_profile("tinyworld-caption", overrides=["target.quantize=int4"])


def test_int8_outlier_threshold_is_marked_lossy():
    """LLM.int8's outlier columns are chosen over every token of a forward, so a verified
    chunk and single-token decoding can differ (bench/scale.py saw 1 of 16 requests change
    at 6.0): the profile says so instead of claiming losslessness."""
    assert load_profile("tinyworld-caption", overrides=["target.quantize=int8"]).lossless
    assert not load_profile("tinyworld-caption", overrides=["target.quantize=int8",
                                                            "target.int8_threshold=6"]).lossless
    # a draft's quantization never changes what the target accepts
    assert load_profile("tinyworld-selfquant", overrides=["draft.quantize=int8",
                                                          "draft.int8_threshold=6"]).lossless
