"""TABED Table 1/2-style benchmark on fresh tinyworld inputs: block efficiency τ of every
drafting method in every input scenario, and the measured wall speedup over target-only.

Rows (drafting methods, TABED Tables 1 and 2): the single drafting inputs M, T, C, P
(method ``chain``), the static ensembles MT and MTCP (equal weights) and the adaptive ones
MT* (grid policy) and MTCP* (softmax policy), all with the one tinyworld draft model.
Columns (scenarios): a 1st turn (one image; caption prompt or question, alternating), a
2nd turn (text follow-up after an image exchange), a 2-image difference, a 5-image story
(out of distribution for a single-image draft) and an unrelated text task after an image
turn. Decoding is greedy, so every output must equal the target-only output; the bench
counts the ones that do not.

Eq. 1 per row (the paper's headline model): speedup = τ / (γ·c + 1) with c = T_q(m)/T_p,
T_p one target decoding step and T_q(m) one draft step over the m rows the method drafts
with (1 for a single input, 2 for MT, 4 for MTCP), both measured here before the run
(runtime/fast/latency.py, at the 1st-turn prompt's length). Eq. 1 models neither prefill nor
the captioner's caption, nor verification costing more than one step; measured ÷ Eq. 1
shows how much of that model the engine reaches. The static ensembles (MT, MTCP: equal
weights) are compared with the adaptive ones (MT*, MTCP*) column by column.

    python bench/tabed.py [--profile NAME] [--n 10] [--max-new-tokens 48] [--gamma 5]
                          [--threads N] [--seed 0] [--window all] [--distance kl]
                          [--grid 10] [--json out.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

from benchlib import THREADS_HELP, machine_info, thread_plan_for, with_plan, print_table  # noqa: E402  (bench/benchlib.py)
from vlmspec_cli.drafters import create_drafter  # noqa: E402
from vlmspec_cli.profile import ProfileError, load_profile  # noqa: E402
from vlmspec_cli.runtime.models.captioner import Captioner  # noqa: E402
from vlmspec_cli.runtime.round.engine import SpeculativeEngine  # noqa: E402
from vlmspec_cli.runtime.fast.latency import measure_tables  # noqa: E402
from vlmspec_cli.runtime.models.loading import ModelLoadError, check_compatible, load_model  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.runtime.stats import SpecStats  # noqa: E402
from vlmspec_cli.runtime.round.verify import SamplingParams  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402

GREEDY = SamplingParams(0.0)
BASELINE = "target-only"
SEED_BASE = 777000  # far from the build's training (1) and evaluation (10000) seeds
ALL4 = ["multimodal", "text", "caption", "pooled"]
# row name -> (method, create_drafter kwargs, takes the --window/--distance/--grid options)
ROWS = {
    "M": ("chain", {"drafting_input": "multimodal"}, False),
    "T": ("chain", {"drafting_input": "text"}, False),
    "C": ("chain", {"drafting_input": "caption"}, False),
    "P": ("chain", {"drafting_input": "pooled"}, False),
    "MT": ("tabed", {"inputs": ["multimodal", "text"], "policy": "static"}, True),
    "MT*": ("tabed", {"inputs": ["multimodal", "text"], "policy": "grid"}, True),
    "MTCP": ("tabed", {"inputs": ALL4, "policy": "static"}, True),
    "MTCP*": ("tabed", {"inputs": ALL4, "policy": "softmax"}, True),
}
SCENARIOS = ("1st turn", "2nd turn", "multi-image", "5-image OOD", "text task")
TABLE1_ROWS = ("M", "T", "MT", "MT*")                  # the rows the paper's Table 1 ranks
TABLE2_ROWS = ("M", "T", "C", "P", "MTCP", "MTCP*")    # the rows of its Table 2


# -- inputs --------------------------------------------------------------------------
def first_turn(rng: random.Random, i: int) -> list[Message]:
    scene = world.sample_scene(rng)
    if i % 2 == 0:
        text = world.CAPTION_PROMPTS[(i // 2) % len(world.CAPTION_PROMPTS)]
    else:
        text = rng.choice(world.qa_pairs(scene, rng))[0]
    return [Message("user", text, (world.render(scene),))]


def conversation_prompt(rng: random.Random, kind: str) -> list[Message]:
    """A sampled conversation up to (not including) its last assistant answer. For
    ``text_task`` it is resampled until an image turn precedes the task (the world also
    makes text tasks with no image, which belong to no column here)."""
    while True:
        turns = world.sample_conversation(rng, kind)[:-1]
        if kind != "text_task" or any(t.images for t in turns):
            return [Message(t.role, t.text, tuple(t.images)) for t in turns]


def make_scenarios(n: int, seed: int, max_new: int) -> dict[str, list[Request]]:
    """n fresh requests per scenario; each scenario has its own RNG, so --n does not shift
    the inputs of the other columns."""
    kinds = {"2nd turn": "followup", "multi-image": "difference", "5-image OOD": "story",
             "text task": "text_task"}
    out = {}
    for k, name in enumerate(SCENARIOS):
        rng = random.Random(SEED_BASE + seed * 100 + k)
        msgs = [first_turn(rng, i) if name == "1st turn" else conversation_prompt(rng, kinds[name])
                for i in range(n)]
        out[name] = [Request(m, max_new_tokens=max_new, request_id=f"{name}/{i}")
                     for i, m in enumerate(msgs)]
    return out


# -- engines and timing --------------------------------------------------------------
def build_engines(target, draft, captioner, gamma: int, options: dict) -> dict[str, SpeculativeEngine]:
    image_token = target.adapter.image_token(target)
    engines = {BASELINE: SpeculativeEngine(target, create_drafter("none"), 1, GREEDY)}
    for row, (method, kw, tunable) in ROWS.items():
        kwargs = dict(kw, **options) if tunable else dict(kw)
        drafter = create_drafter(method, draft=draft, sampling=GREEDY, captioner=captioner,
                                 image_token=image_token, **kwargs)
        engines[row] = SpeculativeEngine(target, drafter, gamma, GREEDY)
    return engines


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_all(engines: dict, scenarios: dict, device: torch.device, captioner=None) -> dict:
    """Warm every engine up once, then run every request with every engine. Per request
    the engines take turns in a rotated order, so drift in machine load and cache effects
    spread over all rows alike. The rows drafting from captions share one captioner, whose
    cache would let whichever of them runs first pay for every caption of a request (the
    rotation made that MTCP 4 times in 9, MTCP* once): it is emptied before every timed
    request, so each row pays for the captions of its own requests."""
    warm = next(iter(scenarios.values()))[0]
    for engine in engines.values():
        engine.generate(warm)
    names = list(engines)
    raw = {name: {s: {"seconds": [], "tokens": [], "stats": SpecStats(), "weights": []}
                  for s in scenarios} for name in names}
    for s, requests in scenarios.items():
        for i, req in enumerate(requests):
            for name in names[i % len(names):] + names[:i % len(names)]:
                if captioner is not None:
                    captioner.forget()
                sync(device)
                t0 = time.perf_counter()
                res = engines[name].generate(req)
                sync(device)
                cell = raw[name][s]
                cell["seconds"].append(time.perf_counter() - t0)
                cell["tokens"].append(res.tokens)
                cell["stats"].merge(res.state.stats)
                if res.state.stats.ensemble:
                    cell["weights"].extend(res.state.stats.ensemble["block_weights"])
        print(f"  done: {s} ({len(requests)} requests)", file=sys.stderr)
    return raw


def summarize(raw: dict) -> dict:
    """Per row and scenario: τ, speedup over target-only, tokens/s, mismatches."""
    base = raw[BASELINE]
    out = {}
    for name, cells in raw.items():
        row = {}
        for s, c in cells.items():
            tokens, seconds = sum(map(len, c["tokens"])), sum(c["seconds"])
            weights = torch.tensor(c["weights"]).mean(0).tolist() if c["weights"] else None
            row[s] = {"tau": c["stats"].mean_accept_len, "new_tokens": tokens, "seconds": seconds,
                      "tokens_per_s": tokens / seconds,
                      "speedup": sum(base[s]["seconds"]) / seconds,
                      "mismatches": sum(a != b for a, b in zip(c["tokens"], base[s]["tokens"])),
                      "mean_weights": [round(w, 3) for w in weights] if weights else None,
                      "stats": c["stats"].to_dict(), "per_request_s": [round(x, 5) for x in c["seconds"]]}
        tokens = sum(r["new_tokens"] for r in row.values())
        seconds = sum(r["seconds"] for r in row.values())
        base_seconds = sum(sum(c["seconds"]) for c in base.values())
        row["all"] = {"tau": sum(r["tau"] for r in row.values()) / len(row),  # mean over columns
                      "tokens_per_s": tokens / seconds, "speedup": base_seconds / seconds,
                      "mismatches": sum(r["mismatches"] for r in row.values())}
        out[name] = row
    return out


def draft_rows(row: str) -> int:
    """How many rows the row's draft forwards carry (TABED drafts its inputs as a batch)."""
    method, kw, _ = ROWS[row]
    return len(kw["inputs"]) if method == "tabed" else 1


def latency(target, draft, request: Request) -> dict:
    """T_p (one target step) and T_q(B) for the batch sizes the rows draft with, in ms, at
    the context length of ``request``'s prompt."""
    enc = target.adapter.encode(target, target.adapter.prompt_text(target, request.messages),
                                list(request.images))
    s0 = int(enc["input_ids"].shape[1])
    tables = measure_tables(target, draft, [s0], [1], sorted({draft_rows(r) for r in ROWS}),
                            warmup=3, repeats=15)
    return {"context": s0, "target_step_ms": tables.target_verify_ms[s0][1],
            "draft_step_ms": {b: row[s0] for b, row in tables.draft_step_ms.items()}}


def add_eq1(rows: dict, lat: dict, gamma: int) -> None:
    """Eq. 1 = τ / (γ·c + 1), c = T_q(rows)/T_p, per row and column, and measured ÷ Eq. 1."""
    for r in ROWS:
        c = lat["draft_step_ms"][draft_rows(r)] / lat["target_step_ms"]
        for cell in rows[r].values():
            cell["c"] = c
            cell["eq1"] = cell["tau"] / (gamma * c + 1)
            cell["measured_over_eq1"] = cell["speedup"] / cell["eq1"]


# -- reporting -----------------------------------------------------------------------
def ranks(values: dict[str, float]) -> dict[str, int]:
    """1 for the best, 2 for the second best, 0 otherwise; compared as printed (2 decimals),
    so rows that print the same value share a rank."""
    shown = {k: round(v, 2) for k, v in values.items()}
    levels = sorted(set(shown.values()), reverse=True)
    return {k: (levels.index(v) + 1 if levels.index(v) < 2 else 0) for k, v in shown.items()}


def mark(text: str, rank: int, markdown: bool) -> str:
    if markdown:
        return {1: f"**{text}**", 2: f"_{text}_"}.get(rank, text)
    return text + {1: " *", 2: " +"}.get(rank, "  ")


def tau_table(rows: dict, markdown: bool) -> None:
    cols = list(SCENARIOS) + ["all"]
    rank = {c: ranks({r: rows[r][c]["tau"] for r in ROWS}) for c in cols}
    lines = [[r] + [mark(f"{rows[r][c]['tau']:.2f}", rank[c][r], markdown) for c in cols] for r in ROWS]
    legend = "bold" if markdown else "*"
    print_table(f"Block efficiency τ (mean accept length, target token included; {legend} best, "
                f"{'italic' if markdown else '+'} second per column; 'all' = mean of the columns)",
                ["method"] + cols, lines, markdown)


def speed_table(rows: dict, markdown: bool) -> None:
    cols = list(SCENARIOS) + ["all"]
    rank = {c: ranks({r: rows[r][c]["speedup"] for r in ROWS}) for c in cols}
    lines = [[BASELINE] + [mark("1.00x", 0, markdown)] * len(cols)
             + [f"{rows[BASELINE]['all']['tokens_per_s']:.0f}", "–"]]
    for r in ROWS:
        lines.append([r] + [mark(f"{rows[r][c]['speedup']:.2f}x", rank[c][r], markdown) for c in cols]
                     + [f"{rows[r]['all']['tokens_per_s']:.0f}", str(rows[r]["all"]["mismatches"])])
    print_table("Measured wall speedup over target-only (same requests, same process; tok/s over "
                "all columns; ≠ greedy: outputs differing from target-only)",
                ["method"] + cols + ["tok/s", "≠ greedy"], lines, markdown)


def eq1_table(rows: dict, markdown: bool) -> None:
    cols = list(SCENARIOS) + ["all"]
    lines = [[r, f"{rows[r]['all']['c']:.3f}"]
             + [f"{rows[r][c]['eq1']:.2f} / {rows[r][c]['measured_over_eq1']:.2f}" for c in cols]
             for r in ROWS]
    print_table("Eq. 1 = τ/(γc+1) per cell, then measured ÷ Eq. 1 (c = T_q(rows)/T_p, measured "
                "before the run)", ["method", "c"] + cols, lines, markdown)


def static_vs_adaptive(rows: dict) -> str:
    """Where the adaptive ensemble beats its static twin, in τ and in measured speed."""
    parts = []
    for static, adaptive in (("MT", "MT*"), ("MTCP", "MTCP*")):
        tau_wins = [c for c in SCENARIOS if rows[adaptive][c]["tau"] > rows[static][c]["tau"]]
        fast_wins = [c for c in SCENARIOS if rows[adaptive][c]["speedup"] > rows[static][c]["speedup"]]
        parts.append(f"{adaptive} over static {static}: higher τ in {len(tau_wins)}/{len(SCENARIOS)}"
                     f" columns ({', '.join(tau_wins) or 'none'}), faster in {len(fast_wins)}/"
                     f"{len(SCENARIOS)} ({', '.join(fast_wins) or 'none'}); τ all "
                     f"{rows[adaptive]['all']['tau']:.2f} vs {rows[static]['all']['tau']:.2f}")
    return "Static vs adaptive weights. " + ". ".join(parts) + "."


def claim_check(rows: dict) -> str:
    """TABED's claim: the adaptive ensemble is best or second best in every scenario."""
    parts = []
    for row, own in (("MT*", TABLE1_ROWS), ("MTCP*", TABLE2_ROWS)):
        among_all = [ranks({r: rows[r][c]["tau"] for r in ROWS})[row] for c in SCENARIOS]
        among_own = [ranks({r: rows[r][c]["tau"] for r in own})[row] for c in SCENARIOS]
        misses = [c for c, k in zip(SCENARIOS, among_all) if not k]
        parts.append(
            f"{row} is best or second best in {sum(1 for k in among_all if k)}/{len(SCENARIOS)} "
            f"columns among all rows (best in {among_all.count(1)})"
            + (f", missing in {', '.join(misses)}" if misses else "")
            + f"; among its paper table's rows ({', '.join(own)}) in "
            f"{sum(1 for k in among_own if k)}/{len(SCENARIOS)}")
    fastest = [c for c in SCENARIOS
               if max(TABLE2_ROWS, key=lambda r: rows[r][c]["speedup"]) == "MTCP*"]
    verdict = all(ranks({r: rows[r][c]["tau"] for r in TABLE1_ROWS})["MT*"] for c in SCENARIOS)
    return ("Claim check (TABED Table 1: MT* always best or second best in τ; Table 2: MTCP* "
            "the highest speedup). " + ". ".join(parts) + ". "
            f"MTCP* has the highest measured speedup of the Table 2 rows in {len(fastest)}/"
            f"{len(SCENARIOS)} columns. On these models and inputs the Table 1 claim "
            f"{'holds' if verdict else 'does not hold'} for MT*.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None, help="profile name or YAML path (default tinyworld-caption)")
    ap.add_argument("--n", type=int, default=10, help="requests per scenario")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=5, help="draft tokens per block")
    ap.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    ap.add_argument("--seed", type=int, default=0, help="picks the fresh inputs")
    ap.add_argument("--device", default=None, help="override the profile's device (cpu, cuda, ...)")
    ap.add_argument("--window", default="all", help="tabed rows: verified positions weighed (h or all)")
    ap.add_argument("--distance", default="kl", choices=("kl", "tvd"), help="tabed rows: D")
    ap.add_argument("--grid", type=int, default=10, help="tabed rows: n of the grid policy")
    ap.add_argument("--json", default=None, help="write all raw numbers to this file")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables for bench/RESULTS.md")
    args = ap.parse_args()

    cli = {f"{role}.device": args.device for role in ("target", "draft", "captioner")}
    try:
        profile = load_profile(args.profile, cli=cli)
        target, draft = load_model(profile.target, "target"), load_model(profile.draft, "draft")
        check_compatible(target, draft, needs_images=True)
        captioner = Captioner(load_model(profile.captioner, "captioner"), profile.captioner.prompt,
                              profile.captioner.max_new_tokens)
    except (ProfileError, ModelLoadError) as exc:
        sys.exit(f"bench/tabed.py: {exc}")
    window = args.window if args.window == "all" else int(args.window)
    options = {"window": window, "distance": args.distance, "grid": args.grid}
    plan = thread_plan_for(args.threads, profile)
    machine = with_plan(machine_info(target.device), plan)
    cfg = {"profile": profile.source, "target": profile.target.model, "draft": profile.draft.model,
           "captioner": profile.captioner.model, "n": args.n, "max_new_tokens": args.max_new_tokens,
           "gamma": args.gamma, "seed": args.seed, "captioner_cache": "emptied before every timed request",
           **options}
    print(f"machine: {machine['hardware']} | device {machine['device']} | torch {machine['torch']}"
          f" | transformers {machine['transformers']} | threads {machine['threads']}")
    print(f"profile {cfg['profile']} | target {cfg['target']} | draft {cfg['draft']} | "
          f"captioner {cfg['captioner']}")
    print(f"n={args.n} per scenario, max_new_tokens={args.max_new_tokens}, gamma={args.gamma}, "
          f"seed={args.seed}, greedy; tabed window={window} distance={args.distance} grid={args.grid}\n")

    scenarios = make_scenarios(args.n, args.seed, args.max_new_tokens)
    engines = build_engines(target, draft, captioner, args.gamma, options)
    for engine in engines.values():
        engine.threads = plan
    lat = latency(target, draft, scenarios[SCENARIOS[0]][0])
    print(f"T_p = {lat['target_step_ms']:.2f} ms, T_q(B) = "
          + ", ".join(f"{b}: {v:.2f}" for b, v in lat["draft_step_ms"].items())
          + f" ms (context {lat['context']} tokens)\n")
    rows = summarize(run_all(engines, scenarios, target.device, captioner))
    add_eq1(rows, lat, args.gamma)

    tau_table(rows, args.markdown)
    speed_table(rows, args.markdown)
    eq1_table(rows, args.markdown)
    for r in ("MT*", "MTCP*"):
        weights = "; ".join(f"{c} {rows[r][c]['mean_weights']}" for c in SCENARIOS)
        print(f"mean block weights {r} ({'/'.join(ROWS[r][1]['inputs'])}): {weights}")
    print()
    print(static_vs_adaptive(rows))
    print(claim_check(rows))
    bad = sum(rows[r]["all"]["mismatches"] for r in ROWS)
    if bad:
        print(f"\nWARNING: {bad} outputs differ from target-only greedy decoding", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"config": cfg, "machine": machine, "latency": lat, "scenarios": list(SCENARIOS),
             "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
