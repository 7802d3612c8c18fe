"""Distil the caption draft onto a built target: ``python -m vlmspec_cli.zoo.distill_draft``
writes ``llava-deep-draft``, the 1-layer ``llava-draft`` fine-tuned on the 32-layer target's
own greedy answers.

Why: speculative decoding accepts what the *target* would say, so a draft should learn the
target's outputs, not the world's reference answers (sequence-level distillation, as
DistillSpec's). ``llava-draft`` was trained on the reference answers; the deep target
(``zoo/deepen.py``) says something else wherever either model is wrong, and the chain's τ
fell from 3.47 on the 8-layer target to 2.93 on the deep one (bench/runs/2026-11-24/engine-deep-cpu.json).

How: world conversations (the build's own mix) are answered by the target, turn by turn
and greedily, through vlmspec's own batched target-only decoding (a later turn reads the
target's earlier answers, as in use); the draft, starting from ``llava-draft``'s weights,
trains on those answers read through the drafting-input mix it was built with
(multimodal, text, caption); its vision tower stays frozen. τ of chain M against the
target is measured on fresh scenes before and after and written to BUILD_REPORT.json.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
from pathlib import Path

import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.build import DRAFT_INPUT_MIX, make_dataset, train
from vlmspec_cli.zoo.train import arg_parser, parse_args


def _load(out: Path, name: str):
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import load_model

    return load_model(ModelSpec(model=str(out / name), device="cpu", dtype="float32"), name)


def target_answers(target, conversations: list[list], batch_size: int,
                   max_new_tokens: int = 48) -> list[list]:
    """Each conversation with its assistant turns replaced by the target's greedy answers."""
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine, decode_text, eos_token_ids
    from vlmspec_cli.runtime.request import Message, Request
    from vlmspec_cli.runtime.round.verify import SamplingParams

    engine = SpeculativeEngine(target, None, 1, SamplingParams(0.0), batch_size)
    eos = eos_token_ids(target)
    convs = [list(turns) for turns in conversations]
    turn = 0
    while True:
        # conversations with an assistant turn at this position: (conversation, turn index)
        todo = [(c, i) for c, turns in enumerate(convs)
                for i in [k for k, t in enumerate(turns) if t.role == "assistant"][turn:turn + 1]]
        if not todo:
            return convs
        def request(item):
            c, i = item
            msgs = [Message(t.role, t.text, tuple(t.images)) for t in convs[c][:i]]
            return Request(msgs, max_new_tokens=max_new_tokens)
        for (c, i), res in engine.run(todo, request):
            if isinstance(res, Exception):
                raise res
            convs[c][i] = dataclasses.replace(convs[c][i], text=decode_text(target, res.tokens, eos))
        turn += 1


def eval_set(target, n: int, seed: int) -> list[tuple]:
    """``n`` fresh requests and the target's own greedy tokens for each (decoded once, for
    both drafts' evaluation)."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine
    from vlmspec_cli.runtime.round.verify import SamplingParams
    from vlmspec_cli.zoo.hidden import llava_data

    requests, _ = llava_data(n, seed)
    alone = SpeculativeEngine(target, create_drafter("none"), 1, SamplingParams(0.0))
    return [(req, alone.generate(req).tokens) for req in requests]


def chain_tau(target, draft, evaluation: list[tuple], gamma: int = 5) -> dict:
    """τ of chain M (the default's drafting) against the target on the ``eval_set``, greedy,
    and how many decoded exactly the target's own tokens (all of them, or it is a bug)."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine
    from vlmspec_cli.runtime.round.verify import SamplingParams
    from vlmspec_cli.runtime.stats import SpecStats

    greedy = SamplingParams(0.0)
    drafter = create_drafter("chain", draft=draft, sampling=greedy, drafting_input="multimodal",
                             image_token=target.adapter.image_token(target))
    engine = SpeculativeEngine(target, drafter, gamma, greedy)
    stats, same = SpecStats(), 0
    for req, reference in evaluation:
        res = engine.generate(req)
        stats.merge(res.state.stats)
        same += res.tokens == reference
    return {"requests": len(evaluation), "identical": same,
            "mean_acceptance_length": round(stats.mean_accept_len, 3)}


def main(argv=None) -> None:
    ap = arg_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="llava-target-deep", help="the built target")
    ap.add_argument("--draft", default="llava-draft", help="the draft to start from")
    ap.add_argument("--name", default="llava-deep-draft", help="the distilled draft's name")
    ap.add_argument("--examples", type=int, default=3000, help="conversations the target answers")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=8, help="rows of the target's decoding")
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--eval", type=int, default=40, help="fresh requests for τ before and after")
    args = parse_args(ap, argv, deterministic=False)
    if (args.out / args.name).resolve() in {(args.out / m).resolve() for m in (args.target, args.draft)}:
        ap.error(f"--name {args.name}: is the model it is built from; pick another name")
    t0 = time.time()
    target = _load(args.out, args.target)
    rng = random.Random(args.seed + 31)
    conversations = [world.sample_mix(rng)[1] for _ in range(args.examples)]
    answered = target_answers(target, conversations, args.batch_size)
    answer_s = time.time() - t0
    changed = sum(a.text != b.text for x, y in zip(conversations, answered)
                  for a, b in zip(x, y) if a.role == "assistant")
    print(f"target answered {len(answered)} conversations in {answer_s:.0f}s; "
          f"{changed} answers differ from the reference", flush=True)

    processor = LlavaProcessor.from_pretrained(args.out / args.draft)
    data = make_dataset(processor, 0, args.seed + 1, inputs=DRAFT_INPUT_MIX, conversations=answered)
    evaluation = eval_set(target, args.eval, 20_000 + args.seed)
    before = chain_tau(target, _load(args.out, args.draft), evaluation)
    print(f"[{args.draft}] {json.dumps(before)}", flush=True)
    model = LlavaForConditionalGeneration.from_pretrained(args.out / args.draft, use_safetensors=True)
    t1 = time.time()
    train(model, data, args.steps, args.lr, args.batch_tokens, args.seed,
          processor.tokenizer.pad_token_id, args.name)
    train_s = time.time() - t1
    out = args.out / args.name
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for extra in ("chat_template.jinja", "processor_config.json", "tokenizer.json",
                  "tokenizer_config.json", "generation_config.json"):
        if (args.out / args.draft / extra).exists():
            shutil.copy(args.out / args.draft / extra, out / extra)
    after = chain_tau(target, _load(args.out, args.name), evaluation)
    report = {"target": args.target, "from": args.draft, "conversations": args.examples,
              "answers_changed_from_reference": changed, "steps": args.steps, "lr": args.lr,
              "answer_s": round(answer_s, 1), "train_s": round(train_s, 1),
              "chain_M_gamma5": {"before": before, "after": after}}
    (out / "BUILD_REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1), flush=True)


if __name__ == "__main__":
    main()
