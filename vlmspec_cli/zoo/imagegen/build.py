"""tinyworld image generation: ``python -m vlmspec_cli.zoo.imagegen``.

Builds, on CPU and deterministically (~8 min on 2 threads), two Janus text-to-image models
(HF ``JanusForConditionalGeneration``, Llama text model) for the tinyworld scenes: a
6-layer target and a 1-layer draft with one tokenizer and one VQ model (``JanusVQVAE``).

* World: one shape on a background, ``world.render`` at 32 px. Prompts always name the
  shape colour, kind and background, each half the time the size and position; what a
  prompt leaves out is sampled at random, so the models learn a distribution over it.
* VQ: 32 px -> 8x8 codes, codebook 256 x 8 (stored L2-normalised, so HF's raw-argmin
  ``encode`` and its normalising ``decode`` agree). A patch's code is a function of the
  patch alone (``patch_codes``); the decoder and encoder are trained to match it.
* Prompt contract: ``tok("<s>" + prompt, add_special_tokens=False).input_ids + [BOI]``,
  then 64 image tokens. Trained by teacher forcing with 10% condition dropout in Janus'
  form (every token but BOS / BOI -> ``<pad>``), so HF ``generate(generation_mode="image")``
  with classifier-free guidance reproduces training. The draft also distils the target.

Saves ``weights/tinyworld/janus-{target,draft}`` and adds greedy-generation quality and
draft/target agreement to BUILD_REPORT.json (keys janus-vq, janus-target, janus-draft).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoTokenizer, JanusForConditionalGeneration

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.imagegen.generator import image_logits, make_dataset, train_generator
from vlmspec_cli.zoo.imagegen.model import (
    BOI, DRAFT_TEXT, GUIDANCE, TARGET_TEXT, make_model, make_tokenizer, prompt_ids, unconditional,
)
from vlmspec_cli.zoo.imagegen.scenes import (
    GRID, IMAGE_PX, NUM_IMAGE_TOKENS, PATCH, all_scenes, image_matches, palette_labels,
    sample_prompt_scene, to_images, to_pixels,
)
from vlmspec_cli.zoo.imagegen.vq import patch_codes, train_vq, vq_report
from vlmspec_cli.zoo.train import arg_parser, parse_args

# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def guided_argmax(model, ids: torch.Tensor, codes: torch.Tensor, tok, guidance: float) -> torch.Tensor:
    """Greedy CFG choice at every position along ``codes`` (teacher forced)."""
    cond = image_logits(model, ids, codes)
    uncond = image_logits(model, unconditional(ids, tok), codes)
    return (uncond + guidance * (cond - uncond)).argmax(-1)


@torch.no_grad()
def evaluate(target, draft, tok, n: int, seed: int, guidance: float = GUIDANCE,
             sample_dir: Path | None = None) -> dict:
    """Greedy image generation (HF ``generate``) from ``n`` fresh prompts: the share whose
    image matches its prompt, for each model, and how often the draft's greedy token equals
    the target's along the target's greedy sequence (flat background patches vs the rest)."""
    rng = random.Random(seed)
    out = {"prompts": n, "guidance_scale": guidance}
    match, secs = {"target": 0, "draft": 0}, {"target": 0.0, "draft": 0.0}
    agree = {"flat": [0, 0], "shape": [0, 0]}
    replay = 0
    for i in range(n):
        prompt, scene = sample_prompt_scene(rng)
        colour, bg = scene.shapes[0].colour, scene.background
        ids = torch.tensor([prompt_ids(tok, prompt)])
        for name, model in (("target", target), ("draft", draft)):
            t0 = time.time()
            codes = model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                   do_sample=False, guidance_scale=guidance)
            secs[name] += time.time() - t0
            image = to_images(model.decode_image_tokens(codes))[0]
            match[name] += image_matches(image, colour, bg)
            if sample_dir is not None and i < 8:
                sample_dir.mkdir(parents=True, exist_ok=True)
                path = sample_dir / f"{name}_{i}.png"
                image.resize((128, 128), Image.NEAREST).save(path)
                print(f"[eval] {name} {prompt!r} -> {path} match={image_matches(image, colour, bg)}", flush=True)
            if name == "target":
                target_codes, target_image = codes, image
        replay += (guided_argmax(target, ids, target_codes, tok, guidance) == target_codes).float().mean().item()
        same = (guided_argmax(draft, ids, target_codes, tok, guidance) == target_codes)[0].view(GRID, GRID)
        lab = torch.from_numpy(palette_labels(target_image)).view(GRID, PATCH, GRID, PATCH)
        flat = (lab == list(world.BACKGROUNDS).index(bg)).all(3).all(1)
        for key, where in (("flat", flat), ("shape", ~flat)):
            agree[key][0] += int(same[where].sum())
            agree[key][1] += int(where.sum())
    hits, total = agree["flat"][0] + agree["shape"][0], agree["flat"][1] + agree["shape"][1]
    out.update({
        "target_match_rate": match["target"] / n, "draft_match_rate": match["draft"] / n,
        "draft_target_greedy_agreement": round(hits / total, 4),
        "agreement_flat_background": round(agree["flat"][0] / max(1, agree["flat"][1]), 4),
        "agreement_shape_patches": round(agree["shape"][0] / max(1, agree["shape"][1]), 4),
        "shape_patch_share": round(agree["shape"][1] / total, 4),
        "teacher_forced_replay_of_hf_generate": round(replay / n, 4),
        "target_generate_s": round(secs["target"] / n, 3), "draft_generate_s": round(secs["draft"] / n, 3),
    })
    return out


def _size(model, path: Path) -> dict:
    return {"params": sum(p.numel() for p in model.parameters()),
            "text_layers": model.config.text_config.num_hidden_layers,
            "disk_mb": round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 2)}


def _evaluate_into(report: dict, target, draft, tok, args) -> None:
    m = evaluate(target, draft, tok, args.eval_prompts, seed=10_000 + args.seed, sample_dir=args.samples)
    for role in ("target", "draft"):
        report[f"janus-{role}"].update({"guidance_scale": m["guidance_scale"], "eval_prompts": m["prompts"],
                                        "match_rate": m[f"{role}_match_rate"],
                                        "generate_s_per_image": m[f"{role}_generate_s"]})
    report["janus-target"]["teacher_forced_replay_of_hf_generate"] = m["teacher_forced_replay_of_hf_generate"]
    report["janus-draft"].update({k: m[k] for k in ("draft_target_greedy_agreement", "agreement_flat_background",
                                                    "agreement_shape_patches", "shape_patch_share")})


def main(argv=None) -> None:
    ap = arg_parser(__doc__, prog="python -m vlmspec_cli.zoo.imagegen")
    ap.add_argument("--vq-steps", type=int, default=600)
    ap.add_argument("--target-steps", type=int, default=1400)
    ap.add_argument("--draft-steps", type=int, default=1000)
    ap.add_argument("--examples", type=int, default=40000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--eval-only", action="store_true", help="only re-evaluate the models in --out")
    ap.add_argument("--samples", type=Path, default=Path("/tmp/tinyworld-imagegen"),
                    help="where sample PNGs go (not the repo)")
    args = parse_args(ap, argv)
    t_start = time.time()
    report_path = args.out / "BUILD_REPORT.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report = {k: v for k, v in report.items() if k.startswith("janus-")}  # only ours are written

    if args.eval_only:
        tok = AutoTokenizer.from_pretrained(args.out / "janus-target")
        target, draft = (JanusForConditionalGeneration.from_pretrained(args.out / f"janus-{r}", use_safetensors=True).eval()
                         for r in ("target", "draft"))
        for role in ("target", "draft"):
            report.setdefault(f"janus-{role}", {})
        _evaluate_into(report, target, draft, tok, args)
    else:
        tok = make_tokenizer(args.seed)
        target = make_model(tok, TARGET_TEXT, seed=args.seed + 1)
        draft = make_model(tok, DRAFT_TEXT, seed=args.seed + 2)
        scenes = all_scenes()
        pixels = to_pixels([world.render(s, IMAGE_PX) for s in scenes])

        t0 = time.time()
        vq = target.model.vqmodel
        codes = patch_codes(scenes, args.seed)
        train_vq(vq, pixels, codes, args.vq_steps, args.seed)
        report["janus-vq"] = {"steps": args.vq_steps, "train_s": round(time.time() - t0),
                              **vq_report(vq, scenes, pixels, codes, args.samples)}
        print(f"[janus-vq] {json.dumps(report['janus-vq'])}", flush=True)
        for model in (target, draft):
            model.model.vqmodel.load_state_dict(vq.state_dict())
            with torch.no_grad():  # image-token input embeddings start from the codebook
                model.model.generation_embeddings.weight.copy_(vq.quantize.embedding.weight)

        data = make_dataset(tok, dict(zip(scenes, codes)), args.examples, args.seed + 1)
        for role, model, steps, lr, teacher in (("target", target, args.target_steps, 3e-3, None),
                                                ("draft", draft, args.draft_steps, 3e-3, target)):
            t0 = time.time()
            train_generator(model, data, steps, lr, args.batch, args.seed, tok, f"janus-{role}", teacher=teacher)
            out = args.out / f"janus-{role}"
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out)
            tok.save_pretrained(out)
            report[f"janus-{role}"] = {"steps": steps, "train_s": round(time.time() - t0), **_size(model, out)}
        report["janus-draft"]["distilled_from"] = "janus-target"
        report["janus-target"]["tokens"] = {"bos": tok.bos_token_id, "pad": tok.pad_token_id,
                                            "boi": tok.convert_tokens_to_ids(BOI), "image": tok.image_token_id,
                                            "num_image_tokens": NUM_IMAGE_TOKENS}
        _evaluate_into(report, target, draft, tok, args)
        for role in ("target", "draft"):
            report[f"janus-{role}"]["build_wall_s"] = round(time.time() - t_start)
    for key in ("janus-vq", "janus-target", "janus-draft"):
        print(f"[{key}] {json.dumps(report.get(key))}", flush=True)
    # read-modify-write at the end: others may have updated their keys meanwhile
    full = json.loads(report_path.read_text()) if report_path.exists() else {}
    report_path.write_text(json.dumps({**full, **report}, indent=2) + "\n")

