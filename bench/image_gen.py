"""Image-generation speed benchmark (ADT-Tree paper, Table I columns) on tinyworld prompts.

On the same prompts and seeds, in one process: HF Janus ``generate(generation_mode="image")``
(the target alone), vlmspec target-only, a static tree, an EAGLE-2 dynamic tree, ADT-Tree
(horizontal init; also vertical and random with --all-inits) and ADT-Tree + relaxed
acceptance (LANTERN, lossy). Reports wall time, speedup SR vs vlmspec target-only, τ (mean
tokens per target forward, bonus included), mean tree depth d̄ and width, Eq. 1's
prediction τ / (d̄·T_q/T_p + 1) with the measured latency ratio, and for every row how many
images differ from target-only (must be 0 for the lossless rows at T = 0) and how many show
the prompt's colours (zoo.imagegen.image_matches).

HF assisted generation has no image mode for Janus (its image loop is its own), so there is
no HF speculative row here.

    python bench/image_gen.py [--n 12] [--threads 2] [--temperature 0] [--seed 0]
                              [--all-inits] [--heatmap out.png] [--json out.json]
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
from vlmspec_cli.profile import load_profile  # noqa: E402
from vlmspec_cli.session import build_session  # noqa: E402
from vlmspec_cli.tasks.imagegen import ImageJob, image_request, render  # noqa: E402
from vlmspec_cli.zoo import imagegen as zoo_image  # noqa: E402

ROWS = [  # (label, profile overrides)
    ("vlmspec target-only", ["method=none"]),
    ("static tree (d=4, k=4)", ["method=tree", "tree.policy=static"]),
    ("EAGLE-2 dynamic tree (d=4, k=4, N=32)", ["method=tree", "tree.policy=dynamic"]),
    ("ADT-Tree (horizontal)", ["method=adt", "adaptive_tree.init=horizontal"]),
    ("ADT-Tree + relaxed (lossy)", ["method=adt", "acceptance=relaxed"]),
]
EXTRA_INITS = [("ADT-Tree (vertical)", ["method=adt", "adaptive_tree.init=vertical"]),
               ("ADT-Tree (random)", ["method=adt", "adaptive_tree.init=random"])]


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(lm, steps: int = 30) -> float:
    """Median time of one cached image-token step (both CFG rows) after a prompt."""
    ad = lm.adapter
    times = []
    for _ in range(3):
        cache = ad.new_cache(lm)
        ad.prefill(lm, ad.encode(lm, ad.prompt_text(lm, [_msg("a red circle")]), None), cache)
        tok = torch.tensor([[1]], device=lm.device)
        for _ in range(steps):
            sync(lm.device)
            t0 = time.perf_counter()
            ad.extend(lm, tok, cache)
            sync(lm.device)
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _msg(text):
    from vlmspec_cli.runtime.request import Message

    return Message("user", text)


def hf_generate(session, prompt: str) -> tuple[list[int], float]:
    lm = session.target
    ad = lm.adapter
    ids = ad.prompt_ids(lm, ad.prompt_text(lm, [_msg(prompt)]))[:1]
    gen = lm.model.generation_config
    gen.generation_kwargs = {"boi_token_id": ad._special(lm, "boi_token_id")}
    sync(lm.device)
    t0 = time.perf_counter()
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                            do_sample=False, guidance_scale=ad.guidance_scale(lm))
    sync(lm.device)
    return out[0].tolist(), time.perf_counter() - t0


def time_rows(sessions: list, cases: list, args) -> dict:
    """Each prompt by every row in turn (interleaved, so drift in machine load hits all
    rows alike): per row its wall time, stats, tokens, colour matches and tree shapes."""
    runs = {label: {"wall": 0.0, "stats": [], "tokens": [], "matches": 0, "depth": [], "width": []}
            for label, _ in sessions}
    for i, (prompt, scene) in enumerate(cases):
        for label, session in sessions:
            run = runs[label]
            job = ImageJob("bench", prompt, i, 0, args.seed + i)
            sync(session.target.device)
            t0 = time.perf_counter()
            res = session.engine.generate(image_request(session, job))
            sync(session.target.device)
            run["wall"] += time.perf_counter() - t0
            run["tokens"].append(res.tokens)
            st = res.state.stats
            run["stats"].append(st)
            trees = st.trees or {}
            run["depth"] += trees.get("depths", [])
            run["width"] += trees.get("top_ks", [])
            colour = scene.shapes[0].colour
            run["matches"] += zoo_image.image_matches(render(session, res.tokens), colour,
                                                      scene.background)
            if args.heatmap and i == 0 and label.startswith("ADT-Tree (horizontal)"):
                from vlmspec_cli.plot import grid_heatmap

                r, c = session.target.adapter.image_grid(session.target)
                acc = trees["accept_lengths"]
                grid_heatmap([acc[k * c:(k + 1) * c] for k in range(r)]).save(args.heatmap)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--all-inits", action="store_true")
    ap.add_argument("--heatmap", help="write the ADT row's depth matrix of prompt 0 here")
    ap.add_argument("--json")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(10_000 + args.seed)
    cases = [zoo_image.sample_prompt_scene(rng) for _ in range(args.n)]
    rows = ROWS[:4] + (EXTRA_INITS if args.all_inits else []) + ROWS[4:]
    common = [f"sampling.temperature={args.temperature}", f"target.device={args.device}",
              f"draft.device={args.device}"]

    # every row's session first; then each prompt by every row in turn (after one untimed
    # warm-up each), so drift in machine load hits all rows alike
    sessions = [(label, build_session(load_profile("tinyworld-image", overrides=common + overrides)))
                for label, overrides in rows]
    session = sessions[0][1]
    drafted = next((s for _, s in sessions if s.draft is not None), None)
    lat = {"target_ms": step_ms(session.target),
           "draft_ms": step_ms(drafted.draft) if drafted else None}
    hf_tokens, hf_s = [], 0.0
    for prompt, _ in cases:
        toks, secs = hf_generate(session, prompt)
        hf_tokens.append(toks)
        hf_s += secs
    hf_row = {"label": "HF Janus generate (target only)", "wall_s": hf_s, "tokens": hf_tokens}
    for _, s in sessions:
        s.engine.generate(image_request(s, ImageJob("warm-up", cases[0][0], 0, 0, args.seed)))
    runs = time_rows(sessions, cases, args)
    results, reference = [], runs[sessions[0][0]]["tokens"]
    for label, session in sessions:
        run = runs[label]
        stats, tokens, depth, width = run["stats"], run["tokens"], run["depth"], run["width"]
        drafts = sum(s.num_drafts for s in stats)
        tau = sum(s.new_tokens for s in stats) / drafts if drafts else 1.0
        d_bar = sum(depth) / len(depth) if depth else 0.0
        ratio = lat["draft_ms"] / lat["target_ms"] if lat.get("draft_ms") else None
        eq1 = tau / (d_bar * ratio + 1) if ratio and d_bar else None
        results.append({
            "label": label, "wall_s": run["wall"], "tau": tau, "d_bar": d_bar,
            "k_bar": sum(width) / len(width) if width else 0.0,
            "eq1": eq1, "lossless": session.lossless,
            "differ": sum(a != b for a, b in zip(tokens, reference)),
            "differ_tokens": sum(x != y for a, b in zip(tokens, reference) for x, y in zip(a, b)),
            "match": run["matches"],
        })
    base = results[0]["wall_s"]
    hf_row["differ"] = sum(a != b for a, b in zip(hf_row["tokens"], reference))
    lines = [[hf_row["label"], f"{hf_row['wall_s']:.2f}", f"{base / hf_row['wall_s']:.2f}x",
              "1.00", "–", "–", "–", f"{hf_row['differ']}/{args.n}", "–"]]
    for r in results:
        lines.append([r["label"], f"{r['wall_s']:.2f}", f"{base / r['wall_s']:.2f}x",
                      f"{r['tau']:.2f}", f"{r['d_bar']:.2f}" if r["d_bar"] else "–",
                      f"{r['k_bar']:.2f}" if r["k_bar"] else "–",
                      f"{r['eq1']:.2f}" if r["eq1"] else "–",
                      f"{r['differ']}/{args.n} ({r['differ_tokens']} tok)" if r["differ"] else f"0/{args.n}",
                      f"{r['match']}/{args.n}"])
    info = machine_info(session.target.device)
    print(f"# {info['hardware']}, torch {info['torch']}, transformers {info['transformers']}, "
          f"threads {info['threads']}; {args.n} prompts, T={args.temperature}, "
          f"{len(reference[0])} image tokens each; T_q/T_p = "
          f"{lat['draft_ms']:.3f}/{lat['target_ms']:.3f} ms")
    print_table("image generation", ["method", "wall s", "SR", "τ", "d̄", "k̄", "Eq. 1",
                                     "≠ target-only", "colours right"], lines, args.markdown)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "latency": lat, "n": args.n,
                                               "temperature": args.temperature,
                                               "rows": results}, indent=1))


if __name__ == "__main__":
    main()
