"""tinyworld-image (ADT-Tree) at drafting.length fixed and auto, against target-only, in one
process: each prompt by every row in turn (after one untimed warm-up each), over --passes
passes, so drift in machine load hits all rows alike. Prints per row the decode wall time,
speedup vs target-only, rounds (target verifications; the first token comes from the
prefill), and whether every image equals target-only's.

    python bench/runs/2026-12-07/image_length.py [--n 12] [--passes 3] [--draft MODEL]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from vlmspec_cli.profile import load_profile  # noqa: E402
from vlmspec_cli.session import build_session  # noqa: E402
from vlmspec_cli.tasks.imagegen import ImageJob, image_request  # noqa: E402
from vlmspec_cli.zoo import imagegen as zoo_image  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=12)
ap.add_argument("--passes", type=int, default=3)
ap.add_argument("--draft", help="draft.model override (e.g. a useless draft)")
args = ap.parse_args()
extra = [f"draft.model={args.draft}"] if args.draft else []
rows = [("target-only", ["method=none"]), ("adt fixed", ["drafting.length=fixed", *extra]),
        ("adt auto", ["drafting.length=auto", *extra])]
sessions = [(label, build_session(load_profile("tinyworld-image", overrides=o))) for label, o in rows]
rng = random.Random(10_000)
prompts = [zoo_image.sample_prompt_scene(rng)[0] for _ in range(args.n)]
for _, s in sessions:
    s.engine.generate(image_request(s, ImageJob("warm-up", prompts[0], 0, 0, 0)))
wall = {label: 0.0 for label, _ in rows}
rounds = {label: 0 for label, _ in rows}
tokens = {label: [] for label, _ in rows}
for p in range(args.passes):
    for i, prompt in enumerate(prompts):
        order = sessions if (p + i) % 2 == 0 else [sessions[0], sessions[2], sessions[1]]
        for label, s in order:
            t0 = time.perf_counter()
            res = s.engine.generate(image_request(s, ImageJob("b", prompt, i, 0, i)))
            wall[label] += time.perf_counter() - t0
            rounds[label] += res.state.stats.num_drafts
            tokens[label].append(res.tokens)
base = wall["target-only"]
for label, _ in rows:
    same = sum(a == b for a, b in zip(tokens[label], tokens["target-only"]))
    print(f"{label:12} wall {wall[label]:7.2f} s  speedup {base / wall[label]:.2f}x  "
          f"rounds {rounds[label]:5d}  identical {same}/{len(tokens[label])}")
