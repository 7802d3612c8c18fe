"""describe-video at long context: what one verification costs, and what the hidden head's
draft step holds, as the video grows.

For each frame count on one fresh tinyworld video (profile tinyworld-video, the 24-layer
target), after the prompt:
  - T_p(n): one target forward of n = 1, 2, γ+1 tokens through the runtime
    (``adapter.extend`` on the fast path), cropped back after each; median of 15;
  - the same sizes through PyTorch's attention alone (``scaled_dot_product_attention``
    over the target's cached keys/values, every layer, causal mask): the part of T_p
    that grows with the cache;
  - the hidden head's cache after the prompt (positions held, capacity) and its draft step.

    python bench/long_context.py --frames 4,64,1024 --json bench/runs/$(date -u +%F)/long-context-cpu.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchlib import machine_info, timed
from vlmspec_cli.profile import load_profile
from vlmspec_cli.session import build_session
from video import requests

CPU = torch.device("cpu")


def ms(fn) -> float:
    """Median milliseconds of fn() over 15 calls after 5 untimed ones."""
    return round(timed(fn, CPU, repeats=15, warmup=5), 3)


def attention_only(cache, n: int) -> float:
    """Every layer's attention of n new queries over the cache (keys/values as cached)."""
    length = cache.length
    keys, values = cache.keys[:, :, :, :length], cache.values[:, :, :, :length]
    layers, batch, heads, _, dim = keys.shape
    q = torch.randn(batch, heads, n, dim, dtype=keys.dtype)
    mask = torch.ones(n, length, dtype=torch.bool).tril(length - n)

    def run():
        for i in range(layers):
            F.scaled_dot_product_attention(q, keys[i], values[i], attn_mask=mask)
    return ms(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", default="4,64,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    session = build_session(load_profile("tinyworld-video", cli={"target.device": "cpu"}))
    lm, drafter = session.target, session.engine.drafter
    gamma = session.profile.drafting.gamma
    rows = []
    for frames in [int(f) for f in args.frames.split(",")]:
        state = session.engine.start(requests(1, frames, args.seed)[0][0])
        cache, head = state.target_cache, state.drafter_state
        row = {"frames": frames, "cached_positions": cache.length}
        for n in (1, 2, gamma + 1):
            ids = torch.ones((1, n), dtype=torch.long)

            def extend():
                lm.adapter.extend(lm, ids, cache)
                cache.crop(-n)
            row[f"T_p({n}) ms"] = ms(extend)
            row[f"attention({n}) ms"] = attention_only(cache, n)
        row[f"T_p({gamma + 1})/T_p(1)"] = round(row[f"T_p({gamma + 1}) ms"] / row["T_p(1) ms"], 2)
        h = head.rows[-1]

        def head_step():
            drafter._run(head, [1], h[None], step=1)
            head.cache.crop(-1)
        row["head_cache_positions"] = head.cache.length
        row["head_cache_capacity"] = head.cache.keys.shape[3]
        row["head_step ms"] = ms(head_step)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"machine": machine_info(CPU),
                       "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
