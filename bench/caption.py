"""Caption / Q&A speed benchmark on fresh tinyworld scenes, with the TABED Eq. 1 check.

On the same inputs, in one process, greedy decoding with: vlmspec target-only, HF generate()
(target only), HF assisted generation (the draft as assistant_model, constant γ), vlmspec
``chain`` with multimodal (M) and text (T) drafting input, and each ``--also`` profile's
whole configuration (default ``tinyworld-hidden``: the hidden-state head at its γ). Reports tokens/s, speedups, block
efficiency τ (mean tokens per target forward, bonus token included), the measured latency
ratio T_q/T_p, Eq. 1's prediction τ / (γ·T_q/T_p + 1), and token mismatches against the
target's own greedy generate().

    python bench/caption.py [--profile NAME] [--n 20] [--max-new-tokens 64] [--gamma 5]
                            [--threads N] [--seed 0] [--also PROFILE ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

from benchlib import THREADS_HELP, machine_info, thread_plan_for, with_plan  # noqa: E402  (bench/benchlib.py)
from vlmspec_cli.drafters import create_drafter  # noqa: E402
from vlmspec_cli.drafters.inputs import input_prompt  # noqa: E402
from vlmspec_cli.profile import ProfileError, load_profile  # noqa: E402
from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache  # noqa: E402
from vlmspec_cli.runtime.round.engine import SpeculativeEngine  # noqa: E402
from vlmspec_cli.runtime.models.loading import ModelLoadError, check_compatible, load_model  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.runtime.stats import SpecStats  # noqa: E402
from vlmspec_cli.runtime.round.verify import SamplingParams  # noqa: E402
from vlmspec_cli.session import SessionError, build_session  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402

GREEDY = SamplingParams(0.0)
BASELINE = "vlmspec target-only"
HF_BASELINE = REFERENCE = "hf generate"  # the target's own greedy generate(): the reference tokens


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_requests(n: int, seed: int, max_new: int) -> list[Request]:
    """n fresh scenes; even inputs get a caption prompt, odd ones a question about the scene."""
    rng = random.Random(seed + 12345)
    requests = []
    for i in range(n):
        scene = world.sample_scene(rng)
        if i % 2 == 0:
            text = world.CAPTION_PROMPTS[(i // 2) % 3]
        else:
            text = rng.choice(world.qa_pairs(scene, rng))[0]
        msg = Message("user", text, (world.render(scene),))
        requests.append(Request([msg], max_new_tokens=max_new, seed=seed, request_id=str(i)))
    return requests


def engine_method(engine: SpeculativeEngine):
    def run(req: Request) -> tuple[list[int], SpecStats]:
        res = engine.generate(req)
        return res.tokens, res.state.stats
    run.engine = engine
    return run


def hf_method(target, **generate_kwargs):
    """HF generate() from the rendered prompt (encoding included, as in the engine). τ is
    counted: each target forward of assisted generation verifies one block."""
    def run(req: Request) -> tuple[list[int], SpecStats]:
        ad = target.adapter
        inputs = ad.encode(target, ad.prompt_text(target, req.messages), req.images or None)
        forwards = [0]  # counted only during this call, so the engine's forwards are unhooked
        hook = target.model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        try:
            out = target.model.generate(**inputs, do_sample=False,
                                        max_new_tokens=req.max_new_tokens, **generate_kwargs)
        finally:
            hook.remove()
        tokens = out[0, inputs["input_ids"].shape[1]:].tolist()
        return tokens, SpecStats(new_tokens=len(tokens), num_drafts=forwards[0],
                                 num_accepted_tokens=len(tokens) - forwards[0])
    return run


def profile_method(name: str, cli: dict, base, target) -> dict:
    """{row name: run} for a shipped or YAML profile's whole configuration (method, models,
    γ), built as the CLI builds it, on the already loaded target."""
    try:
        other = load_profile(name, cli=cli)
        if other.target.model != base.target.model:
            sys.exit(f"bench/caption.py: --also {name}: its target {other.target.model} is not "
                     f"{base.target.model}")
        engine = build_session(other, target=target).engine
    except (ProfileError, ModelLoadError, SessionError) as exc:
        sys.exit(f"bench/caption.py: --also {name}: {exc}")
    return {f"vlmspec {other.name} ({other.method} γ={engine.gamma})": engine_method(engine)}


def step_latency(lm, inputs: dict, n_tokens: int, repeats: int = 30, warmup: int = 5) -> float:
    """Median seconds of one cached forward of ``n_tokens`` tokens after a real prefill; the
    cache is rolled back to the prompt after every repeat."""
    cache = lm.adapter.new_cache(lm)
    ids = lm.adapter.prefill(lm, inputs, cache).argmax(-1, keepdim=True).repeat(1, n_tokens)
    base, times = cache_length(cache), []
    for r in range(warmup + repeats):
        sync(lm.device)
        t0 = time.perf_counter()
        lm.adapter.extend(lm, ids, cache)
        sync(lm.device)
        if r >= warmup:
            times.append(time.perf_counter() - t0)
        truncate_cache(cache, base)
    return statistics.median(times)


def measure_latencies(target, draft, req: Request, gamma: int) -> dict:
    """T_p, T_p(γ) (γ+1 tokens: pending + γ proposals) and T_q for the M and T draft inputs."""
    ad = target.adapter
    prompt = ad.prompt_text(target, req.messages)
    text_prompt = input_prompt(prompt, req.images, "text", ad.image_token(target), [])
    t_inputs = ad.encode(target, prompt, req.images)
    lat = {"T_p": step_latency(target, t_inputs, 1),
           "T_p_gamma": step_latency(target, t_inputs, gamma + 1),
           "T_q_M": step_latency(draft, draft.adapter.encode(draft, prompt, req.images), 1),
           "T_q_T": step_latency(draft, draft.adapter.encode(draft, text_prompt, None), 1),
           "prompt_len": int(t_inputs["input_ids"].shape[1])}
    lat["ratio_M"], lat["ratio_T"] = lat["T_q_M"] / lat["T_p"], lat["T_q_T"] / lat["T_p"]
    lat["remark1"] = lat["T_p_gamma"] / lat["T_p"]
    return lat


def run_benchmark(methods: dict, requests: list[Request], device: torch.device) -> dict:
    """Warm each method up on the first input, then time every method on every input
    (interleaved per input, so machine-load drift hits all methods alike)."""
    for run in methods.values():
        run(requests[0])
    res = {name: {"seconds": [], "tokens": [], "stats": SpecStats()} for name in methods}
    for req in requests:
        for name, run in methods.items():
            sync(device)
            t0 = time.perf_counter()
            tokens, stats = run(req)
            sync(device)
            res[name]["seconds"].append(time.perf_counter() - t0)
            res[name]["tokens"].append(tokens)
            res[name]["stats"].merge(stats)
    return res


def summarize(res: dict, lat: dict, gamma: int) -> dict:
    ref = res[REFERENCE]["tokens"]
    rate = {n: sum(map(len, r["tokens"])) / sum(r["seconds"]) for n, r in res.items()}
    rows = {}
    for name, r in res.items():
        tau = r["stats"].mean_accept_len
        ratio = lat["ratio_T"] if name.endswith("(T)") else lat["ratio_M"]
        drafted = "assisted" in name or "chain" in name
        pred = tau / (gamma * ratio + 1) if drafted else None
        pred_tpg = tau / (gamma * ratio + lat["remark1"]) if drafted else None
        speedup = rate[name] / rate[BASELINE]
        rows[name] = {
            "new_tokens": sum(map(len, r["tokens"])), "seconds": sum(r["seconds"]),
            "tokens_per_s": rate[name], "speedup": speedup,
            "speedup_vs_hf": rate[name] / rate[HF_BASELINE] if name.startswith("hf") else None,
            "tau": tau, "predicted": pred, "predicted_with_Tp_gamma": pred_tpg,
            "measured_over_predicted": speedup / pred if drafted else None,
            "mismatches": sum(a != b for a, b in zip(r["tokens"], ref)),
            "stats": r["stats"].to_dict(), "per_input_s": [round(s, 5) for s in r["seconds"]],
        }
    return rows


def print_report(cfg: dict, machine: dict, lat: dict, rows: dict) -> None:
    print(f"machine: {machine['hardware']} | device {machine['device']} | torch {machine['torch']}"
          f" | transformers {machine['transformers']} | threads {machine['threads']}")
    print(f"profile {cfg['profile']} | target {cfg['target']} | draft {cfg['draft']}")
    print(f"n={cfg['n']} max_new_tokens={cfg['max_new_tokens']} gamma={cfg['gamma']} "
          f"seed={cfg['seed']} hf_confidence_threshold={cfg['hf_confidence']}")
    ms = {k: lat[k] * 1e3 for k in ("T_p", "T_p_gamma", "T_q_M", "T_q_T")}
    print(f"latency (prompt {lat['prompt_len']} tokens, median of 30): T_p {ms['T_p']:.3f} ms, "
          f"T_p(γ) {ms['T_p_gamma']:.3f} ms, T_q(M) {ms['T_q_M']:.3f} ms, T_q(T) {ms['T_q_T']:.3f} ms")
    print(f"T_q/T_p: M {lat['ratio_M']:.3f}, T {lat['ratio_T']:.3f} | "
          f"T_p(γ)/T_p {lat['remark1']:.3f} (Remark 1 expects ≈ 1)\n")
    head = ("method", "tokens", "tok/s", "speedup", "vs HF", "τ", "Eq.1", "meas/Eq.1", "Eq.1'", "mism")
    fmt = "{:<20} {:>7} {:>8} {:>8} {:>7} {:>6} {:>6} {:>9} {:>6} {:>5}"
    print(fmt.format(*head))

    def num(x, suffix=""):
        return "-" if x is None else f"{x:.2f}{suffix}"

    for name, r in rows.items():
        print(fmt.format(name, r["new_tokens"], f"{r['tokens_per_s']:.1f}", num(r["speedup"], "x"),
                         num(r["speedup_vs_hf"], "x"), num(r["tau"]), num(r["predicted"]),
                         num(r["measured_over_predicted"]), num(r["predicted_with_Tp_gamma"]),
                         r["mismatches"]))
    print("\nspeedup: tokens/s over vlmspec target-only; vs HF: over HF generate(). τ: tokens per "
          "target forward. Eq.1 = τ/(γ·T_q/T_p + 1); Eq.1' uses T_p(γ)/T_p instead of 1. mism: "
          "outputs differing from the target's greedy generate(). HF assisted never gives the "
          "draft pixel_values (its image tokens are plain embeddings); Eq.1 uses T_q(M) for it.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None, help="profile name or YAML path (default tinyworld-caption)")
    ap.add_argument("--n", type=int, default=20, help="number of fresh scenes")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=None, help="draft tokens per block (default: profile's)")
    ap.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="override the profile's device (cpu, cuda, ...)")
    ap.add_argument("--hf-confidence", type=float, default=0.0,
                    help="HF assistant_confidence_threshold; 0 = fixed γ like chain (HF default 0.4)")
    ap.add_argument("--also", action="append", default=None, metavar="PROFILE",
                    help="also time this profile's method on the same target (repeatable; default "
                         "tinyworld-hidden, the best lossless caption method of bench/calibrate.py)")
    ap.add_argument("--json", default=None, help="write all numbers to this file")
    args = ap.parse_args()

    cli = {"target.device": args.device, "draft.device": args.device}
    try:
        profile = load_profile(args.profile, cli=cli)
        target, draft = load_model(profile.target, "target"), load_model(profile.draft, "draft")
        check_compatible(target, draft, needs_images=True)
    except (ProfileError, ModelLoadError) as exc:
        sys.exit(f"bench/caption.py: {exc}")
    plan = thread_plan_for(args.threads, profile)
    gamma = args.gamma or profile.drafting.gamma
    image_token = target.adapter.image_token(target)
    cfg = {"profile": profile.source, "target": profile.target.model, "draft": profile.draft.model,
           "n": args.n, "max_new_tokens": args.max_new_tokens, "gamma": gamma, "seed": args.seed,
           "hf_confidence": args.hf_confidence}

    gc = draft.model.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = gamma, "constant"
    gc.assistant_confidence_threshold = args.hf_confidence

    def chain(variant: str) -> SpeculativeEngine:
        drafter = create_drafter("chain", draft=draft, sampling=GREEDY, drafting_input=variant,
                                 image_token=image_token)
        return SpeculativeEngine(target, drafter, gamma, GREEDY)

    hf_plain = hf_method(target)
    hf_assisted = hf_method(target, assistant_model=draft.model)
    methods = {
        BASELINE: engine_method(SpeculativeEngine(target, create_drafter("none"), 1, GREEDY)),
        HF_BASELINE: hf_plain,
        "hf assisted": hf_assisted,
        "vlmspec chain (M)": engine_method(chain("multimodal")),
        "vlmspec chain (T)": engine_method(chain("text")),
    }
    for name in args.also if args.also is not None else ["tinyworld-hidden"]:
        methods.update(profile_method(name, cli, profile, target))
    for run in methods.values():   # every row under the same threads (HF: the rounds' count)
        if getattr(run, "engine", None) is not None:
            run.engine.threads = plan
    requests = make_requests(args.n, args.seed, args.max_new_tokens)
    res = run_benchmark(methods, requests, target.device)
    plan.enter("decode")   # the latency tables: decoding steps
    lat = measure_latencies(target, draft, requests[0], gamma)  # models warm by now
    rows = summarize(res, lat, gamma)
    machine = with_plan(machine_info(target.device), plan)
    print_report(cfg, machine, lat, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"config": cfg, "machine": machine, "latency": lat, "methods": rows}, indent=2))


if __name__ == "__main__":
    main()
