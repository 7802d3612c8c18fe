"""Deepen a built tinyworld target: ``python -m vlmspec_cli.zoo.deepen``.

Real speculative pairs put a 1-2 layer draft against a 24-32 layer target (LLaVA-1.5-7B:
32 decoder layers; Qwen2.5-VL-7B: 28), and the draft/target cost ratio is what Eq. 1 turns
into speed. The tinyworld caption target (``build.py``) has 8 layers. This script makes a
deeper one from it without losing what it learned:

1. **Function-preserving initialisation** (Net2DeeperNet, Chen et al. 2016): trained layer
   i is followed by ``factor - 1`` copies of itself whose output projections (attention
   ``o_proj``, MLP ``down_proj``) are zero. A pre-norm residual layer with zero output
   projections adds nothing, so at step 0 the deep model's logits equal the source's.
2. **Training** on the source's conversation mix (``build.make_dataset``, same seed) with
   the language-model loss for ``--steps`` steps, vision tower frozen: the output
   projections of the added layers move off zero (their gradient is non-zero from the
   first step), so every layer computes.
3. **Evaluation** with the build's own measure (``build.evaluate``: caption and Q&A
   accuracy on fresh scenes) of the saved model *as loaded* (weights are stored in
   float16 to keep the package small; CPUs load them in float32), next to the source's.

The tokenizer, vision tower, projector, embeddings and head are the source's, so every
draft built for the source (``llava-draft``, the captioner) drafts for the deep target
too. Deterministic given the seed.
"""

from __future__ import annotations

import copy
import json
import time

import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from vlmspec_cli.zoo.build import evaluate, make_dataset, train
from vlmspec_cli.zoo.train import arg_parser, parse_args


def deepen(source: LlavaForConditionalGeneration, factor: int) -> LlavaForConditionalGeneration:
    """``source`` with every text decoder layer followed by ``factor - 1`` pass-through
    copies (zero output projections): the same function, ``factor`` times the layers."""
    model = copy.deepcopy(source)
    text = model.model.language_model
    layers = []
    for layer in text.layers:
        layers.append(layer)
        for _ in range(factor - 1):
            extra = copy.deepcopy(layer)
            with torch.no_grad():
                extra.self_attn.o_proj.weight.zero_()
                extra.mlp.down_proj.weight.zero_()
            layers.append(extra)
    for i, layer in enumerate(layers):   # each layer owns its own cache slot
        layer.self_attn.layer_idx = i
    text.layers = torch.nn.ModuleList(layers)
    config = model.config.text_config
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[0]] * len(layers)
    return model


def main(argv=None) -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--source", default="llava-target", help="the built model to deepen")
    ap.add_argument("--name", default="llava-target-deep", help="the deepened model's name")
    ap.add_argument("--factor", type=int, default=4, help="layers per source layer (8 -> 32)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--examples", type=int, default=8000)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--eval-scenes", type=int, default=100)
    args = parse_args(ap, argv)
    t0 = time.time()
    src_dir = args.out / args.source
    processor = LlavaProcessor.from_pretrained(src_dir)
    source = LlavaForConditionalGeneration.from_pretrained(src_dir, use_safetensors=True).eval()
    model = deepen(source, args.factor)
    probe = torch.tensor([[processor.tokenizer.bos_token_id, 17, 40, 41, 42]])
    with torch.inference_mode():   # function-preserving: the same logits before training
        same = torch.allclose(model(input_ids=probe).logits, source(input_ids=probe).logits,
                              atol=1e-5)
    data = make_dataset(processor, args.examples, args.seed + 1)
    train(model, data, args.steps, args.lr, args.batch_tokens, args.seed,
          processor.tokenizer.pad_token_id, args.name)
    out = args.out / args.name
    out.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(out)
    processor.save_pretrained(out)
    loaded = LlavaForConditionalGeneration.from_pretrained(out, use_safetensors=True,
                                                           dtype=torch.float32).eval()
    metrics = evaluate(loaded, processor, args.eval_scenes, seed=10_000 + args.seed)
    report_path = args.out / "BUILD_REPORT.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    before = {k: report.get(args.source, {}).get(k)
              for k in ("caption_accuracy", "caption_mentions", "qa_accuracy")}
    report[args.name] = {
        "source": args.source, "factor": args.factor,
        "text_layers": loaded.config.text_config.num_hidden_layers,
        "init_equals_source": same, "steps": args.steps, "lr": args.lr,
        "examples": args.examples, "params": sum(p.numel() for p in loaded.parameters()),
        "stored_dtype": "float16", "source_metrics": before, **metrics,
        "build_s": round(time.time() - t0)}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[{args.name}] {json.dumps(report[args.name])}", flush=True)


if __name__ == "__main__":
    main()
