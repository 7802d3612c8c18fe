"""Build the tinyworld models: ``python -m vlmspec_cli.zoo.build``.

Trains, on CPU from fixed seeds, a byte-level BPE tokenizer, a Llava target
(8-layer Llama text model), a much shallower Llava draft (1-layer) that shares the
tokenizer, and a small captioner (for caption drafting), then saves them with
``save_pretrained`` under ``vlmspec_cli/zoo/weights/tinyworld/`` where
``zoo:tinyworld/<name>`` finds them. Each model trains in two stages: the vision tower
and projector against the scene graph (``pretrain_vision``), then the language model on
conversations with the tower frozen (``train``). Prints and saves a build report with
each model's caption / Q&A accuracy on fresh scenes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
)

from vlmspec_cli.drafters.inputs import image_replacements, replace_images
from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.tokenizer import train_tokenizer
from vlmspec_cli.zoo.train import arg_parser, batches, collate, optimize, parse_args, warmup_cosine
# 48 px images in 16 px patches: one image token per cell of the world's 3x3 grid.
# Scenes are drawn at 64 px (as users' images would be) and resized by the processor.
IMAGE_SIZE, PATCH = 48, 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
MEAN, STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]

# text model shapes: the target is 8 layers deep, the draft 1 — on tiny models the
# per-layer cost dominates, so the depth ratio sets the draft/target latency ratio.
TARGET_TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=4)
DRAFT_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=4)
# the captioner of caption drafting (TABED §6.2): a small Llava that only writes captions
CAPTIONER_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4)
TARGET_VISION = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4)
DRAFT_VISION = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2)


def make_processor(tok) -> LlavaProcessor:
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=MEAN, image_std=STD, do_convert_rgb=True,
    )
    return LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=PATCH,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=tok.chat_template)


def make_model(tok, text: dict, vision: dict, seed: int) -> LlavaForConditionalGeneration:
    torch.manual_seed(seed)
    text_config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024,
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id, tie_word_embeddings=False, **text)
    vision_config = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=64, **vision)
    config = LlavaConfig(vision_config=vision_config, text_config=text_config,
                         image_token_id=tok.image_token_id, vision_feature_layer=-1,
                         vision_feature_select_strategy="default", image_seq_length=IMAGE_TOKENS,
                         projector_hidden_act="gelu", tie_word_embeddings=False)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


# drafting inputs the draft also trains on (TABED App. I.2 prompts, drafters/inputs.py): images
# replaced by "\n" (text, T) or by "image: <caption>\n" (caption, C)
DRAFT_INPUT_MIX = {"multimodal": 0.6, "text": 0.2, "caption": 0.2}


def encode_example(tok, turns, variant: str = "multimodal", rng: random.Random | None = None
                   ) -> tuple[list[int], list[int], list]:
    """Token ids, labels (assistant text + </s> only) and images of one conversation, read
    through a drafting input ``variant`` (multimodal, text or caption)."""
    ids: list[int] = []
    labels: list[int] = []
    images: list = []
    msgs: list[dict] = []
    pending: list[str] = []  # replacements for the image placeholders not yet encoded
    rendered = ""
    for turn in turns:
        content = [{"type": "image"} for _ in turn.images] + [{"type": "text", "text": turn.text}]
        msgs.append({"role": turn.role, "content": content})
        if turn.role == "user":
            if variant == "multimodal":
                images.extend(turn.images)
            else:
                captions = [world.caption(sc, rng) for sc in turn.scenes] if variant == "caption" else []
                pending += image_replacements(variant, len(turn.images), captions)
            continue
        prefix = tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(msgs, tokenize=False)
        head_text = prefix[len(rendered):]
        if pending:
            head_text = replace_images(head_text, tok.image_token, pending)
            pending = []
        head = tok(head_text, add_special_tokens=False)["input_ids"]
        answer = tok(full[len(prefix):], add_special_tokens=False)["input_ids"]
        ids += head + answer
        labels += [-100] * len(head) + answer
        rendered = full
    out_ids, out_labels = [], []
    for i, l in zip(ids, labels):  # expand each <image> to the vision tower's patch count
        reps = IMAGE_TOKENS if i == tok.image_token_id else 1
        out_ids += [i] * reps
        out_labels += [l] * reps
    return out_ids, out_labels, images


def make_dataset(processor, n: int, seed: int, weights: dict | None = None,
                 inputs: dict[str, float] | None = None, conversations: list | None = None
                 ) -> list[tuple[list[int], list[int], torch.Tensor | None]]:
    """Conversations encoded exactly as at inference: the processor makes the pixels.
    ``inputs``: the share of examples read through each drafting input (default: all
    multimodal); a separate generator picks them, so the conversations stay the same.
    ``conversations``: encode these (lists of world turns) instead of sampling ``n``."""
    rng = random.Random(seed)
    pick = random.Random(seed + 7919)
    tok = processor.tokenizer
    data = []
    sampled = (world.sample_mix(rng, weights)[1] for _ in range(n))
    for turns in (conversations if conversations is not None else sampled):
        variant = pick.choices(list(inputs), weights=list(inputs.values()))[0] if inputs else "multimodal"
        ids, labels, images = encode_example(tok, turns, variant, pick)
        pix = processor.image_processor(images, return_tensors="pt")["pixel_values"] if images else None
        data.append((ids, labels, pix))
    return data


def cell_labels(scene: world.Scene) -> torch.Tensor:
    """Per grid cell (row-major, = image token order): kind, colour, size (0 = empty), background."""
    labels = torch.zeros(IMAGE_TOKENS, 4, dtype=torch.long)
    labels[:, 3] = list(world.BACKGROUNDS).index(scene.background)
    for shape in scene.shapes:
        cell = world.POSITIONS.index(shape.position)
        labels[cell, 0] = world.SHAPES.index(shape.kind) + 1
        labels[cell, 1] = list(world.COLOURS).index(shape.colour) + 1
        labels[cell, 2] = world.SIZES.index(shape.size) + 1
    return labels


CELL_CLASSES = (len(world.SHAPES) + 1, len(world.COLOURS) + 1, len(world.SIZES) + 1,
                len(world.BACKGROUNDS))


def pretrain_vision(model, processor, steps: int, lr: float, seed: int, label: str,
                    batch_images: int = 64) -> dict:
    """Stage 1: teach the vision tower and projector to see, supervised by the scene graph.

    Like LLaVA's alignment stage, but with the world's ground truth instead of captions: a
    linear probe on each image token (the projector output the language model reads) must
    predict its grid cell's shape kind, colour and size and the background. Trained on
    fresh scenes every step. With the caption loss alone a tower this small learned
    colours but barely told shape kinds apart (kind accuracy near chance); with the probe
    it reaches ~100% in a minute. The probe is thrown away; stage 2 freezes the tower.
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    probe = torch.nn.Linear(model.config.text_config.hidden_size, sum(CELL_CLASSES))
    params = [*model.model.vision_tower.parameters(), *model.model.multi_modal_projector.parameters(),
              *probe.parameters()]

    def probe_batch(n):
        scenes = [world.sample_scene(rng) for _ in range(n)]
        pix = processor.image_processor([world.render(s) for s in scenes], return_tensors="pt")["pixel_values"]
        feats = torch.stack(model.model.get_image_features(pixel_values=pix).pooler_output)
        return probe(feats).split(CELL_CLASSES, dim=-1), torch.stack([cell_labels(s) for s in scenes])

    def batch_loss(step):
        logits, labels = probe_batch(batch_images)
        return sum(torch.nn.functional.cross_entropy(lg.flatten(0, 1), labels[..., i].flatten())
                   for i, lg in enumerate(logits))

    model.train()
    # plain AdamW (default betas), constant learning rate, no clipping
    optimize(params, steps, batch_loss, f"{label} vision", lr=lr, weight_decay=0.01,
             betas=(0.9, 0.999), clip=None, log_every=250)
    model.eval()
    with torch.no_grad():
        logits, labels = probe_batch(500)
        hit = torch.stack([lg.argmax(-1) for lg in logits], dim=-1) == labels
    return {"cell_accuracy": round(hit[..., :3].all(-1).float().mean().item(), 4),
            "scenes_all_cells_right": round(hit.all(-1).all(-1).float().mean().item(), 4)}


def train(model, data, steps: int, lr: float, batch_tokens: int, seed: int, pad_id: int, label: str):
    """Stage 2: the language model and projector learn to talk about what the tower sees."""
    torch.manual_seed(seed)
    model.model.vision_tower.requires_grad_(False)
    model.train()
    it = batches(data, batch_tokens, seed)

    def batch_loss(step):
        ids, labels, mask, pix = collate(data, next(it), pad_id)
        kwargs = {"pixel_values": pix} if pix is not None else {}
        return model(input_ids=ids, attention_mask=mask, labels=labels, **kwargs).loss

    optimize([p for p in model.parameters() if p.requires_grad], steps, batch_loss, label,
             lr=lr, weight_decay=0.01, schedule=warmup_cosine(max(1, steps // 20), steps))
    model.eval()
    return model


@torch.inference_mode()
def evaluate(model, processor, n: int, seed: int) -> dict:
    """Greedy captions and answers on fresh scenes, scored against the scene graph."""
    rng = random.Random(seed)
    tok = processor.tokenizer
    caption_ok = caption_loose = qa_ok = 0
    for _ in range(n):
        scene = world.sample_scene(rng)
        image = world.render(scene)
        results = []
        question, answer = rng.choice(world.qa_pairs(scene, rng))
        for prompt in (rng.choice(world.CAPTION_PROMPTS), question):
            msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            enc = processor(images=[image], text=[text], return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=64, do_sample=False)
            results.append(tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip())
        caption_ok += world.caption_is_exact(scene, results[0])
        caption_loose += world.caption_is_correct(scene, results[0])
        qa_ok += world.answer_is_correct(answer, results[1])
    # caption_accuracy: exactly the scene's shapes, each with size, colour, kind and
    # position, and the background; caption_mentions: every shape and the background are
    # mentioned (extra shapes and wrong sizes not penalised)
    return {"scenes": n, "caption_accuracy": caption_ok / n, "caption_mentions": caption_loose / n,
            "qa_accuracy": qa_ok / n}


def main(argv=None) -> None:
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if "--all" in args or "--list" in args:
        return build_all(args)
    ap = arg_parser(__doc__)
    ap.add_argument("--examples", type=int, default=30000)
    ap.add_argument("--target-steps", type=int, default=2200)
    ap.add_argument("--draft-steps", type=int, default=1600)
    ap.add_argument("--captioner-steps", type=int, default=3000)
    ap.add_argument("--vision-steps", type=int, default=1500)
    ap.add_argument("--eval-only", action="store_true",
                    help="only evaluate the built models in --out and update the report")
    ap.add_argument("--only", nargs="+", choices=("llava-draft", "llava-target", "captioner", "llava-twig"),
                    help="rebuild only these models (the others' weights are kept)")
    ap.add_argument("--twig-steps", type=int, default=1000)   # the shipped twig's (BUILD_REPORT)
    ap.add_argument("--twig-ablation", action="store_true",
                    help="also train the other twig inits, T = 1..4 and K = 1, 3 and report their TokAR")
    ap.add_argument("--twig-variants", type=Path, metavar="DIR",
                    help="with --twig-ablation: save every variant there (for bench/twig.py)")
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--eval-scenes", type=int, default=100)
    args = parse_args(ap, argv)

    tok = train_tokenizer(world.corpus_lines(20000, args.seed), vocab_size=512)
    processor = make_processor(tok)
    report_path = args.out / "BUILD_REPORT.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update({"seed": args.seed, "examples": args.examples})
    datasets: dict[str, list] = {}
    models = {  # name: text config, vision config, steps, lr, conversation mix
        "llava-draft": (DRAFT_TEXT, DRAFT_VISION, args.draft_steps, 3e-3, "draft-mix"),
        "llava-target": (TARGET_TEXT, TARGET_VISION, args.target_steps, 2e-3, "mix"),
        "captioner": (CAPTIONER_TEXT, DRAFT_VISION, args.captioner_steps, 3e-3, "caption"),
    }
    if args.eval_only:
        for name in args.only or list(models):
            model = LlavaForConditionalGeneration.from_pretrained(args.out / name, use_safetensors=True).eval()
            report.setdefault(name, {}).update(
                evaluate(model, processor, args.eval_scenes, seed=10_000 + args.seed))
            print(f"[{name}] {json.dumps(report[name])}", flush=True)
        report_path.write_text(json.dumps(report, indent=2) + "\n")
        return
    wanted = args.only or [*models, "llava-twig"]
    for name in [n for n in wanted if n in models]:
        text, vision, steps, lr, mix = models[name]
        if mix not in datasets:
            weights = {mix: 1.0} if mix == "caption" else None
            inputs = DRAFT_INPUT_MIX if mix == "draft-mix" else None
            datasets[mix] = make_dataset(processor, args.examples, args.seed + 1, weights, inputs)
            data = datasets[mix]
            print(f"{mix}: {len(data)} examples, vocab {len(tok)}, mean length "
                  f"{sum(len(d[0]) for d in data) / len(data):.0f} tokens", flush=True)
        model = make_model(tok, text, vision, seed=args.seed + len(name))
        vision_metrics = pretrain_vision(model, processor, args.vision_steps, 1e-3, args.seed, name)
        print(f"[{name} vision] {json.dumps(vision_metrics)}", flush=True)
        train(model, datasets[mix], steps, lr, args.batch_tokens, args.seed, tok.pad_token_id, name)
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        processor.save_pretrained(out)
        metrics = evaluate(model, processor, args.eval_scenes, seed=10_000 + args.seed)
        report[name] = {"steps": steps, "params": sum(p.numel() for p in model.parameters()),
                        "text_layers": text["num_hidden_layers"], "vision_steps": args.vision_steps,
                        "vision_probe": vision_metrics, **metrics}
        print(f"[{name}] {json.dumps(report[name])}", flush=True)
        report_path.write_text(json.dumps(report, indent=2) + "\n")
    if "llava-twig" in wanted:  # grown on the built target, from its training mix
        from vlmspec_cli.zoo.twig import build_twig

        data = datasets.get("mix") or make_dataset(processor, args.examples, args.seed + 1)
        build_twig(args.out, processor, data, report, args.twig_steps, args.seed,
                   args.batch_tokens, args.twig_ablation, variants_dir=args.twig_variants)
        report_path.write_text(json.dumps(report, indent=2) + "\n")


def build_all(argv: list[str]) -> None:
    """``--all [--from N] [--to N]``: every shipped model in order (zoo/pipeline.py);
    ``--list``: print the steps as the commands they run."""
    import argparse

    from vlmspec_cli.zoo import pipeline

    ap = argparse.ArgumentParser(prog="python -m vlmspec_cli.zoo.build --all",
                                 description=pipeline.__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="build every shipped model, in order")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--from", dest="first", type=int, help="first step to run (1-based)")
    ap.add_argument("--to", dest="last", type=int, help="last step to run")
    args = ap.parse_args(argv)
    try:
        steps = pipeline.select(args.first, args.last)
    except ValueError as exc:
        ap.error(str(exc))
    print(pipeline.describe(steps), flush=True)
    if not args.list:
        pipeline.run(steps)


if __name__ == "__main__":
    main()
