"""tinyworld video models: ``python -m vlmspec_cli.zoo.video``.

Builds, on CPU and deterministically, two Qwen2.5-VL models (HF
``Qwen2_5_VLForConditionalGeneration``) that describe short videos of moving shapes: a
6-layer target and a 1-layer draft that share one tokenizer and the vision layout (the
draft reads all visual tokens itself; its vision tower starts from the target's).

* World: a 3 s script (8 fps, 24 raw frames) of one or two shapes (circle, square,
  triangle; red, green, blue, yellow, purple) on a plain background. Each shape moves
  across the frame (left->right, right->left, top->bottom, bottom->top) or stays.
  ``render_script(script, n)`` draws n frames evenly spaced over the 3 s at 64x64 px.
* Description: ``describe(script)``, shapes in colour order, e.g. "a red circle moves
  from left to right while a blue square stays.", "a red circle and a blue square stay."
* Inputs: ``video_inputs(tok, config, frames, question)``; the chat template renders one
  ``<|video_pad|>`` per video, expanded to t*h*w/merge**2 tokens (16 per 2 frames);
  ``mm_token_type_ids`` is 2 on video tokens; ``second_per_grid_ts`` =
  temporal_patch_size / fps with fps = frames / 3 s. Pixels come from
  ``runtime.adapters.video_patches.patchify`` (the Qwen2-VL processor layout).
* Training: first the vision tower alone on a linear probe on the merged vision tokens
  (each cell's shape colour/kind and its motion; ``pretrain_vision``), then teacher
  forcing on the answer tokens (prompt + " " + description + eos) with N in {4, 8, 16}
  frames per batch plus the same probe (two runs for the target); probes are thrown away.

Saves ``weights/tinyworld/qwen-video-{target,draft}`` (tokenizer and a
``preprocessor_config.json`` from ``Qwen2VLImageProcessor`` in each) and writes
``qwen-video-target/BUILD_REPORT.md`` with accuracy on fresh scripts at 4/8/16/64 frames.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from vlmspec_cli.tasks.video_io import read_video
from vlmspec_cli.zoo.train import arg_parser, parse_args
from vlmspec_cli.zoo.video.model import (
    DRAFT_TEXT, TARGET_TEXT, make_model, save, train_video_tokenizer, video_inputs,
)
from vlmspec_cli.zoo.video.report import agreement, eval_scripts, evaluate, greedy, write_report
from vlmspec_cli.zoo.video.training import FRAME_WEIGHTS, pretrain_vision, train
from vlmspec_cli.zoo.video.world import (
    EXAMPLES, QUESTIONS, corpus_lines, describe, random_script, write_examples,
)


def main(argv=None) -> None:
    args = _parse(argv)
    tdir, ddir = args.out / "qwen-video-target", args.out / "qwen-video-draft"
    if args.report_only:
        write_report(tdir / "BUILD_REPORT.md", json.loads((tdir / "BUILD_REPORT.json").read_text()),
                     Qwen2_5_VLForConditionalGeneration.from_pretrained(tdir, use_safetensors=True),
                     Qwen2_5_VLForConditionalGeneration.from_pretrained(ddir, use_safetensors=True))
        return
    t_start = time.time()
    report: dict = {"seed": args.seed}
    if args.eval_only or args.draft_only:
        tok, target, draft = _load(args, tdir, ddir, report)
    else:
        tok, target = _build_target(args, tdir, report)
    if not args.eval_only:
        draft = _build_draft(args, tok, target, ddir, report)
    _evaluate_all(args, tok, target, draft, report)
    report["total_seconds"] = round(time.time() - t_start, 1)
    (tdir / "BUILD_REPORT.json").write_text(json.dumps(report, indent=2) + "\n")
    write_report(tdir / "BUILD_REPORT.md", report, target, draft)
    print(json.dumps(report, indent=2), flush=True)


def _parse(argv):
    ap = arg_parser(__doc__, threads=1, prog="python -m vlmspec_cli.zoo.video",
                    threads_help="1: on a shared 2-CPU machine 2 threads thrashed (steps 5-10x slower)")
    ap.add_argument("--examples-dir", type=Path, default=EXAMPLES)
    ap.add_argument("--vision-steps", type=int, default=2400)
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--target-steps-2", type=int, default=2000)
    ap.add_argument("--draft-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-videos", type=int, default=40)
    ap.add_argument("--eval-only", action="store_true", help="evaluate the saved models, rewrite the report")
    ap.add_argument("--draft-only", action="store_true",
                    help="keep the saved target (and its tokenizer), rebuild the draft, evaluate both")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite BUILD_REPORT.md from the saved BUILD_REPORT.json")
    return parse_args(ap, argv)


def _load(args, tdir: Path, ddir: Path, report: dict):
    """The saved tokenizer and target (and with --eval-only the draft; else None), and the
    training entries of the saved report."""
    tok = AutoTokenizer.from_pretrained(tdir)
    target = Qwen2_5_VLForConditionalGeneration.from_pretrained(tdir, use_safetensors=True).eval()
    draft = Qwen2_5_VLForConditionalGeneration.from_pretrained(ddir, use_safetensors=True).eval() if args.eval_only else None
    old = tdir / "BUILD_REPORT.json"
    if old.exists():
        report.update({k: v for k, v in json.loads(old.read_text()).items()
                       if "_train" in k or k == "vision_pretrain"})
    return tok, target, draft


def _build_target(args, tdir: Path, report: dict):
    """A new tokenizer and target: vision pre-training, then two end-to-end runs; saved."""
    tok = train_video_tokenizer(corpus_lines(5000, args.seed))
    print(f"vocab {len(tok)}: {tok.tokenize(' ' + describe(random_script(random.Random(1))))}", flush=True)
    target = make_model(tok, TARGET_TEXT, seed=args.seed + 1)
    report["vision_pretrain"], probe = pretrain_vision(
        target, args.vision_steps, 5e-3, 16, args.seed + 50, "vision", frame_weights=FRAME_WEIGHTS)
    report["target_train"] = train(target, tok, args.target_steps, 3e-3, args.batch, args.seed + 100,
                                   "target", frame_weights=FRAME_WEIGHTS, probe=probe)
    # a second end-to-end run (fresh optimizer and probe, lower probe weight): after the
    # first the language model had not yet learned the "from X to Y" pairing
    report["target_train_continued"] = train(
        target, tok, args.target_steps_2, 2e-3, args.batch, args.seed + 300, "target+",
        aux_weight=0.5, frame_weights=FRAME_WEIGHTS)
    save(target, tok, tdir)
    (tdir / "BUILD_REPORT.json").write_text(json.dumps(report, indent=2) + "\n")
    return tok, target


def _build_draft(args, tok, target, ddir: Path, report: dict):
    draft = make_model(tok, DRAFT_TEXT, seed=args.seed + 2)
    # the draft starts from the target's trained vision tower (same layout), then trains
    draft.model.visual.load_state_dict(target.model.visual.state_dict())
    report["draft_train"] = train(draft, tok, args.draft_steps, 3e-3, args.batch, args.seed + 200,
                                  "draft", frame_weights=FRAME_WEIGHTS)
    save(draft, tok, ddir)
    return draft


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _evaluate_all(args, tok, target, draft, report: dict) -> None:
    """Sizes, accuracy at 4/8/16/64 frames, draft/target agreement, and the example videos."""
    for name, m in (("target", target), ("draft", draft)):
        report[f"{name}_params"] = {"total": _params(m), "vision": _params(m.model.visual),
                                    "text": _params(m.model.language_model) + _params(m.lm_head)}
    scripts = eval_scripts(args.eval_videos, 10_000 + args.seed)  # training uses seeds 100/200
    report["target_eval"], report["draft_eval"] = [], []
    for n in (4, 8, 16, 64):
        res = evaluate(target, tok, scripts, n, seed=n, keep_outputs=(n == 8))
        if n == 8:
            report["agreement_8_frames"] = agreement(target, draft, res.pop("_outputs"))
            print(f"[agreement] {report['agreement_8_frames']}", flush=True)
        report["target_eval"].append(res)
        report["draft_eval"].append(evaluate(draft, tok, scripts, n, seed=n))
        print(f"[eval {n}] target {res}\n         draft  {report['draft_eval'][-1]}", flush=True)
    # the example videos, decoded from mp4 and sampled to 8 frames
    made = write_examples(args.examples_dir, seed=20_000 + args.seed)
    report["examples"] = []
    for name, script in made:
        # decoded and sampled exactly as describe-video does (tasks/video_io.py)
        clip = read_video(args.examples_dir / name, frames=8)
        frames = np.stack([np.asarray(f) for f in clip.frames])
        out = greedy(target, tok, video_inputs(tok, target.config, frames, QUESTIONS[0]))
        report["examples"].append({"file": name, "truth": describe(script),
                                   "target": tok.decode(out, skip_special_tokens=True).strip()})
