"""describe-video in batches: the tinyworld Qwen2.5-VL video target (3-D positions, each
video its own rope offset) decoding a folder of fresh videos of mixed lengths one at a time
(B = 1) and B at a time, per method, in one run.

For each method (target-only, the plain draft reading the video, the hidden-state head's
chains) and each B: videos/s and new tokens/s over the whole folder (wall time of
``SpeculativeEngine.run``, after one untimed warm-up batch), passes interleaved (B = 1, 4,
8, then again), the best pass kept; and how many outputs differ from the same video
decoded alone (0 at T = 0: each row's tokens are its own).

  python bench/video_batch.py --n 16 --frames 4,8,12,16 --batch-sizes 1,4,8 --passes 2
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from benchlib import machine_info, print_table
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session
from vlmspec_cli.tasks.video_io import clip_from_arrays
from vlmspec_cli.zoo import video as world

METHODS = {"target-only": ["method=none"],
           "chain M (plain draft reads the video)": ["method=chain", "drafting.inputs=[multimodal]"],
           "hidden head (chains)": ["method=hidden"]}


def folder(n: int, frames: list[int], seed: int, max_new_tokens: int) -> list[Request]:
    """n fresh videos (seeds the zoo never trained on), frame counts cycling ``frames``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        f = frames[i % len(frames)]
        clip = clip_from_arrays(world.render_script(world.random_script(rng), f),
                                fps=f / world.DURATION)
        out.append(Request([Message("user", world.QUESTIONS[i % 3], videos=(clip,))],
                           max_new_tokens=max_new_tokens))
    return out


def decode(session, reqs: list[Request], b: int) -> tuple[float, list[list[int]]]:
    engine = session.batched_engine(b)
    list(engine.run(reqs[:b], lambda r: r))          # warm-up at this B (untimed)
    t0 = time.perf_counter()
    done = {id(r): res for r, res in engine.run(reqs, lambda r: r)}
    wall = time.perf_counter() - t0
    bad = [res for res in done.values() if isinstance(res, Exception)]
    if bad:
        raise bad[0]
    return wall, [done[id(r)].tokens for r in reqs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--frames", default="4,8,12,16")
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=61)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    frames = [int(x) for x in args.frames.split(",")]
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    reqs = folder(args.n, frames, args.seed, args.max_new_tokens)
    device = {"target.device": args.device, "draft.device": args.device}
    rows, alone = [], None
    for name, sets in METHODS.items():
        session = build_session(load_profile("tinyworld-video", sets, cli=device))
        best: dict[int, float] = {}
        outputs: dict[int, list[list[int]]] = {}
        for _ in range(args.passes):
            for b in sizes:
                wall, outs = decode(session, reqs, b)
                best[b] = min(best.get(b, float("inf")), wall)
                outputs[b] = outs
        if alone is None:
            alone = outputs[sizes[0]] if sizes[0] == 1 else None
        tokens = sum(len(t) for t in outputs[sizes[0]])
        for b in sizes:
            differ = sum(o != a for o, a in zip(outputs[b], alone)) if alone else None
            rows.append({"method": name, "B": b, "wall_s": round(best[b], 3),
                         "videos_per_s": round(args.n / best[b], 3),
                         "tokens_per_s": round(tokens / best[b], 1),
                         "vs_B1_same_method": round(best[sizes[0]] / best[b], 2),
                         "vs_target_only_B1": None, "outputs_differ": differ})
    base = next(r["wall_s"] for r in rows if r["method"] == "target-only" and r["B"] == sizes[0])
    for r in rows:
        r["vs_target_only_B1"] = round(base / r["wall_s"], 2)
    header = list(rows[0])
    print_table("describe-video batched (tinyworld video target)", header,
                [[str(r[h]) for h in header] for r in rows], markdown=True)
    info = {"machine": machine_info(torch.device(args.device)), "args": vars(args), "rows": rows}
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(info, fh, indent=1)


if __name__ == "__main__":
    main()
