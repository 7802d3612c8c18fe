"""Train hidden-state draft heads (runtime/models/hidden_head.py) for the tinyworld targets
(the training itself: zoo/hidden_train.py).

``python -m vlmspec_cli.zoo.hidden --target llava`` (or ``llava-deep``, ``video``, ``video-deep``) writes
``weights/tinyworld/<target>-hidden`` and a BUILD_REPORT.json with the acceptance the
head reaches on fresh requests. ``--data reference`` trains on tinyworld requests with the
world's reference answers (single turns: captions and questions); ``--data broad`` (the
caption targets) on conversations of every MMSpec topic over clean and photo-like
images, answered turn by turn by the target itself (zoo/hidden_broad.py).

``--target DIR_OR_HUB_ID SAMPLES... --out HEAD_DIR`` trains one for any target vlmspec
adapts, on the user's own images or videos, ``--workload FILE.jsonl`` on the user's own
conversations (``--chat`` or MMSpec JSONL; zoo/hidden_user.py, zoo/hidden_workload.py).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from vlmspec_cli.zoo.hidden_train import collect, frozen_io, measure, new_head, train_head
from vlmspec_cli.zoo.train import arg_parser, parse_args

def llava_data(n: int, seed: int):
    from vlmspec_cli.runtime.request import Message, Request
    from vlmspec_cli.zoo import world

    rng = random.Random(seed)
    reqs, answers = [], []
    for _ in range(n):
        scene = world.sample_scene(rng)
        image = world.render(scene)
        if rng.random() < 0.6:
            q, a = rng.choice(world.CAPTION_PROMPTS), world.caption(scene, rng)
        else:
            q, a = rng.choice(world.qa_pairs(scene, rng))
        reqs.append(Request([Message("user", q, (image,))], max_new_tokens=48))
        answers.append(a)
    return reqs, answers


def video_data(n: int, seed: int, frames=(4, 8, 16)):
    from vlmspec_cli.runtime.request import Message, Request
    from vlmspec_cli.tasks.video_io import clip_from_arrays
    from vlmspec_cli.zoo import video

    rng = random.Random(seed)
    reqs, answers = [], []
    for _ in range(n):
        script = video.random_script(rng)
        k = rng.choice(frames)
        clip = clip_from_arrays(video.render_script(script, k), fps=k / video.DURATION)
        reqs.append(Request([Message("user", rng.choice(video.QUESTIONS), videos=(clip,))],
                            max_new_tokens=40))
        answers.append(video.describe(script))
    return reqs, answers


def broad_data(lm, n: int, seed: int):
    from vlmspec_cli.zoo.hidden_broad import broad_data as data

    return data(lm, n, seed, max_new_tokens=64)


TARGETS = {
    "llava": ("zoo:tinyworld/llava-target", "llava-hidden", llava_data, -1),
    # the 32-layer caption target (zoo/deepen.py): same data, its own head
    "llava-deep": ("zoo:tinyworld/llava-target-deep", "llava-deep-hidden", llava_data, -1),
    "video": ("zoo:tinyworld/qwen-video-target", "qwen-video-hidden", video_data, -2),
    # the 24-layer video target (zoo/deepen.py --family video)
    "video-deep": ("zoo:tinyworld/qwen-video-target-deep", "qwen-video-deep-hidden", video_data, -2),
}


# the heads trained on the target's own answers by default (their shipped weights were)
DEFAULT_DATA: dict[str, str] = {}


def build(name: str, examples: int, stage1: int, stage2: int, feedback: int, layer: int | None,
          seed: int = 0, save: bool = True, bridge: bool = False, max_steps: int | None = None,
          data_name: str | None = None, out=None) -> dict:
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import ZOO_ROOT, load_model

    model, out_name, data_fn, default_layer = TARGETS[name]
    data_name = data_name or DEFAULT_DATA.get(name, "reference")
    if data_name == "broad" and data_fn is not llava_data:
        raise SystemExit(f"--data broad: caption targets only (llava, llava-deep), not {name}")
    layer = default_layer if layer is None else layer
    torch.manual_seed(seed)
    lm = load_model(ModelSpec(model=model, device="cpu", dtype="float32"), "target")
    t0 = time.time()
    if data_name == "broad":
        reqs, answers = broad_data(lm, examples, seed + 1)
    else:
        reqs, answers = data_fn(examples, seed + 1)
    data = collect(lm, reqs, answers, layer, bridge=bridge)
    collect_s = time.time() - t0
    embed, lm_head = frozen_io(lm)
    steps = feedback + 1 if max_steps is None else max_steps
    head = new_head(lm, layer, max_steps=steps, seed=seed)
    t1 = time.time()
    train_head(head, embed, lm_head, data, stage1, stage2, feedback, 32, 2e-3, seed, print)
    train_s = time.time() - t1
    fresh, _ = data_fn(24, seed + 99991)
    report = {"target": model, "data": data_name, "layer": layer, "ivsb": bridge,
              "step_embeddings": steps, "examples": len(reqs), "stage1_steps": stage1,
              "stage2_steps": stage2, "feedback_steps": feedback,
              "collect_s": round(collect_s, 1), "train_s": round(train_s, 1),
              "params": sum(p.numel() for p in head.parameters()),
              "fresh": measure(lm, head, fresh)}
    if data_name == "broad":    # fresh conversations of every topic, too
        report["fresh_broad"] = measure(lm, head, broad_data(lm, 24, seed + 99991)[0])
    print(json.dumps(report, indent=1))
    if save:   # the shipped head's folder, or ``out`` (to compare before replacing it)
        path = ZOO_ROOT / "tinyworld" / out_name if out is None else Path(out)
        head.save_pretrained(path)
        (path / "BUILD_REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> None:
    ap = arg_parser(" ".join(__doc__.split("\n\n")[0].split()), out=None)
    ap.add_argument("--target", default="llava",
                    help=f"a tinyworld target ({', '.join(sorted(TARGETS))}), or any model: a "
                         "directory or hub id, trained on SAMPLES into --out")
    ap.add_argument("samples", nargs="*", help="your target: images, folders, globs, - (stdin)")
    ap.add_argument("--out", default=None, help="your target: the head's folder (new or empty); "
                    "a tinyworld target: where the head goes instead of the zoo's weights")
    ap.add_argument("--force", action="store_true", help="replace a head already in --out")
    ap.add_argument("--workload", default=None, metavar="FILE.jsonl",
                    help="your target: your own conversations to train on (vlmspec bench's "
                         "MMSpec or --chat JSONL); the target answers every turn again")
    ap.add_argument("--task", choices=("caption", "video"), default="caption")
    ap.add_argument("--prompt", default=None, help="your target: the question asked of each sample")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--examples", type=int, default=1500)
    ap.add_argument("--stage1", type=int, default=600)
    ap.add_argument("--stage2", type=int, default=300)
    ap.add_argument("--feedback", type=int, default=3, help="self-feedback steps in stage 2")
    ap.add_argument("--layer", type=int, default=None, help="target hidden_states index")
    ap.add_argument("--data", choices=("reference", "broad"), default=None,
                    help="a tinyworld target: train on the world's reference answers, or on "
                         "broad conversations the target answers itself (default: "
                         + "".join(f"{v} for {k}, " for k, v in DEFAULT_DATA.items())
                         + ("reference for the rest)" if DEFAULT_DATA else "reference)"))
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--ivsb", action="store_true",
                    help="Sparrow IVSB: middle-layer visual states as extra training input")
    ap.add_argument("--step-embeddings", type=int, default=None,
                    help="number of step embeddings (0: none; default feedback + 1)")
    ap.add_argument("--arch", choices=("hidden", "eagle3"), default="hidden",
                    help="eagle3: an EAGLE-3 head in the published layout (vLLM, SGLang, "
                         "SpecForge load it), trained on SAMPLES into --out")
    ap.add_argument("--draft-vocab", type=int, default=32000,
                    help="eagle3: the draft vocabulary's size (at most the target's)")
    args = parse_args(ap, argv, deterministic=False)
    if args.arch == "eagle3" or args.workload:   # the user's path, a tinyworld name
        # standing for its zoo id
        from vlmspec_cli.zoo.hidden_user import train_user_head

        args.target = TARGETS[args.target][0] if args.target in TARGETS else args.target
        raise SystemExit(train_user_head(args))
    if args.target not in TARGETS:
        from vlmspec_cli.zoo.hidden_user import train_user_head

        raise SystemExit(train_user_head(args))
    build(args.target, args.examples, args.stage1, args.stage2, args.feedback, args.layer,
          seed=args.seed, save=not args.no_save, bridge=args.ivsb, max_steps=args.step_embeddings,
          data_name=args.data, out=args.out)


if __name__ == "__main__":
    main()
