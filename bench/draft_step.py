"""A draft's decoding step on packed layers against the eager fast path (runtime/fast/packed_layers.py).

Loads the default profile's draft (or ``--profile``'s), prefills one demo scene's prompt
into two caches, and times ``--steps`` one-token steps of each decoder, interleaved in
``--rounds`` blocks (a slow moment of the machine falls on both), at one thread (the
rounds' count on the demo's CPU). Prints and writes (``--json``) the medians per step and
the largest difference between the two decoders' outputs over a few steps (and the largest
output, its scale).

    python bench/draft_step.py [--profile tinyworld-caption] [--steps 2000] [--rounds 5]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tinyworld-caption")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()

    import torch
    from PIL import Image

    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder
    from vlmspec_cli.runtime.request import Message, Request
    from vlmspec_cli.session import build_session

    torch.set_num_threads(1)
    session = build_session(load_profile(args.profile, ["drafting.length=fixed"]))
    draft = session.engine.drafter.draft
    packed = draft.fast
    if packed is None or packed.packed is None:
        sys.exit(f"{args.profile}'s draft does not decode on packed layers")
    eager = FastDecoder.for_model(draft)
    image = Image.open(ROOT / "examples/images/scene1.png").convert("RGB")
    request = Request([Message("user", "describe the image.", (image,))])
    prompt_text = session.engine._new_state(request).prompt     # the chat template's text
    inputs = draft.adapter.encode(draft, prompt_text, [image])
    prompt = draft.adapter.fast_prompt_embeds(draft, inputs)
    token = draft.fast.embed(torch.tensor([[5]]))
    caches = {}
    with torch.inference_mode():
        for name, dec in (("eager", eager), ("packed", packed)):
            caches[name] = dec.new_cache()
            dec.run(prompt, caches[name])
        worst = scale = 0.0
        for _ in range(8):       # the two decoders' outputs over a few steps
            a, _ = eager.run(token, caches["eager"])
            b, _ = packed.run(token, caches["packed"])
            worst = max(worst, float((a - b).abs().max()))
            scale = max(scale, float(a.abs().max()))
        times: dict[str, list[float]] = {"eager": [], "packed": []}
        for _ in range(args.rounds):
            for name, dec in (("eager", eager), ("packed", packed)):
                cache = caches[name]
                start = cache.length
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    dec.run(token, cache)
                    cache.length = start
                times[name].append((time.perf_counter() - t0) / args.steps * 1e6)
    result = {
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                   f"torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "profile": args.profile, "draft": draft.name, "threads": 1,
        "us_per_step": {k: round(statistics.median(v), 1) for k, v in times.items()},
        "us_per_step_all": {k: [round(x, 1) for x in v] for k, v in times.items()},
        "max_abs_diff": worst, "max_abs_output": scale,
    }
    print(json.dumps(result, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
