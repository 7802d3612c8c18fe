"""TwigVLM Table 4/7-style benchmark of ``twig`` self-speculation on fresh tinyworld inputs:
token acceptance rate (TokAR), τ, measured speedup over target-only and its Eq. 1
expectation, for layer-skip drafting, the shipped twig, the build's twig variants and
twig-guided token pruning (TTP).

Rows, all on the same requests (greedy):
  target-only                      the baseline (``none`` drafter)
  layer-skip K=1,2,3               the target's first K layers + its own norm/head (θ; --layer-skip)
  twig K=.. T=.. θ=0 / θ=0.6       the shipped twig (``--twig``), without / with early exit
  variant K{k}-T{t}-{init}         each twig the build saved under ``--variants-dir`` (θ)
  twig+TTP R=.. P=.. Kf=..         the shipped twig with pruning plans ``--prune`` (θ; lossy)
The pruning rows use their own copy of the twig (pruning switches the twig to eager
attention to read its attention map; the lossless rows keep the default kernel).

Columns: TokAR = accepted / drafted tokens (Table 7); τ = mean acceptance length (1 +
accepted per round); n̄ = drafted tokens per round (≤ δ = --gamma; early exit at θ makes
it smaller); RelSpd = total wall time of target-only / of the row over all requests,
end to end (prefill + decoding, as the paper's RelSpd); ≠ target = outputs differing
from target-only (must be 0 for lossless rows). Pruning rows also give R̄ (Eq. 6, mean
over requests), "changed" = the fraction of requests whose output differs from the
unpruned target, and RelAcc = QA accuracy of the row / QA accuracy of target-only on
the question requests (exact answer match).

Latency ratio c and Eq. 1. For each row, c = median T_q / median T_p, measured in
isolation on the warm-up request's prompt right after the timed runs: T_p is one decode
step of the target-only engine (one token through the whole target after the prefilled
prompt, its cache cut back after each call); T_q is one draft step of the row's drafter
on its own prefilled state (one token through the shared layers[:K] and the twig, or the
target's head for layer-skip; the rows it wrote to the target's lower layers and to the
twig's cache cut back after each call). Samples of T_p and T_q alternate, so load drift
on the machine hits both alike. Eq. 1 (TABED; vlmspec_cli.runtime.fast.latency.eq1_speedup)
then gives the expected decoding speedup τ / (n̄·c + 1), with the measured n̄ in place
of γ (every drafted token costs one draft step) and T_p(n̄+1) ≈ T_p (Remark 1). It
ignores the prefill and that verification skips layers[:K] for the drafted tokens, so
"meas/Eq.1" = RelSpd / Eq. 1 says how much of the expected gain survives end to end.

    python bench/twig.py [--n 20] [--max-new-tokens 48] [--gamma 5] [--threshold 0.6]
                         [--threads N] [--seed 0] [--twig zoo:tinyworld/llava-twig]
                         [--variants-dir bench/twigs] [--prune R,P,KF ...]
                         [--latency-repeats 15] [--json out.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

from benchlib import THREADS_HELP, machine_info, thread_plan_for, with_plan, print_table  # noqa: E402  (bench/benchlib.py)
from vlmspec_cli.drafters import create_drafter  # noqa: E402
from vlmspec_cli.drafters.twig import PrunePlan  # noqa: E402
from vlmspec_cli.profile import ModelSpec, load_profile  # noqa: E402
from vlmspec_cli.runtime.adapters.base import truncate_cache  # noqa: E402
from vlmspec_cli.runtime.round.engine import SpeculativeEngine  # noqa: E402
from vlmspec_cli.runtime.fast.latency import eq1_speedup, synchronize  # noqa: E402
from vlmspec_cli.runtime.models.loading import ModelLoadError, load_model, load_twig  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.runtime.stats import SpecStats  # noqa: E402
from vlmspec_cli.runtime.fast.trunk import crop_layers  # noqa: E402
from vlmspec_cli.runtime.round.verify import SamplingParams  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402

GREEDY = SamplingParams(0.0)
BASELINE = "target-only"
TARGET = "zoo:tinyworld/llava-target"   # --target; the 32-layer one: llava-target-deep
SEED_BASE = 878000  # far from the build's training (1), evaluation (10000) and twig eval (20000+) seeds
# what the build saves with --twig-ablation (zoo/twig.py); absent ones are reported
ALL_VARIANTS = tuple(f"K{k}-T{t}-{init}" for k in (1, 2, 3, 4, 8) for t in (1, 2, 3, 4)
                     for init in ("next", "last", "random"))
DEFAULT_PRUNE = ("3,2,6", "1,2,4")  # R,P,K_f: the target has 8 layers, an image 9 visual tokens


def note(msg: str) -> None:
    print(f"bench/twig.py: {msg}", file=sys.stderr)


# -- inputs --------------------------------------------------------------------------
@dataclass
class Item:
    request: Request
    scene: object
    kind: str               # "caption" or "qa"
    answer: str | None      # the expected answer of a question


def make_item(rng: random.Random, i: int, max_new: int, tag: str) -> Item:
    scene = world.sample_scene(rng)
    if i % 2 == 0:
        text, kind, answer = world.CAPTION_PROMPTS[(i // 2) % len(world.CAPTION_PROMPTS)], "caption", None
    else:
        (text, answer), kind = rng.choice(world.qa_pairs(scene, rng)), "qa"
    req = Request([Message("user", text, (world.render(scene),))], max_new_tokens=max_new,
                  request_id=f"{tag}/{i}")
    return Item(req, scene, kind, answer)


def make_items(n: int, seed: int, max_new: int) -> tuple[list[Item], Item]:
    """n fresh scenes, alternating a caption prompt and a question; plus a separate warm-up
    request (its own RNG, so it is none of the timed ones)."""
    rng = random.Random(SEED_BASE + seed * 100)
    items = [make_item(rng, i, max_new, "req") for i in range(n)]
    warm = make_item(random.Random(SEED_BASE + seed * 100 + 99), 0, max_new, "warmup")
    return items, warm


# -- rows ----------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    engine: SpeculativeEngine
    kind: str               # baseline | layer-skip | twig | variant | ttp
    config: dict


def parse_plan(text: str) -> PrunePlan:
    try:
        keep, layer, wipe = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prune wants R,P,KF (three integers), got '{text}'") from None
    return PrunePlan(keep=keep, layer=layer, final_wipe=wipe)


def twig_shape(twig, fallback_k: int | None = None) -> tuple[int, int, str]:
    cfg = twig.config
    k = getattr(cfg, "twig_from_layer", None)
    if k is None:
        if fallback_k is None:
            raise ModelLoadError("the twig's config has no twig_from_layer")
        k = fallback_k
    return int(k), int(cfg.num_hidden_layers), str(getattr(cfg, "twig_init", "?"))


def build_rows(target, args) -> list[Row]:
    gamma, theta = args.gamma, args.threshold
    rows = [Row(BASELINE, SpeculativeEngine(target, create_drafter("none"), 1, GREEDY), "baseline", {})]

    def add(name, kind, config, **kw):
        try:
            drafter = create_drafter("twig", target=target, sampling=GREEDY, **kw)
        except ValueError as exc:
            note(f"skipping row '{name}': {exc}")
            return
        rows.append(Row(name, SpeculativeEngine(target, drafter, gamma, GREEDY), kind,
                        dict(config, lossless=bool(drafter.lossless))))

    n_layers = len(target.adapter.text_stack(target).layers)
    for k in args.layer_skip:
        if k < n_layers:
            add(f"layer-skip K={k}", "layer-skip", {"K": k, "threshold": theta},
                layers=k, twig=None, threshold=theta)

    try:
        shipped = load_twig(args.twig, target)
        k, t, init = twig_shape(shipped)
    except ModelLoadError as exc:
        shipped = None
        note(f"skipping the shipped-twig and pruning rows: {exc}")
    if shipped is not None:
        for th in dict.fromkeys((0.0, theta)):
            add(f"twig K={k} T={t} θ={th:g}", "twig", {"twig": args.twig, "K": k, "T": t, "init": init,
                                                       "threshold": th},
                layers=k, twig=shipped, threshold=th)

    variants_dir = Path(args.variants_dir)
    present = [v for v in ALL_VARIANTS if (variants_dir / v / "config.json").is_file()]
    if not present:   # which variants exist depends on the ablation that wrote them
        note(f"no twig variants in {variants_dir}: only the shipped twig's rows (variants come "
             "from `zoo.build --twig-ablation --twig-variants DIR` or `zoo.deep_twig --variants DIR`)")
    for v in present:
        try:
            twig = load_twig(str(variants_dir / v), target)
            k, t, init = twig_shape(twig, fallback_k=int(v[1]))
        except ModelLoadError as exc:  # e.g. still being written by the build
            note(f"skipping variant {v}: {exc}")
            continue
        add(f"variant {v} θ={theta:g}", "variant", {"twig": str(variants_dir / v), "K": k, "T": t,
                                                    "init": init, "threshold": theta},
            layers=k, twig=twig, threshold=theta)

    if shipped is not None and args.prune:
        # its own copy: pruning switches the twig's attention to eager (to read its map)
        pruning_twig = load_twig(args.twig, target)
        k, t, init = twig_shape(pruning_twig)
        for plan in args.prune:
            plan = PrunePlan(plan.keep, plan.layer, plan.final_wipe)
            add(f"twig+TTP R={plan.keep} P={plan.layer} Kf={plan.final_wipe}", "ttp",
                {"twig": args.twig, "K": k, "T": t, "init": init, "threshold": theta,
                 "prune": {"keep": plan.keep, "layer": plan.layer, "final_wipe": plan.final_wipe}},
                layers=k, twig=pruning_twig, threshold=theta, prune=plan)
    return rows


# -- runs ----------------------------------------------------------------------------
def run_all(rows: list[Row], items: list[Item], warm: Item, device: torch.device) -> dict:
    """Warm every engine up, then run every request with every engine; per request the
    engines take turns in a rotated order, so drift in machine load spreads over all rows."""
    for row in rows:
        row.engine.generate(warm.request)
    raw = {r.name: {"seconds": [], "tokens": [], "texts": [], "stats": SpecStats(), "retained": []}
           for r in rows}
    for i, item in enumerate(items):
        order = rows[i % len(rows):] + rows[:i % len(rows)]
        for row in order:
            synchronize(device)
            t0 = time.perf_counter()
            res = row.engine.generate(item.request)
            synchronize(device)
            cell = raw[row.name]
            cell["seconds"].append(time.perf_counter() - t0)
            cell["tokens"].append(res.tokens)
            cell["texts"].append(res.text)
            cell["stats"].merge(res.state.stats)
            if res.state.stats.pruning:
                cell["retained"].append(res.state.stats.pruning["mean_retained"])
        if (i + 1) % 5 == 0 or i + 1 == len(items):
            print(f"  done: {i + 1}/{len(items)} requests", file=sys.stderr)
    return raw


def measure_c(rows: list[Row], warm: Item, device: torch.device, repeats: int, warmup: int = 3) -> dict:
    """c per row = median T_q / median T_p on the warm-up request (see the module docstring)."""
    base = rows[0].engine
    bstate = base.start(warm.request)
    bcache, blen = bstate.target_cache, int(bstate.target_cache.get_seq_length())
    lm = base.target
    tok = int(bstate.target_next_logits.argmax())
    ids = torch.tensor([[tok]], device=lm.device)

    def target_step():
        lm.adapter.extend(lm, ids, bcache)
        truncate_cache(bcache, blen)

    out = {}
    for row in rows[1:]:
        drafter = row.engine.drafter
        state = row.engine.start(warm.request)
        st, cache = state.drafter_state, state.target_cache
        lower = drafter.split.lower_layers

        def draft_step():
            drafter._draft_step(st, state, [tok])
            crop_layers(cache, lower, 1)   # the fast path's segmented cache, or transformers'
            if st.twig_cache is not None:
                st.twig_cache.crop(-1)
            st.lowered, st.lowered_states = None, None

        tp, tq = [], []
        for i in range(warmup + repeats):
            for fn, acc in ((target_step, tp), (draft_step, tq)):
                synchronize(device)
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                if i >= warmup:
                    acc.append((time.perf_counter() - t0) * 1000.0)
        t_p, t_q = statistics.median(tp), statistics.median(tq)
        out[row.name] = {"target_step_ms": round(t_p, 4), "draft_step_ms": round(t_q, 4),
                         "c": t_q / t_p}
    return out


def qa_accuracy(items: list[Item], texts: list[str]) -> float | None:
    qa = [(it, tx) for it, tx in zip(items, texts) if it.kind == "qa"]
    return sum(world.answer_is_correct(it.answer, tx) for it, tx in qa) / len(qa) if qa else None


def caption_exact(items: list[Item], texts: list[str]) -> float | None:
    caps = [(it, tx) for it, tx in zip(items, texts) if it.kind == "caption"]
    return sum(world.caption_is_exact(it.scene, tx) for it, tx in caps) / len(caps) if caps else None


def summarize(rows: list[Row], raw: dict, items: list[Item], lat: dict) -> dict:
    base = raw[BASELINE]
    base_s = sum(base["seconds"])
    base_decode = sum(base["seconds"]) - base["stats"].prefill_s
    base_acc = qa_accuracy(items, base["texts"])
    out = {}
    for row in rows:
        c = raw[row.name]
        s: SpecStats = c["stats"]
        seconds = sum(c["seconds"])
        mism = sum(a != b for a, b in zip(c["tokens"], base["tokens"]))
        acc = qa_accuracy(items, c["texts"])
        r = {"kind": row.kind, "config": row.config,
             "tokar": s.draft_accept_rate if s.num_draft_tokens else None,
             "tau": s.mean_accept_len if row.kind != "baseline" else None,
             "drafted_per_round": s.num_draft_tokens / s.num_drafts if row.kind != "baseline" and s.num_drafts else None,
             "seconds": seconds, "new_tokens": s.new_tokens, "tokens_per_s": s.new_tokens / seconds,
             "rel_spd": base_s / seconds,
             "decode_rel_spd": base_decode / (seconds - s.prefill_s),   # prefill excluded
             "mismatches": mism, "changed": mism / len(items),
             "qa_acc": acc, "caption_exact": caption_exact(items, c["texts"]),
             "rel_acc": (acc / base_acc) if acc is not None and base_acc else None,
             "mean_retained": statistics.mean(c["retained"]) if c["retained"] else None,
             "retained_per_request": c["retained"] or None,
             "stats": s.to_dict(), "per_request_s": [round(x, 5) for x in c["seconds"]],
             "texts": c["texts"]}
        if row.name in lat:
            r.update(lat[row.name])
            r["eq1"] = eq1_speedup(r["tau"], r["drafted_per_round"], r["c"])
            r["meas_over_eq1"] = r["rel_spd"] / r["eq1"]
        out[row.name] = r
    return out


# -- reporting -----------------------------------------------------------------------
def fmt(v, spec: str, suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def main_table(summary: dict, n: int, markdown: bool) -> None:
    header = ["method", "TokAR", "τ", "n̄", "RelSpd", "c", "Eq.1", "meas/Eq.1", "≠ target",
              "R̄", "changed", "RelAcc"]
    lines = []
    for name, r in summary.items():
        ttp = r["kind"] == "ttp"
        pct = (lambda v: None if v is None else 100 * v)
        lines.append([name, fmt(pct(r["tokar"]), ".1f", "%"),
                      fmt(r["tau"], ".2f"), fmt(r["drafted_per_round"], ".2f"),
                      f"{100 * r['rel_spd']:.1f}%", fmt(r.get("c"), ".3f"),
                      fmt(r.get("eq1"), ".2f", "x"), fmt(r.get("meas_over_eq1"), ".2f"),
                      f"{r['mismatches']}/{n}" if r["kind"] != "baseline" else "–",
                      fmt(r["mean_retained"], ".2f") if ttp else "–",
                      fmt(100 * r["changed"], ".0f", "%") if ttp else "–",
                      fmt(pct(r["rel_acc"]), ".1f", "%") if ttp else "–"])
    print_table("TwigVLM Tables 4/7 on tinyworld (TokAR = accepted/drafted; τ = mean accept length; "
                "n̄ = drafted per round; RelSpd = target-only wall / row wall, prefill included; "
                "c = T_q/T_p; Eq.1 = τ/(n̄·c+1); ≠ target = outputs differing from target-only; "
                "R̄ = Eq. 6 mean retained visual tokens; changed = share of outputs changed by pruning; "
                "RelAcc = QA accuracy / target-only's)", header, lines, markdown)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="requests (fresh scenes; caption prompt / question alternating)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=5, help="δ: most draft tokens per round")
    ap.add_argument("--threshold", type=float, default=0.6, help="θ: early exit of the drafting rows "
                    "(the shipped twig also runs with θ=0)")
    ap.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    ap.add_argument("--seed", type=int, default=0, help="picks the fresh inputs")
    ap.add_argument("--device", default="cpu", help="device of target and twigs (cpu, cuda, ...)")
    ap.add_argument("--target", default=TARGET, help="the target (zoo name or directory)")
    ap.add_argument("--twig", default="zoo:tinyworld/llava-twig", help="the shipped twig (zoo name or directory)")
    ap.add_argument("--layer-skip", type=lambda v: [int(k) for k in v.split(",")], default=[1, 2, 3],
                    metavar="K,K,..", help="layer-skip rows: the target's first K layers (default 1,2,3)")
    ap.add_argument("--variants-dir", default="bench/twigs",
                    help="twig variants K{k}-T{t}-{init} saved by the build (a row for each present)")
    ap.add_argument("--prune", type=parse_plan, action="append", default=None, metavar="R,P,KF",
                    help="a TTP plan: keep R visual tokens from layer P, none from layer KF "
                         f"(repeatable; default {' and '.join(DEFAULT_PRUNE)})")
    ap.add_argument("--latency-repeats", type=int, default=15, help="timed calls per median for c")
    ap.add_argument("--json", default=None, help="write all raw numbers to this file")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table for bench/RESULTS.md")
    args = ap.parse_args()
    if args.prune is None:
        args.prune = [parse_plan(p) for p in DEFAULT_PRUNE]
    if args.n < 1:
        sys.exit("bench/twig.py: --n must be >= 1")

    try:
        target = load_model(ModelSpec(model=args.target, device=args.device), "target")
    except ModelLoadError as exc:
        sys.exit(f"bench/twig.py: {exc}")
    plan = thread_plan_for(args.threads, load_profile("tinyworld-twig"))
    machine = with_plan(machine_info(target.device), plan)
    cfg = {"target": args.target, "twig": args.twig, "variants_dir": args.variants_dir, "n": args.n,
           "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "threshold": args.threshold,
           "seed": args.seed, "latency_repeats": args.latency_repeats,
           "prune": [[p.keep, p.layer, p.final_wipe] for p in args.prune]}
    print(f"machine: {machine['hardware']} | device {machine['device']} | torch {machine['torch']}"
          f" | transformers {machine['transformers']} | threads {machine['threads']}")
    print(f"target {args.target} | twig {args.twig} | variants {args.variants_dir}")
    print(f"n={args.n} (caption/question alternating), max_new_tokens={args.max_new_tokens}, "
          f"δ=gamma={args.gamma}, θ={args.threshold:g}, seed={args.seed}, greedy\n")

    items, warm = make_items(args.n, args.seed, args.max_new_tokens)
    rows = build_rows(target, args)
    for row in rows:
        row.engine.threads = plan
    raw = run_all(rows, items, warm, target.device)
    lat = measure_c(rows, warm, target.device, args.latency_repeats)
    summary = summarize(rows, raw, items, lat)

    main_table(summary, args.n, args.markdown)
    b = summary[BASELINE]
    print(f"target-only: {b['tokens_per_s']:.0f} tok/s, QA accuracy {fmt(b['qa_acc'], '.2f')}, "
          f"exact captions {fmt(b['caption_exact'], '.2f')}; T_p (one target decode step) "
          f"{statistics.median([r['target_step_ms'] for r in lat.values()]) if lat else float('nan'):.2f} ms "
          f"(median over rows)")
    bad = {n: r["mismatches"] for n, r in summary.items() if r["config"].get("lossless") and r["mismatches"]}
    if bad:
        print(f"\nWARNING: lossless rows differ from target-only greedy decoding: {bad}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"config": cfg, "machine": machine,
             "requests": [{"id": it.request.request_id, "kind": it.kind,
                           "prompt": it.request.messages[0].text, "answer": it.answer} for it in items],
             "rows": summary}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
