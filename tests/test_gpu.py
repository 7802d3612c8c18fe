"""On a GPU, what the CPU suite proves (``pytest -m gpu``; ``bash bench/gpu.sh`` runs them).

Skipped, with the reason, where torch sees no CUDA device. ``VLMSPEC_GPU_TEST_DEVICE=cpu``
runs them on the CPU anyway (slowly), to check the tests themselves between GPU sessions.

* every method equals target greedy at T = 0 in bf16: vlmspec's speculative decoding
  against vlmspec's own target-only decoding (same models, same dtype), and that against
  transformers' ``generate()``. In bf16 a chain's verification of γ + 1 positions and a
  single step may round differently, so two decodings can part at a near-tie: each
  difference is reported with its margin (the target's logit gap between the two tokens
  at that position) and passes only when that margin is within a few bf16 ulps of the
  largest logit (``tie_tolerance``); anything wider fails;
* T > 0: chain and tree samples follow the target's distribution (χ²);
* compiled steps with CUDA graphs (runtime.compile: on, torch.compile's reduce-overhead)
  decode what eager steps decode;
* the captioner runs on its own CUDA stream in a worker thread, overlapping the target's
  prefill;
* nf4 (bitsandbytes) targets and drafts on CUDA; a batch of 8 equals one-at-a-time.

``VLMSPEC_GPU_REPORT=path.jsonl`` collects one line per comparison (margins included).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import pytest
import torch

from conftest import fresh_scenes
from test_lossless import PROMPTS, reference
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session

DEVICE = os.environ.get("VLMSPEC_GPU_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
DTYPE = os.environ.get("VLMSPEC_GPU_TEST_DTYPE", "bfloat16")
REPORT = os.environ.get("VLMSPEC_GPU_REPORT")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE is None, reason="no CUDA device (torch.cuda.is_available() "
                                 "is False): GPU tests run where there is one, bash bench/gpu.sh")]
MAX_NEW = 32
ULPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 2.0 ** -22}


def session(name: str, *sets: str):
    cli = {f"{role}.{key}": value for role in ("target", "draft", "captioner")
           for key, value in (("device", DEVICE), ("dtype", DTYPE))}
    return build_session(load_profile(name, overrides=list(sets), cli=cli))


def record(**fields) -> None:
    """One line of the GPU report (bench/gpu.sh collects it next to the log)."""
    if REPORT:
        fields.update(device=DEVICE, dtype=DTYPE)
        with open(REPORT, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields, default=str) + "\n")


def tie_tolerance(logits: torch.Tensor) -> float:
    """A few ulps of the largest logit in this dtype: where the order of two logits can
    flip between two kernels' roundings."""
    return 4 * ULPS[DTYPE] * max(1.0, float(logits.abs().max()))


@torch.inference_mode()
def target_logits(lm, request: Request, tokens: list[int]) -> torch.Tensor:
    """The target's logits (V,) for the position after ``tokens``, by vlmspec's target-only
    path (prefill, then one forward over the tokens)."""
    adapter = lm.adapter
    prompt = adapter.prompt_text(lm, request.messages)
    videos = {"videos": request.videos} if request.videos else {}
    inputs = adapter.encode(lm, prompt, request.images or None, **videos)
    cache = adapter.new_cache(lm)
    logits = adapter.prefill(lm, inputs, cache)
    if tokens:
        logits = adapter.extend(lm, torch.tensor([tokens], device=lm.device), cache)[:, -1]
    return logits[0].float()


def compare(test: str, lm, request: Request, expected: list[int], got: list[int], vs: str) -> bool:
    """True when equal; at a difference, the margin decides: a near-tie (reported, passes)
    or a real difference (reported, the assertion fails)."""
    if expected == got:
        record(test=test, vs=vs, equal=True, tokens=len(got))
        return True
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    if i >= min(len(expected), len(got)):   # one stopped early: compare its stop token
        record(test=test, vs=vs, equal=False, first_difference=i, margin=None,
               why=f"lengths {len(expected)} vs {len(got)}")
        assert False, f"{test}: outputs differ in length ({len(expected)} vs {len(got)}) vs {vs}"
    logits = target_logits(lm, request, expected[:i])
    margin = float(logits[expected[i]] - logits[got[i]])
    top2 = logits.topk(2).values
    tol = tie_tolerance(logits)
    record(test=test, vs=vs, equal=False, first_difference=i, tokens=(expected[i], got[i]),
           margin=round(margin, 5), top2_gap=round(float(top2[0] - top2[1]), 5),
           tolerance=round(tol, 5), near_tie=abs(margin) <= tol)
    assert abs(margin) <= tol, (f"{test}: token {i} differs from {vs} ({expected[i]} vs {got[i]}) "
                                f"with a logit margin of {margin:.4f} > {tol:.4f}: not a near-tie")
    return False


def caption_requests(n: int, seed: int) -> list[Request]:
    return [Request([Message("user", PROMPTS[i % len(PROMPTS)], (image,))], max_new_tokens=MAX_NEW)
            for i, (_, image) in enumerate(fresh_scenes(n, seed=seed))]


def video_requests() -> list[Request]:
    from vlmspec_cli.tasks.video_io import clip_from_arrays
    from vlmspec_cli.zoo import video

    out = []
    for seed, frames in ((930_001, 8), (930_002, 16)):
        script = video.random_script(random.Random(seed))
        clip = clip_from_arrays(video.render_script(script, frames), fps=frames / video.DURATION)
        out.append(Request([Message("user", video.QUESTIONS[0], videos=(clip,))], max_new_tokens=MAX_NEW))
    return out


METHODS = [
    ("chain M", "tinyworld-caption", ()),
    ("chain T", "tinyworld-caption", ("drafting.inputs=[text]",)),
    ("tree", "tinyworld-caption", ("method=tree",)),
    ("tabed MTCP*", "tinyworld-tabed", ()),
    ("twig", "tinyworld-twig", ()),
    ("hidden", "tinyworld-hidden", ()),
    ("hidden tree", "tinyworld-hidden", ("hidden.tree=true",)),
    ("video hidden", "tinyworld-video", ()),
    ("video chain M", "tinyworld-video", ("method=chain",)),
]


@pytest.mark.parametrize("label,profile,sets", METHODS, ids=[m[0] for m in METHODS])
def test_method_equals_target_greedy(label, profile, sets):
    s = session(profile, *sets)
    assert s.target.device.type == torch.device(DEVICE).type and str(s.target.dtype).endswith(DTYPE)
    reqs = video_requests() if profile == "tinyworld-video" else caption_requests(3, 940_000)
    baseline = s.baseline_engine()
    accepted = same = 0
    for req in reqs:
        alone = baseline.generate(req).tokens
        res = s.engine.generate(req)
        accepted += res.state.stats.num_accepted_tokens
        same += compare(f"{label}: speculative", s.target, req, alone, res.tokens, "target-only")
        compare(f"{label}: target-only", s.target, req, reference(s.target, req), alone, "generate()")
    assert accepted > 0, "the draft was never accepted: equality would be trivial"
    assert same >= len(reqs) - 1, "more than one request at a near-tie: look at the report"


def test_adt_tree_image_equals_guided_generate():
    from vlmspec_cli.tasks.imagegen import ImageJob, image_request

    s = session("tinyworld-image")
    lm = s.target
    ad = lm.adapter
    lm.model.generation_config.generation_kwargs = {"boi_token_id": ad._special(lm, "boi_token_id")}
    prompt = "a red circle on a blue background"
    req = image_request(s, ImageJob("t", prompt, 0, 0, 0))
    res = s.engine.generate(req)
    alone = s.baseline_engine().generate(req).tokens
    compare("adt image: speculative", lm, req, alone, res.tokens, "target-only")
    ids = ad.prompt_ids(lm, ad.prompt_text(lm, [Message("user", prompt)]))[:1]
    hf = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                           do_sample=False, guidance_scale=ad.guidance_scale(lm))
    compare("adt image: target-only", lm, req, hf[0].tolist(), alone, "generate()")
    assert res.state.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_sampling_follows_the_target(tmp_path_factory, method):
    """χ² of the first three tokens against the target's exact distribution (the tiny
    Llama pair of tests/test_sampling_lm.py, on this device in this dtype)."""
    from test_sampling_lm import _assert_samples_follow_target, _tiny_lm
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine
    from vlmspec_cli.runtime.round.verify import SamplingParams

    root = tmp_path_factory.mktemp("pair")
    target = _tiny_lm(root / "t", 2, seed=0, device=DEVICE, dtype=DTYPE)
    draft = _tiny_lm(root / "d", 1, seed=7, device=DEVICE, dtype=DTYPE)
    params = SamplingParams(1.0)
    kwargs = dict(depth=3, top_k=3, total_tokens=9) if method == "tree" else {}
    drafter = create_drafter(method, draft=draft, sampling=params, drafting_input="text", **kwargs)
    engine = SpeculativeEngine(target, drafter, 3, params)
    _assert_samples_follow_target(engine, target, params, n=1500)
    record(test=f"chi2 {method}", passed=True)


def test_the_captioner_overlaps_the_prefill():
    """TABED's caption input: the captioner runs in a worker thread on its own stream
    while the target prefills (on a GPU; on the CPU it runs inline, by design)."""
    s = session("tinyworld-tabed")
    captioner = s.engine.drafter.captioner
    lm = s.target
    spans: dict[str, list] = {"caption": [], "prefill": []}
    caption_all, prefill = captioner.caption_all, lm.adapter.prefill

    def timed_caption(images):
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream() if torch.cuda.is_available() else None
        out = caption_all(images)
        side = stream is not None and stream != torch.cuda.default_stream()
        spans["caption"].append((t0, time.perf_counter(), threading.current_thread().name, side))
        return out

    def timed_prefill(*a, **k):
        t0 = time.perf_counter()
        out = prefill(*a, **k)
        spans["prefill"].append((t0, time.perf_counter()))
        return out

    captioner.caption_all, lm.adapter.prefill = timed_caption, timed_prefill
    try:
        req = caption_requests(1, 960_000)[0]
        res = s.engine.generate(req)
    finally:
        del captioner.caption_all, lm.adapter.prefill
    (c0, c1, thread, side), (p0, p1) = spans["caption"][0], spans["prefill"][0]
    record(test="captioner overlap", thread=thread, side_stream=side,
           caption_ms=round((c1 - c0) * 1e3, 2), prefill_ms=round((p1 - p0) * 1e3, 2),
           overlap_ms=round((min(c1, p1) - max(c0, p0)) * 1e3, 2))
    compare("captioner: speculative", lm, req, s.baseline_engine().generate(req).tokens, res.tokens,
            "target-only")
    if torch.device(DEVICE).type == "cuda":
        assert thread.startswith("captioner") and side
        assert c0 < p1 and p0 < c1, "the captioner did not run during the target's prefill"


@pytest.mark.parametrize("profile,sets", [("tinyworld-caption", ("target.quantize=nf4",)),
                                          ("tinyworld-selfquant", ())])
def test_nf4_on_cuda(profile, sets):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed on this machine")
    s = session(profile, *sets)
    quantized = s.target if sets else s.draft
    assert "Linear4bit" in {type(m).__name__ for m in quantized.model.modules()}
    assert quantized.model.device.type == torch.device(DEVICE).type
    accepted = 0
    for req in caption_requests(3, 970_000):
        res = s.engine.generate(req)
        accepted += res.state.stats.num_accepted_tokens
        compare(f"nf4 {profile}", s.target, req, s.baseline_engine().generate(req).tokens, res.tokens,
                "target-only")
    assert accepted > 0


def test_a_batch_of_8_equals_one_at_a_time():
    one = session("tinyworld-caption")
    batched = session("tinyworld-caption", "generation.batch_size=8")
    reqs = caption_requests(8, 980_000)
    results = dict(batched.batched_engine().run(list(range(8)), lambda i: reqs[i]))
    for i, req in enumerate(reqs):
        res = results[i]
        assert not isinstance(res, Exception), res
        compare("batch of 8", one.target, req, one.engine.generate(req).tokens, res.tokens,
                "one at a time")


# last: compiling takes the longest (a time limit cut here loses no other test)
def test_compiled_steps_with_cuda_graphs_equal_eager():
    reqs = caption_requests(3, 950_000)
    eager = session("tinyworld-caption", "drafting.gamma=3", "runtime.compile=off")
    compiled = session("tinyworld-caption", "drafting.gamma=3", "runtime.compile=on")
    assert compiled.plan_compile(10**6)
    t0 = time.perf_counter()
    warm = compiled.warm_up()
    steps = compiled.target.fast.compiled
    record(test="cuda graphs", warm_up_s=round(warm, 2), wall_s=round(time.perf_counter() - t0, 2),
           cuda_graphs=steps.cuda, plan=compiled.fast_path_summary())
    assert steps.cuda == (torch.device(DEVICE).type == "cuda")
    for req in reqs:
        expected = eager.engine.generate(req).tokens
        compare("compiled: speculative", eager.target, req, expected,
                compiled.engine.generate(req).tokens, "eager")
        compare("compiled: target-only", eager.target, req, expected,
                compiled.baseline_engine().generate(req).tokens, "eager")
    assert steps.late_compiles == 0, "a shape compiled after the warm-up"
