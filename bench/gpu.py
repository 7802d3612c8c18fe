"""GPU costs at real shapes: what speculation can gain on this card, by Eq. 1'.

Random-weight models built from the published configs (bench/gpu_models.py): LLaVA-1.5-7B
(CLIP-L/336, 576 visual tokens) with TABED's 68M LLaMA draft, and Qwen2.5-VL-7B with a
one-layer hidden-state head (vlmspec's HiViS/Sparrow head) and an EAGLE-3-shaped head. On
each, through vlmspec's own runtime (family adapters, fast path, engine):

  - T_p(k): the target verifying k = 1..64 new positions after a real prompt, eager fast
    path, and transformers' forward for k = 1 and 8;
  - T_q: one draft step (the 68M draft; the hidden head as the engine drafts with it; an
    EAGLE-3-shaped step);
  - prefill at 576 and 2,880 visual tokens;
  - the engine's overhead per round: a round's measured time minus its forwards
    (γ·T_q + T_p(γ+1)), from real rounds of the engine (runtime/round/round_timing.py);
  - target-only ms per token: vlmspec's engine against transformers' generate();
  - CUDA graphs on vs off (runtime.compile: torch.compile mode="reduce-overhead") for
    T_p(1), T_p(8) and T_q, with the compile time, as far as the time budget allows;
  - Eq. 1' speedups, τ / (γ·T_q/T_p(1) + T_p(γ+1)/T_p(1) [+ overhead/T_p(1)]), at the τ
    the seed papers report for these pairs (named in each row).

Every section runs on its own: a failure is recorded in the JSON and the next one runs.
``--budget-s`` bounds the whole run; what does not fit is marked skipped.

  python bench/gpu.py --out $OUT                 # on a GPU (bench/gpu.sh runs it)
  python bench/gpu.py --tiny --out /tmp/g        # the same code at toy sizes, on the CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import gpu_models as gm  # noqa: E402
from benchlib import machine_info, print_table  # noqa: E402
from vlmspec_cli.drafters import create_drafter  # noqa: E402
from vlmspec_cli.runtime.fast.compiled_step import CompiledSteps, set_compiled  # noqa: E402
from vlmspec_cli.runtime.round.engine import SpeculativeEngine  # noqa: E402
from vlmspec_cli.runtime.fast.latency import median_ms, time_feed  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.runtime.round.round_timing import time_rounds  # noqa: E402
from vlmspec_cli.runtime.round.verify import SamplingParams  # noqa: E402

K_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)
GAMMA = 5
GREEDY = SamplingParams(0.0)
PROMPT = "describe the image in detail ."
# τ (mean tokens per round, the bonus token included) as the papers report them
TAU = {
    "tabed": (2.23, "TABED Table 1: LLaVA-1.5-7B + LLaVA-1.5-68M draft, text-only drafting (T), "
                    "first-turn benchmark average, γ = 5"),
    "sparrow": (4.50, "Sparrow Table 4 / §4: Qwen2.5-VL-7B, its text-anchored head, 0.5k "
                      "visual tokens (4.35 at 25k), tree drafting"),
}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Run:
    """The report being filled: sections, each a dict or {"error": ...} / {"skipped": ...}."""

    def __init__(self, args) -> None:
        self.args = args
        self.budget = Budget(args.budget_s)
        self.report: dict = {"tiny": args.tiny, "sections": {}}
        self.repeats = 3 if args.tiny else 20
        self.warmup = 1 if args.tiny else 5
        self.keep: dict = {}   # models kept for the last section (CUDA graphs)

    def section(self, name: str, need_s: float, fn, *a):
        """fn(*a) as the section ``name``, unless less than ``need_s`` seconds are left."""
        if self.budget.left() < need_s:
            self.report["sections"][name] = {"skipped": f"time budget ({self.budget.left():.0f} s left)"}
            print(f"[gpu.py] {name}: skipped (budget)", flush=True)
            return None
        t0 = time.monotonic()
        print(f"[gpu.py] {name} ...", flush=True)
        try:
            out = fn(*a)
        except Exception as exc:   # one broken section must not lose the others' numbers
            traceback.print_exc()
            out = {"error": f"{type(exc).__name__}: {exc}"}
        out = dict(out or {}, seconds=round(time.monotonic() - t0, 2))
        self.report["sections"][name] = out
        self.save()
        print(f"[gpu.py] {name}: {out['seconds']} s{' ERROR ' + out['error'] if 'error' in out else ''}",
              flush=True)
        return out

    def ms(self, fn, warmup: int | None = None, repeats: int | None = None) -> float:
        return round(median_ms(fn, self.device, self.warmup if warmup is None else warmup,
                               self.repeats if repeats is None else repeats), 4)

    def save(self) -> None:
        """The report so far (written after every section: a run cut short by its time
        limit keeps what it measured)."""
        self.report["projections"] = projections(self.report)
        out = self.args.out
        (out / "gpu-bench.json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        (out / "gpu-bench.md").write_text(markdown(self.report))

    @property
    def device(self) -> torch.device:
        return torch.device(self.args.device)


def noise_image(width: int, height: int, seed: int = 0):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def requests(image, n: int, max_new: int) -> list[Request]:
    return [Request([Message("user", PROMPT, (image,))], max_new_tokens=max_new, seed=i)
            for i in range(n)]


def prefill(run: Run, lm, image) -> dict:
    """The prompt with one image: visual tokens, encode (CPU) and prefill (device) ms."""
    prompt = lm.adapter.prompt_text(lm, [Message("user", PROMPT, (image,))])
    inputs = lm.adapter.encode(lm, prompt, [image])
    visual = int(lm.adapter.visual_mask(lm, inputs["input_ids"][0]).sum())

    def once():
        cache = lm.adapter.new_cache(lm)
        lm.adapter.prefill(lm, inputs, cache)
        cache.recycle()

    encode_ms = run.ms(lambda: lm.adapter.encode(lm, prompt, [image]))
    return {"visual_tokens": visual, "positions": int(inputs["input_ids"].shape[1]),
            "encode_ms": encode_ms, "prefill_ms": run.ms(once)}


def prefilled(lm, image, static: bool = True):
    prompt = lm.adapter.prompt_text(lm, [Message("user", PROMPT, (image,))])
    inputs = lm.adapter.encode(lm, prompt, [image])
    cache = lm.adapter.new_cache(lm, static=static)
    lm.adapter.prefill(lm, inputs, cache)
    return cache, inputs["input_ids"][:, -1:]


def verify_costs(run: Run, lm, image, ks=K_VALUES) -> dict:
    """T_p(k) on the fast path (static cache), transformers' forward for k = 1, 8."""
    cache, last = prefilled(lm, image)
    fast = {k: round(time_feed(lm, cache, last.expand(1, k).contiguous(), run.warmup, run.repeats), 4)
            for k in ks}
    cache.recycle()
    dyn, last = prefilled(lm, image, static=False)
    hf = {k: round(time_feed(lm, dyn, last.expand(1, k).contiguous(), run.warmup, run.repeats), 4)
          for k in (1, 8)}
    return {"context": int(dyn.get_seq_length()), "fast_ms": fast, "transformers_ms": hf}


def draft_step(run: Run, draft, text_ids: torch.Tensor) -> dict:
    cache = draft.adapter.new_cache(draft)
    draft.adapter.prefill(draft, {"input_ids": text_ids}, cache)
    ms = time_feed(draft, cache, text_ids[:, -1:], run.warmup, run.repeats)
    cache.recycle()
    return {"context": int(text_ids.shape[1]), "step_ms": round(ms, 4)}


def per_token(run: Run, fn_n, fn_1, n: int) -> float:
    """ms per decoded token: (a run of n tokens − a run of 1) / (n − 1), medians of 3
    runs after one (whole requests: a few are enough)."""
    return round((run.ms(fn_n, 1, 3) - run.ms(fn_1, 1, 3)) / (n - 1), 4)


def target_only(run: Run, lm, image, n: int) -> dict:
    """vlmspec's target-only engine and transformers' generate(), ms per new token."""
    engine = SpeculativeEngine(lm, create_drafter("none"), 1, GREEDY)
    [req_n] = requests(image, 1, n)
    [req_1] = requests(image, 1, 1)
    prompt = lm.adapter.prompt_text(lm, req_n.messages)
    inputs = {k: v for k, v in lm.adapter.encode(lm, prompt, [image]).items()
              if k not in ("position_ids", "rope_deltas")}

    def hf(m):
        return lambda: lm.model.generate(**inputs, max_new_tokens=m, min_new_tokens=m,
                                         do_sample=False)

    return {"vlmspec_ms_per_token": per_token(run, lambda: engine.generate(req_n),
                                              lambda: engine.generate(req_1), n),
            "generate_ms_per_token": per_token(run, hf(n), hf(1), n)}


def rounds(run: Run, engine, image, n: int, tq_ms: float | None, tp: dict) -> dict:
    """The engine's real rounds (random weights: nearly every proposal rejected), and its
    overhead: the verification part of a round minus T_p(drafted + 1) (the commit, the
    acceptance, the bookkeeping) and, given an isolated T_q, the drafting part minus
    levels·T_q (the drafter's own bookkeeping)."""
    times = time_rounds(engine, requests(image, 3 if not run.args.tiny else 1, n), warmup=1)
    s = times.summary()
    drafted = round(s["drafted_per_round"])
    verify_forward = tp.get(drafted + 1, tp[max(tp)])
    s["verify_overhead_ms"] = round(s["verify_ms_per_round"] - verify_forward, 4)
    s["draft_overhead_ms"] = (None if tq_ms is None else
                              round(s["draft_ms_per_round"] - s["levels_per_round"] * tq_ms, 4))
    s["overhead_ms_per_round"] = round(s["verify_overhead_ms"] + (s["draft_overhead_ms"] or 0.0), 4)
    return s


def compiled_costs(run: Run, lm, image, ks=(1, 8)) -> dict:
    """CUDA graphs (runtime.compile) against eager for T_p(k): first call = compile time.
    One ``CompiledSteps`` for every k (its graphs are per bucket), set aside for the eager
    timings (the first GPU run left k=1's graphs on for the eager T_p(8), hiding its
    compile in that warm-up)."""
    out: dict = {"compile_s": {}, "compiled_ms": {}, "eager_ms": {}}
    cache, last = prefilled(lm, image)
    steps = CompiledSteps(lm.fast)
    try:
        for k in ks:
            feed = last.expand(1, k).contiguous()
            lm.fast.compiled = None
            out["eager_ms"][k] = round(time_feed(lm, cache, feed, run.warmup, run.repeats), 4)
            if run.budget.left() < run.args.compile_reserve_s:
                out["compiled_ms"][k] = "skipped: time budget"
                continue
            lm.fast.compiled = steps
            t0 = time.perf_counter()
            time_feed(lm, cache, feed, 0, 1)
            out["compile_s"][k] = round(time.perf_counter() - t0, 2)
            out["compiled_ms"][k] = round(time_feed(lm, cache, feed, run.warmup, run.repeats), 4)
    finally:
        lm.fast.compiled = None
        cache.recycle()
    return out


def eagle3_step(run: Run, target, draft_vocab: int = 32000, context: int = 128) -> dict:
    """One EAGLE-3-shaped draft step at the target's width (SpecForge / vLLM llama_eagle3:
    one decoder layer whose q/k/v read [token embedding ⊕ fused hidden state] (2H), an MLP,
    a norm and an LM head over a 32k draft vocabulary), attending over ``context`` cached
    draft positions. The fc over the target's three layers (3H → H) runs once per verified
    token, not per draft step, and is timed apart."""
    t = target.model.config.get_text_config()
    h, heads, kv = t.hidden_size, t.num_attention_heads, t.num_key_value_heads
    hd, inter = h // heads, t.intermediate_size
    dev, dt = target.device, target.dtype

    def w(o, i):
        return torch.randn(o, i, device=dev, dtype=dt) * 0.02

    q, k, v, o = w(heads * hd, 2 * h), w(kv * hd, 2 * h), w(kv * hd, 2 * h), w(h, heads * hd)
    gate, up, down, head, fc = w(inter, h), w(inter, h), w(h, inter), w(draft_vocab, h), w(h, 3 * h)
    keys = torch.randn(1, kv, context, hd, device=dev, dtype=dt)
    values = torch.randn_like(keys)
    x = torch.randn(1, 1, 2 * h, device=dev, dtype=dt)
    fused = torch.randn(1, 1, 3 * h, device=dev, dtype=dt)

    def step():
        with torch.inference_mode():
            qq = F.linear(x, q).view(1, 1, heads, hd).transpose(1, 2)
            kk = F.linear(x, k).view(1, 1, kv, hd).transpose(1, 2)
            vv = F.linear(x, v).view(1, 1, kv, hd).transpose(1, 2)
            att = F.scaled_dot_product_attention(qq, torch.cat([keys, kk], 2),
                                                 torch.cat([values, vv], 2), enable_gqa=kv != heads)
            y = F.linear(att.transpose(1, 2).reshape(1, 1, -1), o)
            y = y + F.linear(F.silu(F.linear(y, gate)) * F.linear(y, up), down)
            return F.linear(F.rms_norm(y, (h,)), head).argmax(-1)

    return {"step_ms": run.ms(step), "fc_ms": run.ms(lambda: F.linear(fused, fc)),
            "draft_vocab": draft_vocab, "context": context}


def eq1(tau: float, gamma_cost_ms: float, verify_ms: float, tp1: float, overhead_ms: float = 0.0):
    """Eq. 1': τ / ((drafting + verification [+ overhead]) / T_p(1))."""
    return round(tau / ((gamma_cost_ms + verify_ms + overhead_ms) / tp1), 3)


def llava(run: Run, n: int) -> None:
    dev, dt = run.device, run.dtype
    t0 = time.perf_counter()
    target, draft = gm.llava_pair(dev, dt, run.args.tiny, headroom=n + 80)
    size = target.model.config.vision_config.image_size
    image = noise_image(size, size)
    r = run.report["llava15_7b"] = {
        "build_s": round(time.perf_counter() - t0, 2),
        "params_target_M": round(sum(p.numel() for p in target.model.parameters()) / 1e6, 1),
        "params_draft_M": round(sum(p.numel() for p in draft.model.parameters()) / 1e6, 1)}
    r["prefill"] = run.section("llava: prefill", 10, prefill, run, target, image)
    r["verify"] = run.section("llava: T_p(k)", 20, verify_costs, run, target, image)
    text = draft.tokenizer(target.adapter.prompt_text(target, requests(image, 1, 1)[0].messages)
                           .replace("<image>", "\n"), return_tensors="pt")["input_ids"].to(dev)
    r["draft"] = run.section("llava: T_q (68M)", 5, draft_step, run, draft, text)
    r["target_only"] = run.section("llava: target-only per token", 20, target_only, run, target,
                                   image, n)
    tp = (r["verify"] or {}).get("fast_ms")
    tq = (r["draft"] or {}).get("step_ms")
    if tp and tq:
        chain = SpeculativeEngine(target, create_drafter("chain", draft=draft, sampling=GREEDY,
                                                         drafting_input="text",
                                                         image_token="<image>"), GAMMA, GREEDY)
        r["rounds"] = run.section("llava: engine rounds (chain γ=5)", 20, rounds, run, chain,
                                  image, n, tq, tp)
    run.keep["llava"] = (target, draft, image, text)


def qwen(run: Run, n: int) -> None:
    dev, dt = run.device, run.dtype
    small, large = ((112, 112), (224, 224)) if run.args.tiny else ((672, 672), (1344, 1680))
    t0 = time.perf_counter()
    target = gm.qwen_target(dev, dt, run.args.tiny, headroom=n + 80,
                            max_visual_tokens=(large[0] * large[1]) // (28 * 28))
    head = gm.hidden_head(target, run.args.tiny)
    r = run.report["qwen25_vl_7b"] = {
        "build_s": round(time.perf_counter() - t0, 2),
        "params_target_M": round(sum(p.numel() for p in target.model.parameters()) / 1e6, 1),
        "params_head_M": round(sum(p.numel() for p in head.parameters()) / 1e6, 1)}
    image, big = noise_image(*small), noise_image(*large)
    r["prefill"] = run.section("qwen: prefill (small image)", 10, prefill, run, target, image)
    r["prefill_large"] = run.section("qwen: prefill (large image)", 15, prefill, run, target, big)
    r["verify"] = run.section("qwen: T_p(k)", 20, verify_costs, run, target, image)
    r["verify_large"] = run.section("qwen: T_p(k) after the large image", 10, verify_costs, run,
                                    target, big, (1, 6, 8, 31))
    r["eagle3_shaped"] = run.section("qwen: EAGLE-3-shaped step", 5, eagle3_step, run, target)
    r["target_only"] = run.section("qwen: target-only per token", 20, target_only, run, target,
                                   image, n)
    tp = (r["verify"] or {}).get("fast_ms")
    if tp:
        engine = SpeculativeEngine(target, create_drafter("hidden", target=target, head=head,
                                                          sampling=GREEDY), GAMMA, GREEDY)
        r["rounds"] = run.section("qwen: engine rounds (hidden head γ=5)", 20, rounds, run, engine,
                                  image, n, None, tp)
    del target, head
    free()


def cuda_graphs(run: Run) -> dict:
    """CUDA graphs on vs off for the LLaVA target's T_p(1), T_p(8) and the draft's step
    (the last section: compiling a 32-layer graph takes the longest)."""
    target, draft, image, text = run.keep["llava"]
    out = {"target": compiled_costs(run, target, image)}
    cache = draft.adapter.new_cache(draft)
    draft.adapter.prefill(draft, {"input_ids": text}, cache)
    feed = text[:, -1:]
    try:
        eager = time_feed(draft, cache, feed, run.warmup, run.repeats)
        set_compiled(draft.fast, True)
        t0 = time.perf_counter()
        time_feed(draft, cache, feed, 0, 1)
        out["draft"] = {"eager_ms": round(eager, 4), "compile_s": round(time.perf_counter() - t0, 2),
                        "compiled_ms": round(time_feed(draft, cache, feed, run.warmup, run.repeats), 4)}
    finally:
        set_compiled(draft.fast, False)
        cache.recycle()
    return out


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def projections(report: dict) -> list[dict]:
    """Eq. 1 (TABED: T_p(γ) ≈ T_p), Eq. 1' (the measured T_p(γ + 1)) and Eq. 1' with the
    engine's measured overhead per round, at the papers' τ."""
    rows = []

    def add(name, tau_key, gamma, tq, tp, verify_k, overhead, depth=None):
        tau, source = TAU[tau_key]
        levels = depth or gamma
        tp1, tpv = tp[1], tp.get(verify_k)
        if tpv is None:   # the largest measured k at or below it
            tpv = tp[max(k for k in tp if k <= verify_k)]
        rows.append({"pair": name, "tau": tau, "tau_source": source, "gamma": gamma,
                     "levels": levels, "verified": verify_k, "tq_over_tp": round(tq / tp1, 4),
                     "tp_verify_over_tp1": round(tpv / tp1, 3),
                     "eq1": eq1(tau, levels * tq, tp1, tp1), "eq1_prime": eq1(tau, levels * tq, tpv, tp1),
                     "eq1_prime_overhead": (None if overhead is None else
                                            eq1(tau, levels * tq, tpv, tp1, overhead))})

    def get(*path):
        node = report
        for key in path:
            node = (node or {}).get(key) if isinstance(node, dict) else None
        return node

    tp = get("llava15_7b", "verify", "fast_ms")
    tq = get("llava15_7b", "draft", "step_ms")
    if tp and tq:
        add("LLaVA-1.5-7B + 68M chain (T)", "tabed", GAMMA, tq, tp, GAMMA + 1,
            get("llava15_7b", "rounds", "overhead_ms_per_round"))
    graphs = get("cuda_graphs", "target", "compiled_ms") or {}
    draft_graph = get("cuda_graphs", "draft", "compiled_ms")
    if all(isinstance(graphs.get(k), float) for k in (1, 8)) and isinstance(draft_graph, float):
        # γ + 1 = 6 rows run in the bucket of 8 (runtime/fast/compiled_step.py BUCKETS)
        add("LLaVA-1.5-7B + 68M chain (T), CUDA graphs", "tabed", GAMMA, draft_graph,
            {1: graphs[1], 8: graphs[8]}, 8, get("llava15_7b", "rounds", "overhead_ms_per_round"))
    tp = get("qwen25_vl_7b", "verify", "fast_ms")
    head = get("qwen25_vl_7b", "rounds", "draft_ms_per_level")
    if tp and head:
        over = get("qwen25_vl_7b", "rounds", "verify_overhead_ms")
        add("Qwen2.5-VL-7B + hidden head chain", "sparrow", GAMMA, head, tp, GAMMA + 1, over)
        # Sparrow's tree 30-4-8: 4 draft levels (8 rows each, ≈ one step), 30 nodes + 1
        add("Qwen2.5-VL-7B + hidden head tree 30-4-8", "sparrow", GAMMA, head, tp, 31, over, depth=4)
    eagle = get("qwen25_vl_7b", "eagle3_shaped", "step_ms")
    if tp and eagle:
        add("Qwen2.5-VL-7B + EAGLE-3-shaped head chain (τ assumed Sparrow's)", "sparrow", GAMMA,
            eagle, tp, GAMMA + 1, get("qwen25_vl_7b", "rounds", "verify_overhead_ms"))
    return rows


def markdown(report: dict) -> str:
    """The tables of the GPU sections of the results (bench/RESULTS.md, bench/history/), from the report."""
    lines = [f"Machine: {report['machine']['hardware']}, torch {report['machine']['torch']}, "
             f"transformers {report['machine']['transformers']}, {report['dtype']}"
             + (" (--tiny: toy sizes)" if report["tiny"] else ""), ""]
    for key, title in (("llava15_7b", "LLaVA-1.5-7B"), ("qwen25_vl_7b", "Qwen2.5-VL-7B")):
        pair = report.get(key) or {}
        tp = (pair.get("verify") or {}).get("fast_ms") or {}
        if tp:
            ks = sorted(tp, key=int)
            lines += [f"T_p(k) ms, {title}, context {pair['verify']['context']} "
                      f"(transformers' forward: k=1 {pair['verify']['transformers_ms'].get(1)}, "
                      f"k=8 {pair['verify']['transformers_ms'].get(8)})", "",
                      "| k | " + " | ".join(str(k) for k in ks) + " |",
                      "|---|" + "---|" * len(ks),
                      "| ms | " + " | ".join(f"{tp[k]:.2f}" for k in ks) + " |", ""]
    rows = report.get("projections") or []
    if rows:
        lines += ["| pair | τ | γ | T_q/T_p | T_p(v)/T_p(1) | Eq. 1 | Eq. 1' | Eq. 1' + overhead |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['pair']} | {r['tau']} | {r['gamma']} | {r['tq_over_tp']} | "
                         f"{r['tp_verify_over_tp1']} (v={r['verified']}) | {r['eq1']}x | "
                         f"{r['eq1_prime']}x | {r['eq1_prime_overhead']}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="toy sizes (runs on the CPU in seconds)")
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu-bench.json and .md")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--budget-s", type=float, default=240.0, help="the whole run's time budget")
    ap.add_argument("--new-tokens", type=int, default=None, help="per request (64; tiny 6)")
    ap.add_argument("--pairs", default="llava,qwen")
    ap.add_argument("--no-compile", action="store_true", help="skip CUDA graphs on/off")
    ap.add_argument("--compile-reserve-s", type=float, default=None,
                    help="start a compile only with this much budget left (default 60; tiny 0)")
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here; use --tiny on the CPU", file=sys.stderr)
        return 2
    if args.compile_reserve_s is None:
        args.compile_reserve_s = 0.0 if args.tiny else 60.0
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    run.dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    n = args.new_tokens or (6 if args.tiny else 64)
    run.report.update(machine=machine_info(run.device), dtype=str(run.dtype).replace("torch.", ""),
                      gamma=GAMMA, new_tokens=n, date=time.strftime("%Y-%m-%d"),
                      command="python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    for name, fn in (("llava", llava), ("qwen", qwen)):
        if name in args.pairs.split(","):
            run.section(f"{name}: build and measure", 30, fn, run, n)
    if "llava" in run.keep and not args.no_compile:
        run.report["cuda_graphs"] = run.section("llava: CUDA graphs on/off", args.compile_reserve_s,
                                                cuda_graphs, run)
    run.keep.clear()
    free()
    if torch.cuda.is_available() and run.device.type == "cuda":
        run.report["max_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    run.save()
    print(markdown(run.report))
    errors = [k for k, v in run.report["sections"].items() if "error" in v]
    print(f"[gpu.py] {len(run.report['sections'])} sections, {len(errors)} failed"
          + (f": {', '.join(errors)}" if errors else ""), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
