"""describe-video's decoding rounds on 1 CPU thread against 2, per video length.

For each frame count, the same fresh tinyworld videos decode with target-only and with the
hidden-state head (tinyworld-video), once with the rounds on 1 thread and once on 2 (the
prefill on torch's default either way), and once under the profile's own plan (its
``runtime.long_context``: prompts at least that long decode at the prefill's count). Each
row is the mean decode time per video, the best of ``--repeats`` passes; the passes
alternate the settings. Outputs must equal target-only's under every setting.

    python bench/long_threads.py [--frames 16,64,128,256,1024] [--n 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

from benchlib import machine_info
from video import requests
from vlmspec_cli.profile import load_profile
from vlmspec_cli.session import build_session

METHODS = (("target-only", ["method=none"]), ("hidden head", ["method=hidden"]))
SETTINGS = (("rounds on 1 thread", ["runtime.threads=1", "runtime.long_context=null"]),
            ("rounds on 2 threads", ["runtime.threads=2", "runtime.long_context=null"]),
            ("profile's plan", []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", default="16,64,128,256,1024")
    ap.add_argument("--n", type=int, default=2, help="videos per frame count")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    sessions = {(m, s): build_session(load_profile("tinyworld-video", overrides=mo + so))
                for m, mo in METHODS for s, so in SETTINGS}
    plan = sessions[(METHODS[0][0], SETTINGS[2][0])].threads.describe()
    print(json.dumps(machine_info(next(iter(sessions.values())).target.device)))
    print(f"profile tinyworld-video: {plan}")
    rows = []
    for frames in [int(f) for f in args.frames.split(",")]:
        reqs = [r for r, _ in requests(args.n, frames, args.seed)]
        best, refs, differ = {}, None, 0
        for session in sessions.values():
            session.engine.generate(reqs[0])                      # warm-up
        for _ in range(args.repeats):
            for key, session in sessions.items():
                results = [session.engine.generate(r) for r in reqs]
                refs = refs or [r.tokens for r in results]
                differ += sum(r.tokens != ref for r, ref in zip(results, refs))
                ms = 1000 * sum(r.state.stats.decode_s for r in results) / len(reqs)
                best[key] = min(best.get(key, ms), ms)
        row = {"frames": frames, "differ": differ,
               "decode_ms": {f"{m} / {s}": round(v, 1) for (m, s), v in best.items()}}
        for s, _ in SETTINGS:
            row[f"DSR / {s}"] = round(best[(METHODS[0][0], s)] / best[(METHODS[1][0], s)], 3)
        rows.append(row)
        cells = " | ".join(f"{k} {v}" for k, v in row["decode_ms"].items())
        print(f"{frames:5d} frames: decode ms per video: {cells} | outputs differing: {differ}")
        print("             DSR: " + " | ".join(f"{s} {row[f'DSR / {s}']}" for s, _ in SETTINGS))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"args": vars(args), "plan": plan, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
