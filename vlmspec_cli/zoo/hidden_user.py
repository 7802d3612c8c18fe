"""Train a hidden-state draft head for the user's own target, on the user's own samples:
``python -m vlmspec_cli.zoo.hidden --target DIR_OR_HUB_ID SAMPLES... --out HEAD_DIR``.

``--workload FILE.jsonl`` (with or without SAMPLES) adds the user's own conversations: MMSpec
or ``--chat`` JSONL, every user turn answered again by the target (zoo/hidden_workload.py).

SAMPLES are what ``vlmspec caption`` takes (images, folders, globs, ``-`` for paths on
stdin), or videos and frame folders with ``--task video``. Each sample becomes one request
with ``--prompt``; the target answers it greedily (target-only decoding, as vlmspec runs
it), and the head learns from the target's hidden states over the prompt and its own
answer (zoo/hidden.py: collect, then the two HiViS stages). What the head should predict
is what the target says, so no reference answers are needed.

The head is written to ``--out`` (a new or empty folder; an earlier head with ``--force``)
through a temporary folder renamed into place, with a BUILD_REPORT.json; then
``vlmspec caption ... --set method=hidden --set hidden.model=HEAD_DIR`` uses it.

``--arch eagle3`` trains an EAGLE-3 head instead (zoo/eagle3_train.py: the target's
default low, mid and high layers, a draft vocabulary of the ``--draft-vocab`` tokens its
answers use most, ``--stage1 + --stage2`` steps of a ``--feedback``-step training-time
test) and writes it in the layout vLLM, SGLang and SpecForge load (zoo/eagle3_export.py);
``--set method=eagle3 --set eagle3.model=HEAD_DIR`` uses it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from vlmspec_cli.runtime.models.hidden_head import HiddenHeadConfig


class HeadWriteError(ValueError):
    pass


def check_out(out: Path, force: bool, arch: str = "hidden") -> None:
    """``out`` must be new, an empty folder, or (``force``) a head of this ``arch`` vlmspec
    wrote: nothing else is ever replaced (a published EAGLE-3 head neither)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise HeadWriteError(f"{out}: exists and is not a folder; pick another --out")
    if not any(out.iterdir()):
        return
    if arch == "eagle3":
        from vlmspec_cli.zoo.eagle3_export import is_ours

        owned, kind = is_ours(out), "an EAGLE-3 head vlmspec wrote"
    else:
        try:
            config = json.loads((out / "config.json").read_text())
            owned = config.get("model_type") == HiddenHeadConfig.model_type
        except (OSError, ValueError, AttributeError):
            owned = False
        kind = "a vlmspec hidden head"
    if not owned:
        raise HeadWriteError(f"{out}: a folder that is not {kind}; vlmspec will not write "
                             "into it (pick a new --out)")
    if not force:
        raise HeadWriteError(f"{out}: holds {kind} already; --force replaces it")


def user_requests(target: str, samples: list[str], task: str, prompt: str | None,
                  max_new_tokens: int):
    """(profile, requests, one-line errors of unusable samples) for ``target``."""
    from vlmspec_cli.profile import load_profile

    sets = [f"target.model={target}", f"generation.max_new_tokens={max_new_tokens}"]
    if prompt:
        sets.append(f"generation.prompt={prompt}")
    profile = load_profile("tinyworld-video" if task == "video" else "tinyworld-caption", sets)
    if task == "video":
        from vlmspec_cli.tasks.video import expand_video_inputs as expand
    else:
        from vlmspec_cli.tasks.inputs import expand_inputs as expand
    from vlmspec_cli.tasks.calibrate_io import sample_requests

    requests, errors = sample_requests(profile, expand(samples, stdin=sys.stdin))
    return profile, requests, errors


def target_answers(lm, requests) -> list[list[int]]:
    """The target's own greedy tokens for each request (EOS included when it stopped)."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine
    from vlmspec_cli.runtime.round.verify import SamplingParams

    engine = SpeculativeEngine(lm, create_drafter("none"), 1, SamplingParams(0.0))
    return [engine.generate(req).tokens for req in requests]


def train_user_head(args) -> int:
    """The ``--target DIR`` mode of zoo/hidden.py; returns the exit code."""
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import ModelLoadError, load_model
    from vlmspec_cli.tasks.inputs import InputError
    from vlmspec_cli.zoo.hidden_train import collect, frozen_io, measure, new_head, train_head

    out = Path(args.out) if args.out else None
    workload = getattr(args, "workload", None)
    try:
        if out is None:
            raise HeadWriteError("--out HEAD_DIR is needed to train a head for your own target")
        if not args.samples and not workload:
            raise HeadWriteError("name the samples to train on (images, folders, videos with "
                                 "--task video) or a --workload FILE.jsonl")
        check_out(out, args.force, args.arch)
        requests, errors, dialogues = [], [], []
        if args.samples:
            _, requests, errors = user_requests(args.target, args.samples, args.task,
                                                args.prompt, args.max_new_tokens)
        if workload:
            from vlmspec_cli.zoo.hidden_workload import workload_dialogues

            dialogues, bad = workload_dialogues(workload)
            errors += bad
        for line in errors:
            print(line, file=sys.stderr)
        if not requests and not dialogues:
            raise HeadWriteError("no usable sample to train on")
        lm = load_model(ModelSpec(model=args.target, device=args.device, dtype="float32"), "target")
    except (HeadWriteError, InputError, ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    t0 = time.time()
    answers = target_answers(lm, requests)
    n_samples = len(requests)
    if dialogues:   # the workload's conversations, every turn answered by the target
        from vlmspec_cli.zoo.hidden_workload import workload_pairs

        more, more_answers, failed = workload_pairs(lm, dialogues, args.max_new_tokens)
        for line in failed:
            print(line, file=sys.stderr)
        errors += failed
        requests, answers = requests + more, answers + more_answers
        if not requests:
            print("error: no usable sample to train on", file=sys.stderr)
            return 2
    if args.arch == "eagle3":
        return _eagle3(args, lm, requests, answers, errors, out)
    layer = -1 if args.layer is None else args.layer
    data = collect(lm, requests, answers, layer)
    steps = args.feedback + 1
    head = new_head(lm, layer, max_steps=steps, seed=args.seed)
    embed, lm_head = frozen_io(lm)
    train_head(head, embed, lm_head, data, args.stage1, args.stage2, args.feedback, 32, 2e-3,
               args.seed, print)
    report = {"target": args.target, "layer": layer, "samples": n_samples,
              "conversations": len(requests) - n_samples, "skipped": len(errors), "stage1_steps": args.stage1, "stage2_steps": args.stage2,
              "train_s": round(time.time() - t0, 1),
              "params": sum(p.numel() for p in head.parameters()),
              "on_training_samples": measure(lm, head, requests[:8])}
    _write_head(head, report, out)
    print(json.dumps(report, indent=1))
    return 1 if errors else 0


def _eagle3(args, lm, requests, answers, errors, out: Path) -> int:
    """An EAGLE-3 head (zoo/eagle3_train.py) written in the published layout."""
    from vlmspec_cli.zoo.eagle3_export import train_eagle3, write_head_dir

    try:
        head, report = train_eagle3(lm, requests, answers, steps=args.stage1 + args.stage2,
                                    ttt=args.feedback, draft_vocab=args.draft_vocab, seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = {"target": args.target, "skipped": len(errors), "examples": len(requests), **report}
    write_head_dir(head, report, out)
    print(json.dumps(report, indent=1))
    return 1 if errors else 0


def _write_head(head, report: dict, out: Path) -> None:
    """Save into a temporary sibling folder, then move it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        head.save_pretrained(tmp)
        (tmp / "BUILD_REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)          # an empty folder, or our own head (check_out, --force)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
