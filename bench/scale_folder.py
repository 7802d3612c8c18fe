"""``bench/scale.py --folder``: a folder's throughput, target-only batched against each
method batched, in one run on the same inputs.

The inputs: examples/images/*.png, then crops of scikit-learn's two sample photos
(benchlib.photo_set, from ``--photos-from``) up to ``--inputs``, with four prompts in turn
(so prompts, images and outputs differ in length). The target is the shipped profiles'
32-layer tinyworld Llava target; ``--methods`` draft for it with its shipped companions
(chain: llava-deep-draft reading the image; tabed: the same draft reading it as image
and as text, TABED's MT* ensemble with grid weights, each row its own; hidden:
llava-deep-hidden; eagle3: llava-deep-eagle3; twig: llava-deep-twig on the target's
first 2 layers, θ 0.6 as the shipped profile), all at T = 0 with a fixed γ (``--gamma``, or per method:
``hidden:3``), or with ``drafting.length: auto`` (``hidden:auto``, ceiling ``--gamma``;
``hidden:auto12``, ceiling 12): each row of the batch its own k, plain where drafting
does not pay (round_policy.AutoLength, a fresh one per engine). Trees: ``tree`` (the
chain's draft model grows EAGLE-2 trees), ``hidden-tree`` and ``eagle3-tree`` (the heads'
trees), depth γ (``tree:4``), top_k and nodes from ``--tree-shape`` (default 2,8), each
row's tree verified in the batch's one target forward.

Without ``--photos-from`` the example images are cycled up to ``--inputs`` (the prompts
turn with the index, so a repeated image gets another prompt).

Every (method, B) engine is warmed up once on B inputs, then the passes run interleaved
(pass 1 of every engine, then pass 2, …) so that a shared machine's load drifts over all
of them alike; a row's tokens/s is its generated tokens over its median pass wall time.
Every pass's outputs are checked, input by input, against the single engine's target-only
decoding of that input (``mismatches``: must be 0). The JSON keeps each pass's wall
time, the load average before it and the CPU time stolen by the hypervisor during it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchlib import machine_info, photo_set, print_table, stolen_s
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.loading import (load_eagle3_head, load_hidden_head, load_model,
                                                load_twig)
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.length.draft_length import AutoGamma
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.round.round_policy import AutoLength
from vlmspec_cli.runtime.round.verify import SamplingParams
from vlmspec_cli.zoo import world

ROOT = Path(__file__).resolve().parent.parent
GREEDY = SamplingParams(0.0)
TARGET = "zoo:tinyworld/llava-target-deep"
COMPANIONS = {"chain": "zoo:tinyworld/llava-deep-draft", "hidden": "zoo:tinyworld/llava-deep-hidden",
              "eagle3": "zoo:tinyworld/llava-deep-eagle3", "twig": "zoo:tinyworld/llava-deep-twig"}
PROMPTS = ("describe the image.", "What colour is the background?", world.CAPTION_PROMPTS[1],
           "how many shapes are there?")


def folder_requests(args, tmp: Path) -> tuple[list[str], list[Request]]:
    """(input names, requests): the example images, then photo crops up to ``--inputs``."""
    from PIL import Image

    paths = sorted((ROOT / "examples" / "images").glob("*.png"))[: args.inputs]
    photos = args.inputs - len(paths)
    if photos > 0:
        if not args.photos_from:   # the demo images again, each with the next prompts
            paths = [paths[i % len(paths)] for i in range(args.inputs)]
        else:
            paths += sorted(photo_set(Path(args.photos_from), tmp / "photos", photos).glob("*.png"))
    reqs = [Request([Message("user", PROMPTS[i % len(PROMPTS)], (Image.open(p).convert("RGB"),))],
                    max_new_tokens=args.max_new_tokens) for i, p in enumerate(paths)]
    return [p.name for p in paths], reqs


def companion(method: str, target):
    """The model ``method`` drafts with, next to ``target`` (a tree method: its chain's)."""
    method = method.removesuffix("-tree")
    if method in ("chain", "tree", "tabed"):
        return load_model(ModelSpec(model=COMPANIONS["chain"], device="cpu"), "draft")
    if method == "twig":
        return load_twig(COMPANIONS["twig"], target)
    load = load_hidden_head if method == "hidden" else load_eagle3_head
    return load(COMPANIONS[method], target)


def method_spec(spec: str, gamma: int) -> tuple[str, int, bool]:
    """"hidden" (γ = --gamma), "hidden:3" (γ 3), "hidden:auto" / "hidden:auto12" (auto
    length, ceiling --gamma / 12): (method, γ or ceiling, auto)."""
    name, _, rest = spec.partition(":")
    auto = rest.startswith("auto")
    digits = rest.removeprefix("auto")
    return name, int(digits) if digits else gamma, auto


def drafter_for(method: str, target, model, gamma: int = 5, shape: tuple[int, int] = (2, 8)):
    """``shape``: a tree's (top_k, nodes); its depth is ``gamma``."""
    from vlmspec_cli.drafters.hidden import TreeSettings

    if method == "target-only":
        return None
    if method == "chain":
        return create_drafter("chain", draft=model, sampling=GREEDY, drafting_input="multimodal",
                              image_token=target.adapter.image_token(target))
    if method == "twig":
        return create_drafter("twig", target=target, sampling=GREEDY, layers=2, twig=model,
                              threshold=0.6)
    if method == "tabed":   # MT*: the image and the text-only view, grid weights per row
        return create_drafter("tabed", draft=model, sampling=GREEDY,
                              inputs=["multimodal", "text"], policy="grid",
                              image_token=target.adapter.image_token(target))
    if method == "tree":
        return create_drafter("tree", draft=model, sampling=GREEDY, drafting_input="multimodal",
                              depth=gamma, top_k=shape[0], total_tokens=shape[1],
                              image_token=target.adapter.image_token(target),
                              eos_ids=eos_token_ids(target))
    tree = TreeSettings(gamma, *shape) if method.endswith("-tree") else None
    return create_drafter(method.removesuffix("-tree"), target=target, head=model,
                          sampling=GREEDY, eos_ids=eos_token_ids(target), tree=tree)


def decode(engine: SpeculativeEngine, reqs: list[Request]):
    """Every request through ``engine.run``; (results in request order, wall seconds)."""
    t0 = time.perf_counter()
    out = {id(r): res for r, res in engine.run(reqs, lambda r: r)}
    wall = time.perf_counter() - t0
    results = [out[id(r)] for r in reqs]
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results, wall


def run_folder(args) -> None:
    tmp = tempfile.TemporaryDirectory()
    names, reqs = folder_requests(args, Path(tmp.name))
    target = load_model(ModelSpec(model=TARGET, device="cpu"), "target")
    # "hidden:3": a method at its own γ (default --gamma); "hidden:auto12": auto, ceiling 12
    methods = [("target-only", 1, False)] + [method_spec(m, args.gamma)
                                             for m in args.methods.split(",") if m]
    models = {m: companion(m, target) for m in {m for m, _, _ in methods[1:]}}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    shape = tuple(int(x) for x in args.tree_shape.split(","))
    single = SpeculativeEngine(target, None, 1, GREEDY)
    single.generate(reqs[0])   # warm-up
    t0 = time.perf_counter()
    ref = [single.generate(r).tokens for r in reqs]
    single_wall = time.perf_counter() - t0
    engines = {}
    for m, gamma, auto in methods:
        name = (f"{m} γ auto≤{gamma}" if auto else
                m if m == "target-only" or len({(g, a) for n, g, a in methods if n == m}) == 1
                else f"{m} γ={gamma}")
        for b in sizes:
            drafter = drafter_for(m, target, models.get(m), gamma, shape)
            engines[(name, b)] = SpeculativeEngine(target, drafter, gamma, GREEDY, b)
            if auto:
                engines[(name, b)].use_policy(
                    AutoLength(AutoGamma(gamma, feed_size=drafter.feed_size)))
            decode(engines[(name, b)], reqs[:b])   # warm-up at this batch size
    passes = {key: [] for key in engines}
    for n in range(args.passes):
        for key, engine in engines.items():
            load, steal = os.getloadavg()[0], stolen_s()
            results, wall = decode(engine, reqs)
            steal = None if steal is None else round(stolen_s() - steal, 3)
            wrong = [name for name, r, t in zip(names, results, ref) if r.tokens != t]
            stats = [r.state.stats for r in results]
            passes[key].append({"wall_s": round(wall, 3), "load_before": round(load, 2),
                                "stolen_s": steal, "mismatches": wrong,
                                "new_tokens": sum(len(r.tokens) for r in results),
                                "accepted": sum(s.num_accepted_tokens for s in stats),
                                "rounds": sum(s.num_drafts for s in stats)})
            print(f"  pass {n + 1} {key[0]} B={key[1]}: {wall:.2f} s", file=sys.stderr)
    rows = _rows(passes, single_wall, sum(map(len, ref)))
    _report(args, names, rows, passes)


def _rows(passes: dict, single_wall: float, single_tokens: int) -> list[dict]:
    rows = [{"row": "target-only, single engine", "tokens_per_s": round(single_tokens / single_wall, 1),
             "vs_target_only": None, "tau": None, "mismatches": 0, "median_wall_s": round(single_wall, 3)}]
    base = {}
    for (m, b), runs in passes.items():
        wall = statistics.median(p["wall_s"] for p in runs)
        tps = runs[0]["new_tokens"] / wall
        if m == "target-only":
            base[b] = tps
        rounds, accepted = runs[0]["rounds"], runs[0]["accepted"]
        rows.append({"row": f"{m} B={b}", "method": m.split(" ")[0], "batch_size": b,
                     "tokens_per_s": round(tps, 1),
                     "vs_target_only": round(tps / base[b], 3) if b in base else None,
                     "tau": round((accepted + rounds) / rounds, 2) if m != "target-only" else None,
                     "mismatches": sum(len(p["mismatches"]) for p in runs),
                     "median_wall_s": round(wall, 3), "new_tokens": runs[0]["new_tokens"]})
    return rows


def _report(args, names: list[str], rows: list[dict], passes: dict) -> None:
    info = machine_info(torch.device("cpu"))
    info["load_average"] = os.getloadavg()
    print(f"# bench/scale.py --folder — {info['hardware']}, torch {info['torch']}, "
          f"{info['threads']} threads, load average {info['load_average'][0]:.2f}; "
          f"{len(names)} inputs, ≤{args.max_new_tokens} new tokens, γ fixed ({args.gamma} unless a row "
          f"names its own; \"auto\": chosen per row, up to its ceiling), "
          f"{args.passes} interleaved passes (median)\n")
    header = ["row", "tokens/s", "× target-only (same B)", "τ", "≠ ref (all passes)"]
    lines = [[r["row"], f"{r['tokens_per_s']:.1f}",
              "-" if r["vs_target_only"] is None else f"{r['vs_target_only']:.2f}",
              "-" if r["tau"] is None else f"{r['tau']:.2f}", str(r["mismatches"])] for r in rows]
    print_table("folder throughput", header, lines, args.markdown)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": info, "args": vars(args), "inputs": names, "rows": rows,
             "passes": {f"{m} B={b}": runs for (m, b), runs in passes.items()}}, indent=1))
