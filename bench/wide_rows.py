"""A target's verifications on its weights laid out (in, out) against its own modules
(runtime/wide_rows.py), side by side in one process.

Loads the profile's session (default: the demo's), then

1. times the target's forwards of n new rows after a demo scene's prompt (n = 1: a plain
   step, which never takes the copies; n > 1: a chain's verification), with the copies and
   without, interleaved in ``--rounds`` blocks at the decoding thread count, and the
   largest difference between the two ways' logits (and the logits' scale);
2. decodes the demo images ``--passes`` times, each pass with the copies and without, in
   alternating order, and target-only decoding beside each (its plain steps are the
   same either way): per pass and variant the speedup (target-only wall over the method's,
   prefill included, as ``--compare`` prints it), the mean acceptance length, whether every
   output equals target-only's.

    python bench/wide_rows.py [--profile tinyworld-caption] [--passes 5] [--rounds 5]
                              [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
    session.threads.enter("decode", start)
    for _ in range(rounds):
        for way in ("copies", "modules"):
            fast.wide = wide if way == "copies" else None
            for n in ROWS:
                for _ in range(steps):
                    cache.length = start
                    t = time.perf_counter()
                    target.adapter.extend(target, ids[n], cache)
                    times[(n, way)].append(time.perf_counter() - t)
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


def decode_pass(session, images, wide) -> dict:
    fast = session.target.fast
    keep = fast.wide
    fast.wide = keep if wide else None
    method_s = target_s = 0.0
    tokens = rounds = 0
    identical = True
    try:
        for image in images:
            request = request_for(session, image)
            base = session.baseline_engine().generate(request)
            res = session.engine.generate(request)
            target_s += base.state.stats.wall_s
            method_s += res.state.stats.wall_s
            identical &= res.tokens == base.tokens
            tokens += len(res.tokens)
            rounds += res.state.stats.num_drafts
    finally:
        fast.wide = keep
    return {"copies": wide, "speedup": round(target_s / method_s, 4),
            "method_s": round(method_s, 4), "target_only_s": round(target_s, 4),
            "tokens_per_round": round(tokens / max(rounds, 1), 3), "identical": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tinyworld-caption")
    ap.add_argument("--passes", type=int, default=5)
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
    decode_pass(session, images[:1], True)          # warm both engines
    passes = []
    for i in range(args.passes):
        for wide in ((True, False) if i % 2 == 0 else (False, True)):
            passes.append(decode_pass(session, images, wide))
    summary = {}
    for wide in (True, False):
        mine = [p for p in passes if p["copies"] == wide]
        summary["copies" if wide else "modules"] = {
            "speedup_overall": round(sum(p["target_only_s"] for p in mine)
                                     / sum(p["method_s"] for p in mine), 4),
            "per_pass": [p["speedup"] for p in mine],
            "identical": all(p["identical"] for p in mine)}
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version()},
           "command": " ".join(["python", "bench/wide_rows.py"] + sys.argv[1:]),
           "profile": args.profile, "load_before": load_before, "load_after": os.getloadavg(),
           "forwards": forwards, "passes": passes, "summary": summary}
    print(f"target forwards after a {forwards['prompt_positions']}-position prompt, median ms:")
    for n in ROWS:
        m = forwards["median_ms"]
        print(f"  {n:2d} rows: copies {m[f'{n} rows, copies']:.3f}  modules {m[f'{n} rows, modules']:.3f}")
    print(f"  8 rows' logits differ by at most {forwards['max_abs_diff_8_rows']:.2e} "
          f"(largest logit {forwards['max_abs_logit']:.2f})")
    for name, s in summary.items():
        print(f"demo, verifying on the {name}: {s['speedup_overall']:.2f}x "
              f"(passes {', '.join(f'{x:.2f}' for x in s['per_pass'])}), identical {s['identical']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
