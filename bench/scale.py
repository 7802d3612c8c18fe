"""Throughput of batched speculative decoding (B = 1, 2, 4, 8) and of quantized models, on
fresh tinyworld requests, side by side in one run.

Rows, all on the same requests (greedy), for each target precision (--precisions):
  target-only B=b      the batched engine without a draft (SpeculativeEngine.run)
  chain (M) B=b        the batched engine with the tinyworld Llava draft reading the image
  single engine        the one-request-at-a-time engine (engine.py), target-only and chain:
                       B=1 of the batched engine should cost about the same
and, at full precision:
  selfquant B=b        the full target drafted by its own 4-bit (nf4) copy
  HF generate B=b      transformers' own batched greedy generate() on the same target
                       (left-padded prompts; HF assisted generation takes one request at a
                       time, so it has no batched row)

Columns: tokens/s = generated tokens of all requests / wall time of the whole set (the
engine admits a new request as soon as a row finishes); ×B1 = tokens/s over the same
method's B=1 row; τ = mean acceptance length; ≠ ref = requests whose output differs from
the single engine's target-only greedy decoding at the same precision (must be 0 for
every vlmspec row; the HF rows are reported as measured); memory = model weights
(get_memory_footprint), target + draft.

    python bench/scale.py [--n 16] [--max-new-tokens 48] [--batch-sizes 1,2,4,8]
                          [--precisions none,int8,nf4] [--fast-paths off,on] [--threads 2]
                          [--json out.json] [--markdown]

``--folder``: a folder instead (bench/scale_folder.py): examples/images and crops of the
sample photos (``--photos-from``, benchlib.photo_set) captioned by the shipped profiles'
32-layer target, target-only and each method (``--methods``: chain, tabed, hidden, eagle3, twig) at
each batch size (trees too: tree, hidden-tree, eagle3-tree), interleaved over ``--passes``, every output checked against the single
engine's target-only decoding, row by row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch  # noqa: E402

from benchlib import machine_info, print_table  # noqa: E402
from conftest import fresh_scenes  # noqa: E402  (tests/conftest.py: fresh tinyworld scenes)
from vlmspec_cli.drafters import create_drafter  # noqa: E402
from vlmspec_cli.profile import ModelSpec  # noqa: E402
from vlmspec_cli.runtime.round.engine import SpeculativeEngine  # noqa: E402
from vlmspec_cli.runtime.models.loading import load_model, use_fast_path  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.runtime.round.verify import SamplingParams  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402

GREEDY = SamplingParams(0.0)
TARGET, DRAFT = "zoo:tinyworld/llava-target", "zoo:tinyworld/llava-draft"


def make_requests(n: int, max_new: int, seed: int) -> list[Request]:
    prompts = [world.CAPTION_PROMPTS[0], "What colour is the background?", world.CAPTION_PROMPTS[1]]
    return [Request([Message("user", prompts[i % 3], (image,))], max_new_tokens=max_new)
            for i, (_, image) in enumerate(fresh_scenes(n, seed=seed))]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_single(target, draft, gamma, reqs):
    drafter = (create_drafter("none") if draft is None else
               create_drafter("chain", draft=draft, sampling=GREEDY, drafting_input="multimodal",
                              image_token=target.adapter.image_token(target)))
    engine = SpeculativeEngine(target, drafter, gamma, GREEDY)
    engine.generate(reqs[0])  # warm-up
    return timed(lambda: [engine.generate(r) for r in reqs])


def run_batched(target, draft, gamma, reqs, batch_size):
    drafter = None if draft is None else create_drafter(
        "chain", draft=draft, sampling=GREEDY, drafting_input="multimodal",
        image_token=target.adapter.image_token(target))
    engine = SpeculativeEngine(target, drafter, gamma, GREEDY, batch_size)
    list(engine.run(reqs[:batch_size], lambda r: r))  # warm-up at this batch size

    def go():
        out = {id(r): res for r, res in engine.run(reqs, lambda r: r)}
        return [out[id(r)] for r in reqs]
    return timed(go)


def run_hf(target, reqs, batch_size):
    """transformers' batched greedy generate() on left-padded prompts (target only)."""
    proc, lm = target.processor, target.model
    proc.tokenizer.padding_side = "left"
    prompts = [target.adapter.prompt_text(target, r.messages) for r in reqs]

    def go():
        outs = []
        for i in range(0, len(reqs), batch_size):
            enc = proc(images=[im for r in reqs[i:i + batch_size] for im in r.images],
                       text=prompts[i:i + batch_size], return_tensors="pt", padding=True)
            with torch.inference_mode():
                ids = lm.generate(**enc, do_sample=False, max_new_tokens=reqs[0].max_new_tokens,
                                  pad_token_id=proc.tokenizer.pad_token_id or 0)
            for row in ids[:, enc["input_ids"].shape[1]:].tolist():
                eos = target.tokenizer.eos_token_id
                outs.append(row[: row.index(eos) + 1] if eos in row else row)
        return outs
    go() if batch_size == 1 else None
    return timed(go)


def row(name, results, wall, ref_tokens, memory, base_tps=None):
    tokens = [r if isinstance(r, list) else r.tokens for r in results]
    new = sum(len(t) for t in tokens)
    stats = [r.state.stats for r in results if not isinstance(r, list)]
    drafts = sum(s.num_drafts for s in stats)
    tau = (sum(s.num_accepted_tokens for s in stats) + drafts) / drafts if drafts else None
    tps = new / wall
    return {"row": name, "tokens_per_s": round(tps, 1),
            "vs_B1": round(tps / base_tps, 2) if base_tps else 1.0,
            "tau": round(tau, 2) if tau and any(s.num_draft_tokens for s in stats) else None,
            "mismatches": sum(t != ref for t, ref in zip(tokens, ref_tokens)),
            "memory_mb": round(memory / 2**20, 2), "wall_s": round(wall, 3), "new_tokens": new}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--precisions", default="none,int8,nf4")
    ap.add_argument("--fast-paths", default="on",
                    help="runtime.fast_path values to run every vlmspec row with (off,on)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--folder", action="store_true",
                    help="a folder of images and photos, target-only and --methods (above)")
    ap.add_argument("--methods", default="chain,hidden,eagle3")
    ap.add_argument("--photos-from", default=None,
                    help="the folder holding china.jpg and flower.jpg (scikit-learn's samples)")
    ap.add_argument("--inputs", type=int, default=64, help="--folder: images + photo crops")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--tree-shape", default="2,8",
                    help="--folder: the tree methods' top_k,nodes (depth: γ)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.folder:
        from scale_folder import run_folder

        return run_folder(args)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    reqs = make_requests(args.n, args.max_new_tokens, args.seed)
    draft = load_model(ModelSpec(model=DRAFT, device="cpu"), "draft")
    rows = []
    for precision, path in [(p, f) for p in args.precisions.split(",")
                            for f in args.fast_paths.split(",")]:
        target = load_model(ModelSpec(model=TARGET, device="cpu", quantize=precision),
                            fast_path=path)
        use_fast_path(draft, path)
        t_mem = target.model.get_memory_footprint()
        label = ("fp32" if precision == "none" else precision) + f" [{path}]"
        ref, wall = run_single(target, None, 1, reqs)
        ref_tokens = [r.tokens for r in ref]
        rows.append(row(f"{label} target-only, single engine", ref, wall, ref_tokens, t_mem))
        res, wall = run_single(target, draft, args.gamma, reqs)
        rows.append(row(f"{label} chain (M), single engine", res, wall, ref_tokens,
                        t_mem + draft.model.get_memory_footprint()))
        variants = [("target-only", None), ("chain (M)", draft)]
        if precision == "none":
            variants.append(("selfquant (nf4 draft)",
                             load_model(ModelSpec(model=TARGET, device="cpu", quantize="nf4"), "draft",
                                        fast_path=path)))
        for name, d in variants:
            base = None
            for b in sizes:
                res, wall = run_batched(target, d, args.gamma, reqs, b)
                mem = t_mem + (d.model.get_memory_footprint() if d is not None else 0)
                rows.append(row(f"{label} {name} B={b}", res, wall, ref_tokens, mem,
                                base["tokens_per_s"] if base else None))
                base = base or rows[-1]
                print(f"  {rows[-1]['row']}: {rows[-1]['tokens_per_s']} tok/s", file=sys.stderr)
        if precision == "none" and path == args.fast_paths.split(",")[0]:
            base = None
            for b in sizes:
                res, wall = run_hf(target, reqs, b)
                rows.append(row(f"HF generate B={b}", res, wall, ref_tokens, t_mem,
                                base["tokens_per_s"] if base else None))
                base = base or rows[-1]
    info = machine_info(torch.device("cpu"))
    print(f"# bench/scale.py — {info['hardware']}, torch {info['torch']}, transformers "
          f"{info['transformers']}, {info['threads']} threads; {args.n} requests, "
          f"≤{args.max_new_tokens} new tokens, γ={args.gamma}\n")
    header = ["row", "tokens/s", "×B1", "τ", "≠ ref", "memory MB"]
    lines = [[r["row"], f"{r['tokens_per_s']:.1f}", f"{r['vs_B1']:.2f}",
              "-" if r["tau"] is None else f"{r['tau']:.2f}", str(r["mismatches"]),
              f"{r['memory_mb']:.2f}"] for r in rows]
    print_table("throughput", header, lines, args.markdown)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
