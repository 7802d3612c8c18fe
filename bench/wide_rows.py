"""A target's verifications on its weights laid out (in, out) against its own modules
(runtime/fast/wide_rows.py), side by side in one process.

Loads the profile's session (default: the demo's), then

1. times the target's forwards of n new rows after a demo scene's prompt (n = 1: a plain
   step, which never takes the copies; n > 1: a chain's verification), with the copies and
   without, interleaved in ``--rounds`` blocks at the decoding thread count, and the
   largest difference between the two ways' logits (and the logits' scale); and a one-row
   step forced onto the copies, which no path takes (target-only decoding stays on the
   modules, bit for bit transformers'): how much of a speedup the kernel alone would give;
2. decodes the demo images ``--passes`` times, each pass four blocks in rotating order:
   target-only, the method verifying on the copies, the method on the modules, and
   target-only with its steps forced onto the copies (no path runs it) (each block
   every image through one engine, so no block runs right after another's requests):
   the median wall per variant (prefill included), target-only's median over each
   method's, per pass the same ratio, and whether every output equals target-only's.

    python bench/wide_rows.py [--profile tinyworld-caption] [--passes 9] [--rounds 5]
                              [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine_info, stolen_s  # noqa: E402  (bench/benchlib.py)

ROWS = (1, 2, 4, 8, 13)


def forward_times(session, image, rounds: int, steps: int = 40) -> dict:
    import torch

    target = session.target
    fast, wide = target.fast, target.fast.wide
    request = request_for(session, image)
    inputs = target.adapter.encode(target, session.engine._new_state(request).prompt, [image])
    cache = fast.new_cache()
    with torch.inference_mode():
        target.adapter.prefill(target, inputs, cache)
    start = cache.length
    ids = {n: torch.arange(10, 10 + n)[None] for n in ROWS}
    times = {(n, way): [] for n in ROWS for way in ("copies", "modules")}
    times[(1, "copies, forced")] = []
    session.threads.enter("decode", start)
    for _ in range(rounds):
        for way in ("copies", "modules", "copies, forced"):
            fast.wide = None if way == "modules" else wide
            if way == "copies, forced":   # a one-row step on the copies: no path runs it
                fast._wide_rows = lambda n, start: wide[0]   # (target-only would, if it may)
            try:
                for n in ROWS if way != "copies, forced" else (1,):
                    for _ in range(steps):
                        cache.length = start
                        t = time.perf_counter()
                        target.adapter.extend(target, ids[n], cache)
                        times[(n, way)].append(time.perf_counter() - t)
            finally:
                fast.__dict__.pop("_wide_rows", None)
    logits = {}
    for way in ("copies", "modules"):
        fast.wide = wide if way == "copies" else None
        cache.length = start
        logits[way] = target.adapter.extend(target, ids[8], cache)
    fast.wide = wide
    return {"prompt_positions": start,
            "median_ms": {f"{n} rows, {way}": round(statistics.median(v) * 1e3, 3)
                          for (n, way), v in times.items()},
            "max_abs_diff_8_rows": float((logits["copies"] - logits["modules"]).abs().max()),
            "max_abs_logit": float(logits["modules"].abs().max())}


def request_for(session, image):
    from vlmspec_cli.runtime.request import Message, Request

    p = session.profile
    return Request([Message("user", "describe the image.", (image,))],
                   max_new_tokens=p.generation.max_new_tokens, seed=p.sampling.seed)


def decode_block(session, images, variant: str) -> dict:
    """Every image through one engine: target-only, or the method verifying on the copies
    or on the modules (the rest of the process is the same); "target-only on copies":
    target-only with its one-row steps forced onto the copies (no path runs it: what
    target-only would take if it gave up being transformers' computation bit for bit)."""
    fast = session.target.fast
    keep = fast.wide
    fast.wide = None if variant == "modules" else keep
    if variant == "target-only on copies":   # every forward after the prompt, one row too
        fast._wide_rows = lambda n, start: keep[0] if start > 0 else None
    engine = session.baseline_engine() if variant.startswith("target-only") else session.engine
    wall = 0.0
    tokens = []
    lost = stolen_s()
    try:
        for image in images:
            res = engine.generate(request_for(session, image))
            wall += res.state.stats.wall_s
            tokens.append(res.tokens)
    finally:
        fast.wide = keep
        fast.__dict__.pop("_wide_rows", None)
    after = stolen_s()
    return {"variant": variant, "wall_s": round(wall, 4), "tokens": tokens,
            "stolen_cpu_s": None if lost is None or after is None else round(after - lost, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tinyworld-caption")
    ap.add_argument("--passes", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()

    from PIL import Image

    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.session import build_session

    session = build_session(load_profile(args.profile))
    if session.target.fast is None or session.target.fast.wide is None:
        sys.exit(f"{args.profile}'s target has no (in, out) copies (not a CPU, or too large)")
    images = [Image.open(p).convert("RGB") for p in sorted((ROOT / "examples/images").glob("*.png"))]
    load_before = os.getloadavg()
    forwards = forward_times(session, images[0], args.rounds)
    variants = ("target-only", "copies", "modules", "target-only on copies")
    for v in variants:                               # warm every engine
        decode_block(session, images[:1], v)
    blocks = []
    for i in range(args.passes):                     # each pass: the four, order rotating
        for v in variants[i % 4:] + variants[: i % 4]:
            blocks.append(dict(decode_block(session, images, v), block=i))
    reference = next(b["tokens"] for b in blocks if b["variant"] == "target-only")
    summary = {}
    for v in variants:
        walls = [b["wall_s"] for b in blocks if b["variant"] == v]
        summary[v] = {"median_wall_s": round(statistics.median(walls), 4), "walls_s": walls,
                      "identical": all(b["tokens"] == reference for b in blocks
                                       if b["variant"] == v)}
    base = summary["target-only"]["median_wall_s"]
    for v in ("copies", "modules", "target-only on copies"):
        summary[v]["speedup_of_medians"] = round(base / summary[v]["median_wall_s"], 4)
        # per pass: target-only's wall over the variant's in the same pass
        summary[v]["per_pass"] = [round(t["wall_s"] / b["wall_s"], 4) for t, b in zip(
            [b for b in blocks if b["variant"] == "target-only"],
            [b for b in blocks if b["variant"] == v])]
    # the method on the copies against target-only had it taken them too
    summary["copies"]["over_target_only_on_copies"] = round(
        summary["target-only on copies"]["median_wall_s"] / summary["copies"]["median_wall_s"], 4)
    for b in blocks:
        del b["tokens"]
    out = {"machine": machine_info(session.target.device),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "command": " ".join(["python", "bench/wide_rows.py"] + sys.argv[1:]),
           "profile": args.profile, "load_before": load_before, "load_after": os.getloadavg(),
           "forwards": forwards, "blocks": blocks, "summary": summary}
    print(f"target forwards after a {forwards['prompt_positions']}-position prompt, median ms:")
    for n in ROWS:
        m = forwards["median_ms"]
        print(f"  {n:2d} rows: copies {m[f'{n} rows, copies']:.3f}  modules {m[f'{n} rows, modules']:.3f}")
    print(f"   1 row forced onto the copies (what target-only would take on them): "
          f"{forwards['median_ms']['1 rows, copies, forced']:.3f}")
    print(f"  8 rows' logits differ by at most {forwards['max_abs_diff_8_rows']:.2e} "
          f"(largest logit {forwards['max_abs_logit']:.2f})")
    print(f"demo ({len(images)} images), median wall of {args.passes} passes: target-only "
          f"{base:.3f} s")
    for v in ("copies", "modules", "target-only on copies"):
        s_ = summary[v]
        print(f"  {v if v.startswith('target') else 'verifying on the ' + v}: "
              f"{s_['median_wall_s']:.3f} s, {s_['speedup_of_medians']:.2f}x "
              f"(per pass {', '.join(f'{x:.2f}' for x in s_['per_pass'])}), identical "
              f"{s_['identical']}")
    print(f"  the method on the copies over target-only on the copies: "
          f"{summary['copies']['over_target_only_on_copies']:.2f}x")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
