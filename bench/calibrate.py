"""Is `vlmspec calibrate`'s choice right? Calibrate on one set of tinyworld scenes, then decode
a fresh set with the calibrated profile, the shipped default and every other shipped caption
profile, in one run, and compare wall time with target-only decoding on the same inputs.

1. ``calibrate`` (tasks/calibrate.py, as the CLI runs it) searches from ``--profile``
   (default tinyworld-caption) on ``--samples`` scenes (seed ``--seed``).
2. On ``--fresh`` other scenes (seed ``--seed`` + 1000), each configuration decodes the whole
   set ``--repeats`` times, configurations taking turns (a slow moment of the machine falls
   on all of them); its wall time is the median. A configuration whose target is not the
   base's (tinyworld-small: the 8-layer target) is reported against its own target-only
   decoding, and marked: its output is another model's.
3. Every lossless configuration's tokens are compared with its target-only tokens.

    python bench/calibrate.py [--profile tinyworld-caption] [--samples 6] [--fresh 12]
                              [--max-new-tokens 48] [--budget 600] [--repeats 3] [--json out.json]
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

from benchlib import machine_info, print_table  # noqa: E402  (bench/benchlib.py)
from vlmspec_cli.profile import load_profile, with_settings  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.session import build_session  # noqa: E402
from vlmspec_cli.tasks.calibrate import as_dicts, calibrate, decode_batched  # noqa: E402
from vlmspec_cli.tasks.calibrate_io import search_base  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402

SHIPPED = ("tinyworld-caption", "tinyworld-hidden", "tinyworld-twig", "tinyworld-tabed",
           "tinyworld-small")


def scenes(n: int, seed: int, profile) -> list[Request]:
    rng = random.Random(seed)
    return [Request([Message("user", profile.generation.prompt,
                             (world.render(world.sample_scene(rng)),))],
                    max_new_tokens=profile.generation.max_new_tokens, seed=0, request_id=f"{seed}:{i}")
            for i in range(n)]


def decode_all(session, requests) -> tuple[float, list[list[int]], int, int]:
    """(wall s, tokens per request, new tokens, target forwards) — batched when the profile
    says so."""
    captioner = getattr(session.engine.drafter, "captioner", None)
    if captioner is not None:    # repeats must not find the captions of the last one
        captioner.forget()
    t0 = time.perf_counter()
    if session.profile.generation.batch_size > 1 and session.profile.method != "none":
        results = decode_batched(session, requests)
    else:
        results = [session.engine.generate(r) for r in requests]
    wall = time.perf_counter() - t0
    tokens = [res.tokens for res in results]
    forwards = sum(max(1, res.state.stats.num_drafts) for res in results)
    return wall, tokens, sum(len(t) for t in tokens), forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="tinyworld-caption")
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--fresh", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gammas", default="1,2,3,4,5,6,8")
    ap.add_argument("--budget", type=float, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cli = {"generation.max_new_tokens": args.max_new_tokens}
    base, note = search_base(load_profile(args.profile, cli=cli))
    t0 = time.perf_counter()
    result = calibrate(base, scenes(args.samples, args.seed, base),
                       gammas=[int(g) for g in args.gammas.split(",")], captioner_ok=note is None,
                       budget_s=args.budget, progress=lambda m: print(f"  {m}", file=sys.stderr))
    calibrate_s = time.perf_counter() - t0
    winner = result.winner
    print(f"calibrated in {calibrate_s:.0f} s: {winner.label}", file=sys.stderr)

    configs = {"calibrated": with_settings(base, winner.settings)}
    configs.update({name: load_profile(name, cli=cli) for name in SHIPPED})
    sessions = {name: build_session(p) for name, p in configs.items()}
    fresh = scenes(args.fresh, args.seed + 1000, base)
    baselines = {}          # target model -> its target-only session (once per target)
    for name, s in sessions.items():
        baselines.setdefault(s.profile.target.model, s.baseline_engine())
    for s in sessions.values():          # warm-up
        s.engine.generate(fresh[0])
    walls = {name: [] for name in [*sessions, *[f"target-only {t}" for t in baselines]]}
    out_tokens, forwards, new = {}, {}, {}
    order = list(walls)
    for rep in range(args.repeats):
        for name in order[rep % len(order):] + order[:rep % len(order)]:
            if name.startswith("target-only "):
                engine = baselines[name[len("target-only "):]]
                t = time.perf_counter()
                toks = [engine.generate(r).tokens for r in fresh]
                wall, n, f = time.perf_counter() - t, sum(map(len, toks)), sum(map(len, toks))
            else:
                wall, toks, n, f = decode_all(sessions[name], fresh)
            walls[name].append(wall)
            out_tokens[name], new[name], forwards[name] = toks, n, f
    rows, report = [], []
    for name, s in sessions.items():
        ref = f"target-only {s.profile.target.model}"
        wall, base_wall = statistics.median(walls[name]), statistics.median(walls[ref])
        row = {"config": name, "method": s.profile.method, "target": s.profile.target.model,
               "wall_s": round(wall, 3), "target_only_wall_s": round(base_wall, 3),
               "speedup": round(base_wall / wall, 3), "tokens_per_s": round(new[name] / wall, 1),
               "tau": round(new[name] / max(1, forwards[name]), 3),
               "mismatches": sum(a != b for a, b in zip(out_tokens[name], out_tokens[ref])),
               "same_target_as_base": s.profile.target.model == base.target.model,
               "walls_s": [round(w, 3) for w in walls[name]]}
        report.append(row)
        mark = "" if row["same_target_as_base"] else " (other target)"
        rows.append([name + mark, row["method"], f"{row['speedup']:.2f}x", f"{row['tokens_per_s']:.0f}",
                     f"{row['tau']:.2f}", str(row["mismatches"])])
    print_table(f"calibrated on {args.samples} scenes ({calibrate_s:.0f} s): {winner.label}; "
                f"{args.fresh} fresh scenes, median of {args.repeats}",
                ["config", "method", "speedup vs its target-only", "tok/s", "τ", "mismatches"], rows, True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine_info(sessions["calibrated"].target.device), "args": vars(args),
            "calibrate_s": round(calibrate_s, 1), "winner": winner.label,
            "winner_settings": winner.settings, "latency": result.latency, "skipped": result.skipped,
            "candidates": as_dicts(result.candidates), "fresh": report}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
