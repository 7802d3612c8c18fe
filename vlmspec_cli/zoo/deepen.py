"""Deepen a built tinyworld target: ``python -m vlmspec_cli.zoo.deepen [--family video|image]``.

Real speculative pairs put a 1-2 layer draft against a 24-32 layer target (LLaVA-1.5-7B:
32 decoder layers; Qwen2.5-VL-7B: 28), and the draft/target cost ratio is what Eq. 1 turns
into speed. The tinyworld caption target (``build.py``) has 8 layers, the video target
(``zoo/video``) and the image generator (``zoo/imagegen``) 6. This script makes a deeper
one from any of them without losing what it learned:

1. **Function-preserving initialisation** (Net2DeeperNet, Chen et al. 2016): trained layer
   i is followed by ``factor - 1`` copies of itself whose output projections (attention
   ``o_proj``, MLP ``down_proj``) are zero. A pre-norm residual layer with zero output
   projections adds nothing, so at step 0 the deep model's logits equal the source's.
2. **Training** with the language-model loss for ``--steps`` steps, vision tower frozen,
   on the source's own training data (caption: the build's conversation mix,
   ``build.make_dataset``, same seed; video: fresh scripts at 4/8/16 frames,
   ``video.training.train``; image: the build's prompt/code pairs,
   ``imagegen.generator.train_generator``, VQ frozen): the output projections of the added layers move off zero
   (their gradient is non-zero from the first step), so every layer computes.
3. **Evaluation** with the source build's own measure (caption: caption and Q&A accuracy
   on fresh scenes, ``build.evaluate``; video: exact/shape/motion accuracy on fresh
   scripts at 4/8/16 frames, ``video.report.evaluate``; image: the share of greedy images
   that match their prompt and the shipped draft's greedy agreement,
   ``imagegen.build.evaluate``) of the saved model *as loaded*
   (weights are stored in float16 to keep the package small; CPUs load them in float32),
   next to the source's.

The tokenizer, vision tower, projector, embeddings and head are the source's (and the
image generator's VQ), so every draft built for the source (``llava-draft``, the
captioner, ``qwen-video-draft``, ``janus-draft``) drafts for the deep target too.
Deterministic given the seed.
"""

from __future__ import annotations

import copy
import json
import time

import torch

from vlmspec_cli.zoo.train import arg_parser, parse_args


def deepen(source, factor: int):
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


class CaptionFamily:
    """The Llava caption target (``build.py``): its conversation mix and evaluation."""
    source, name, steps, lr = "llava-target", "llava-target-deep", 400, 5e-4
    metrics = ("caption_accuracy", "caption_mentions", "qa_accuracy")

    def __init__(self, src_dir, args):
        from transformers import LlavaForConditionalGeneration, LlavaProcessor

        self.cls, self.args = LlavaForConditionalGeneration, args
        self.processor = LlavaProcessor.from_pretrained(src_dir)
        self.tok = self.processor.tokenizer

    def train(self, model):
        from vlmspec_cli.zoo.build import make_dataset, train

        data = make_dataset(self.processor, self.args.examples, self.args.seed + 1)
        train(model, data, self.args.steps, self.args.lr, self.args.batch_tokens, self.args.seed,
              self.tok.pad_token_id, self.args.name)

    def save(self, model, out):
        model.save_pretrained(out)
        self.processor.save_pretrained(out)

    def evaluate(self, model) -> dict:
        from vlmspec_cli.zoo.build import evaluate

        return evaluate(model, self.processor, self.args.eval_scenes, seed=10_000 + self.args.seed)

    def source_metrics(self, out) -> dict:
        report = _read_report(out / "BUILD_REPORT.json").get(self.args.source, {})
        return {k: report.get(k) for k in self.metrics}


class VideoFamily:
    """The Qwen2.5-VL video target (``zoo/video``): fresh scripts, its frame-count evaluation."""
    source, name, steps, lr = "qwen-video-target", "qwen-video-target-deep", 500, 5e-4
    frames = (4, 8, 16)

    def __init__(self, src_dir, args):
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        self.cls, self.args = Qwen2_5_VLForConditionalGeneration, args
        self.tok = AutoTokenizer.from_pretrained(src_dir)

    def train(self, model):
        from vlmspec_cli.zoo.video.training import FRAME_WEIGHTS, train

        model.model.visual.requires_grad_(False)
        # aux_weight 0: the cell probe teaches the vision tower, which stays frozen here
        train(model, self.tok, self.args.steps, self.args.lr, 8, self.args.seed + 400,
              self.args.name, aux_weight=0.0, frame_weights=FRAME_WEIGHTS)

    def save(self, model, out):
        from vlmspec_cli.zoo.video.model import save

        save(model, self.tok, out)

    def evaluate(self, model) -> dict:
        from vlmspec_cli.zoo.video.report import eval_scripts, evaluate

        scripts = eval_scripts(self.args.eval_videos, 10_000 + self.args.seed)  # as the build
        return {"eval": [evaluate(model, self.tok, scripts, n, seed=n) for n in self.frames]}

    def source_metrics(self, out) -> dict:
        report = _read_report(out / self.args.source / "BUILD_REPORT.json")
        return {"eval": [e for e in report.get("target_eval", []) if e["frames"] in self.frames]}


class ImageFamily:
    """The Janus image generator (``zoo/imagegen``): its prompt/code pairs, its match rate."""
    source, name, steps, lr = "janus-target", "janus-target-deep", 500, 5e-4

    def __init__(self, src_dir, args):
        from transformers import AutoTokenizer, JanusForConditionalGeneration

        self.cls, self.args = JanusForConditionalGeneration, args
        self.tok = AutoTokenizer.from_pretrained(src_dir)

    def train(self, model):
        from vlmspec_cli.zoo.imagegen.generator import make_dataset, train_generator
        from vlmspec_cli.zoo.imagegen.scenes import all_scenes
        from vlmspec_cli.zoo.imagegen.vq import patch_codes

        scenes = all_scenes()   # the build's scenes and codes (same seeds)
        data = make_dataset(self.tok, dict(zip(scenes, patch_codes(scenes, self.args.seed))),
                            self.args.examples, self.args.seed + 1)
        train_generator(model, data, self.args.steps, self.args.lr, 32, self.args.seed, self.tok,
                        self.args.name)

    def save(self, model, out):
        model.save_pretrained(out)
        self.tok.save_pretrained(out)

    def evaluate(self, model) -> dict:
        from vlmspec_cli.zoo.imagegen.build import evaluate

        draft = self.cls.from_pretrained(self.args.out / "janus-draft", use_safetensors=True).eval()
        m = evaluate(model, draft, self.tok, self.args.eval_videos, seed=10_000 + self.args.seed)
        return {k: m[k] for k in ("target_match_rate", "draft_target_greedy_agreement",
                                  "target_generate_s")}

    def source_metrics(self, out) -> dict:
        report = _read_report(out / "BUILD_REPORT.json")
        return {"target_match_rate": report.get(self.args.source, {}).get("match_rate"),
                "draft_target_greedy_agreement":
                    report.get("janus-draft", {}).get("draft_target_greedy_agreement")}


FAMILIES = {"caption": CaptionFamily, "video": VideoFamily, "image": ImageFamily}


def _read_report(path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv=None) -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="caption")
    ap.add_argument("--source", help="the built model to deepen [caption: llava-target, "
                                     "video: qwen-video-target]")
    ap.add_argument("--name", help="the deepened model's name [the source's name + -deep]")
    ap.add_argument("--factor", type=int, default=4, help="layers per source layer (8 -> 32, 6 -> 24)")
    ap.add_argument("--steps", type=int, help="training steps [caption 400, video and image 500]")
    ap.add_argument("--lr", type=float, help="peak learning rate [5e-4]")
    ap.add_argument("--examples", type=int, default=8000, help="caption: conversations; image: prompts")
    ap.add_argument("--batch-tokens", type=int, default=2048, help="caption: tokens per batch")
    ap.add_argument("--eval-scenes", type=int, default=100, help="caption: evaluation scenes")
    ap.add_argument("--eval-videos", type=int, default=40,
                    help="video: evaluation scripts; image: evaluation prompts")
    args = parse_args(ap, argv)
    kind = FAMILIES[args.family]
    for key in ("source", "name", "steps", "lr"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(kind, key))
    t0 = time.time()
    src_dir = args.out / args.source
    family = kind(src_dir, args)
    source = family.cls.from_pretrained(src_dir, use_safetensors=True).eval()
    model = deepen(source, args.factor)
    probe = torch.tensor([[family.tok.bos_token_id, 17, 40, 41, 42]])
    with torch.inference_mode():   # function-preserving: the same logits before training
        same = torch.allclose(model(input_ids=probe).logits, source(input_ids=probe).logits,
                              atol=1e-5)
    family.train(model)
    out = args.out / args.name
    out.mkdir(parents=True, exist_ok=True)
    family.save(model.half(), out)
    loaded = family.cls.from_pretrained(out, use_safetensors=True, dtype=torch.float32).eval()
    metrics = family.evaluate(loaded)
    report_path = args.out / "BUILD_REPORT.json"
    report = _read_report(report_path)
    report[args.name] = {
        "source": args.source, "factor": args.factor,
        "text_layers": loaded.config.text_config.num_hidden_layers,
        "init_equals_source": same, "steps": args.steps, "lr": args.lr,
        **({"examples": args.examples} if args.family != "video" else {}),
        "params": sum(p.numel() for p in loaded.parameters()),
        "stored_dtype": "float16", "source_metrics": family.source_metrics(args.out), **metrics,
        "build_s": round(time.time() - t0)}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[{args.name}] {json.dumps(report[args.name])}", flush=True)


if __name__ == "__main__":
    main()
