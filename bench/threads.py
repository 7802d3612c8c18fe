"""CPU thread counts side by side: every shipped tinyworld profile's method and target-only
decoding at each ``runtime.threads``, in one process, on the same inputs.

For each profile and thread count the profile is built with ``--set runtime.threads=N
--set runtime.prefill_threads=N`` (as a user would; one count for both phases), then
``--split`` adds the shipped split (the profile's own runtime.threads while decoding,
torch's default count while prefilling) and its target-only engine alongside; per input the configurations take
turns, so load drift hits them alike. Reports per configuration the wall time of the
whole set, the speedup over target-only at the same count, and how each count compares
with the fastest one, and checks every output equals target-only.

    python bench/threads.py [--threads 1,2] [--profiles tinyworld-caption,...] [--n 8]
                            [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from benchlib import machine_info, print_table  # noqa: E402  (bench/benchlib.py)
from vlmspec_cli.profile import load_profile  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.runtime.threads import ThreadPlan  # noqa: E402
from vlmspec_cli.session import build_session  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402

PROFILES = ("tinyworld-caption", "tinyworld-hidden", "tinyworld-twig", "tinyworld-tabed",
            "tinyworld-image", "tinyworld-video")


def make_requests(session, n: int, seed: int) -> list[Request]:
    """n fresh inputs of the profile's task: scenes (caption), tinyworld clips of 8 frames
    (video) or generation prompts (image)."""
    p = session.profile
    rng = random.Random(seed)
    if p.task == "video":
        from video import requests as video_requests   # bench/video.py
        return [req for req, _ in video_requests(n, 8, seed)]
    if p.task == "image":
        from vlmspec_cli.tasks.imagegen import ImageJob, image_request
        from vlmspec_cli.zoo import imagegen as zoo_image
        prompts = [zoo_image.sample_prompt_scene(rng)[0] for _ in range(n)]
        return [image_request(session, ImageJob("bench", text, i, 0, seed + i))
                for i, text in enumerate(prompts)]
    return [Request([Message("user", p.generation.prompt, (world.render(world.sample_scene(rng)),))],
                    max_new_tokens=p.generation.max_new_tokens, request_id=str(i))
            for i in range(n)]


def run_profile(name: str, counts: list[int], n: int, repeats: int, seed: int,
                split: bool) -> list[dict]:
    sessions = {k: build_session(load_profile(name, [f"runtime.threads={k}",
                                                     f"runtime.prefill_threads={k}"]))
                for k in counts}
    if split:   # the profile as shipped: e.g. 1 thread decoding, torch's default prefilling
        shipped = build_session(load_profile(name))
        plan = shipped.threads
        sessions[f"{plan.decode}/{plan.prefill}" if plan.decode else "auto"] = shipped
    configs = []   # (label, threads, engine, session)
    for k, s in sessions.items():
        configs += [("target-only", k, s.baseline_engine(), s), (s.profile.method, k, s.engine, s)]
    requests = make_requests(next(iter(sessions.values())), n, seed)
    times = {i: [] for i in range(len(configs))}
    outputs = {i: [] for i in range(len(configs))}
    for r in range(repeats + 1):        # pass 0 warms every configuration up
        walls = {i: 0.0 for i in range(len(configs))}
        for j, req in enumerate(requests):
            order = list(range(len(configs)))
            order = order[j % len(order):] + order[:j % len(order)]
            for i in order:
                label, k, engine, session = configs[i]
                t0 = time.perf_counter()
                res = engine.generate(req)
                walls[i] += time.perf_counter() - t0
                if r == 0:
                    outputs[i].append(res.tokens)
        if r > 0:
            for i in walls:
                times[i].append(walls[i])
    rows = []
    for i, (label, k, _, _) in enumerate(configs):
        base = next(j for j, c in enumerate(configs) if c[1] == k and c[0] == "target-only")
        wall = statistics.median(times[i])
        rows.append({"profile": name, "config": label, "threads": k, "wall_s": round(wall, 4),
                     "walls_s": [round(t, 4) for t in times[i]],
                     "speedup": round(statistics.median(times[base]) / wall, 3),
                     "tokens": sum(map(len, outputs[i])),
                     "differ": sum(a != b for a, b in zip(outputs[i], outputs[base]))})
    for row in rows:
        fastest = min(r["wall_s"] for r in rows if r["config"] == row["config"])
        row["vs_fastest_count"] = round(row["wall_s"] / fastest, 3)
    return rows


def time_ops(counts: list[int], frames: list[int]) -> list[dict]:
    """Where thread counts matter, per count: one 128-wide linear layer over 1, 2 and 6
    rows (the shapes of drafting and verifying), one step and one 6-row verification of
    the 32-layer caption target after its sample prompt, and prefills (that prompt;
    tinyworld videos of ``frames`` frames)."""
    from benchlib import timed
    from vlmspec_cli.tasks.hwprofile import sample_request
    from video import requests as video_requests   # bench/video.py

    caption = build_session(load_profile("tinyworld-caption"))
    video = build_session(load_profile("tinyworld-video"))
    for s in (caption, video):
        s.set_threads(ThreadPlan())      # this function sets the counts itself
    target, cpu = caption.target, torch.device("cpu")
    prompt_req = sample_request(caption.profile)
    videos = {k: video_requests(1, k, 7)[0][0] for k in frames}
    out = []
    with torch.inference_mode():
        for n in counts:
            torch.set_num_threads(n)
            row = {"threads": n}
            for width in (384, 128):
                lin = torch.nn.Linear(128, width, bias=False)
                for rows in (1, 2, 6):
                    x = torch.randn(1, rows, 128)
                    row[f"linear_128x{width}_{rows}rows_us"] = round(
                        1000 * timed(lambda: lin(x), cpu, repeats=2000, warmup=200), 2)
            state = caption.baseline_engine().start(prompt_req)
            cache, base = state.target_cache, state.target_cache.get_seq_length()
            for k in (1, 6):
                ids = torch.full((1, k), 5)

                def step():
                    target.adapter.extend(target, ids, cache)
                    cache.crop(base)
                row[f"target_step_{k}rows_ms"] = round(timed(step, cpu, repeats=30, warmup=5), 3)
            row["caption_prefill_ms"] = round(timed(lambda: prefill(caption, prompt_req),
                                                    cpu, repeats=7, warmup=2), 2)
            for k, req in videos.items():
                reps = 3 if k > 100 else 7
                row[f"video_{k}_frames_prefill_ms"] = round(
                    timed(lambda: prefill(video, req), cpu, repeats=reps, warmup=1), 1)
            out.append(row)
    return out


def prefill(session, request) -> None:
    """One target-only prefill, its cache then handed back as a finished request's is."""
    engine = session.baseline_engine()
    engine.finish(engine.start(request))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="thread counts (comma-separated)")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--n", type=int, default=8, help="inputs per profile")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes (median)")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--split", action="store_true",
                    help="also the profile as shipped (threads decoding / prefilling)")
    ap.add_argument("--ops", action="store_true",
                    help="time operators, steps and prefills per count instead (time_ops)")
    ap.add_argument("--frames", default="8,256,1024", help="--ops: video lengths prefilled")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    counts = [int(k) for k in args.threads.split(",")]
    if args.ops:
        ops = time_ops(counts, [int(k) for k in args.frames.split(",")])
        keys = list(ops[0])
        print_table("per thread count (linear: µs per call; steps and prefills: ms, medians)",
                    keys, [[str(r[k]) for k in keys] for r in ops], markdown=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": machine_info(torch.device("cpu")),
                                                   "args": vars(args), "ops": ops}, indent=2))
        return
    rows = []
    for name in args.profiles.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] {name}", file=sys.stderr, flush=True)
        rows += run_profile(name, counts, args.n, args.repeats, args.seed, args.split)
    machine = machine_info(torch.device("cpu"))
    machine["threads"] = counts
    print(f"machine: {machine['hardware']} | torch {machine['torch']} | transformers "
          f"{machine['transformers']} | thread counts {counts}; {args.n} inputs per profile, "
          f"median of {args.repeats} passes")
    print_table("wall time of the whole set per thread count (speedup: over target-only at the "
                "same count; × fastest: over the same configuration at its fastest count)",
                ["profile", "config", "threads", "wall s", "speedup", "× fastest", "tokens", "≠ target-only"],
                [[r["profile"], r["config"], str(r["threads"]), f"{r['wall_s']:.3f}",
                  f"{r['speedup']:.2f}x", f"{r['vs_fastest_count']:.2f}", str(r["tokens"]),
                  str(r["differ"])] for r in rows], markdown=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "args": vars(args), "rows": rows},
                                              indent=2))


if __name__ == "__main__":
    main()
