"""Train hidden-state draft heads (runtime/hidden_head.py) for the tinyworld targets.

Data: tinyworld requests with their reference answers, run once through the frozen target
exactly as the runtime feeds it (``adapter.encode`` + one forward with hidden states), so
the head learns from the states it will read when drafting. Kept per example: the ids,
which positions are visual, the chosen layer's states and the target's top-K next-token
distribution (the head is distilled towards the target's own predictions).

Two stages (HiViS §3.3):

1. single-step: every pair (e(x_{t+1}), h_t) reads the target's own h_t;
2. multi-step self-feedback: the pairs read the head's previous-step outputs instead,
   o^j_t = head(e(x_{t+1}), o^{j-1}_{t-1}) for j = 1..K, with step embeddings s_j.

Loss per step: Smooth-L1(o_t, h_{t+1}) + CE(draft logits, the target's argmax) + a top-K
term (cross-entropy against the target's distribution renormalised over its top K tokens:
agreement where the target itself is confident, HiViS' top-K filtering).

``python -m vlmspec_cli.zoo.hidden --target llava`` (or ``llava-deep``, ``video``, ``video-deep``) writes
``weights/tinyworld/<target>-hidden`` and a BUILD_REPORT.json with the acceptance the
head reaches on fresh requests. ``--target DIR_OR_HUB_ID SAMPLES... --out HEAD_DIR``
trains one for any target vlmspec adapts, on the user's own images or videos
(zoo/hidden_user.py).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlmspec_cli.runtime.hidden_head import HiddenDraftHead, HiddenHeadConfig, prompt_pairs
from vlmspec_cli.zoo.train import arg_parser, optimize, parse_args, warmup_cosine

TOP_K = 8


@dataclass
class Example:
    next_ids: torch.Tensor     # (n,) x_{t+1} of each text pair
    hidden: torch.Tensor       # (n, H) h_t
    target_h: torch.Tensor     # (n, H) h_{t+1}
    topk_p: torch.Tensor       # (n, K) target's distribution of x_{t+2}, top K, renormalised
    topk_i: torch.Tensor       # (n, K)
    valid: torch.Tensor        # (n,) bool: t+1 is a text position with a next token
    contiguous: torch.Tensor   # (n,) bool: pair i-1 sits at position t_i - 1


@torch.inference_mode()
def collect(lm, requests, answers, layer: int, bridge: bool = False) -> list[Example]:
    """Run each request + its reference answer through the target (the runtime's inputs).

    ``bridge`` (Sparrow's IVSB, training only): put the visual tokens' states from the
    target's middle layer in front of each example's text pairs, so the head can attend to
    them while it learns; they are never a loss target, and at decoding time there are
    none (the head's cache stays text-only)."""
    out = []
    for req, answer in zip(requests, answers):
        prompt = lm.adapter.prompt_text(lm, req.messages)
        videos = {"videos": req.videos} if req.videos else {}
        inputs = lm.adapter.encode(lm, prompt, req.images or None, **videos)
        tail = answer_ids(lm, answer)
        ids = torch.cat([inputs["input_ids"], tail], 1)
        inputs = dict(inputs, input_ids=ids)
        # 3-D positions (Qwen2.5-VL) for the longer sequence: let the model recompute them
        inputs.pop("position_ids", None)
        inputs.pop("rope_deltas", None)
        if "attention_mask" in inputs:
            inputs["attention_mask"] = torch.ones_like(ids)
        if "mm_token_type_ids" in inputs:
            inputs["mm_token_type_ids"] = torch.cat(
                [inputs["mm_token_type_ids"], torch.zeros_like(tail, dtype=inputs["mm_token_type_ids"].dtype)], 1)
        res = lm.model(**inputs, output_hidden_states=True)
        hs = res.hidden_states[layer][0].float()
        probs = torch.softmax(res.logits[0].float(), -1)
        ids = ids[0]
        visual = lm.adapter.visual_mask(lm, ids)
        nxt, rows = prompt_pairs(ids, hs, visual)
        pos = (~visual[:-1]).nonzero().flatten()            # t of each pair
        n = len(pos)
        t1 = pos + 1
        valid = ~visual[t1] & (t1 < len(ids) - 1)
        p, i = probs[t1].topk(TOP_K, -1)
        contiguous = torch.zeros(n, dtype=torch.bool)
        contiguous[1:] = pos[1:] == pos[:-1] + 1
        ex = Example(nxt.cpu(), rows.cpu(), hs[t1].cpu(), (p / p.sum(-1, keepdim=True)).cpu(),
                     i.cpu(), valid.cpu(), contiguous)
        if bridge and visual.any():
            middle = res.hidden_states[len(res.hidden_states) // 2][0][visual].float().cpu()
            ex = with_bridge(ex, ids[visual].cpu(), middle)
        out.append(ex)
    return out


def answer_ids(lm, answer: str | list[int]) -> torch.Tensor:
    """(1, n) ids of an answer: reference text (then EOS), or the target's own tokens."""
    if not isinstance(answer, str):
        return torch.tensor([answer], dtype=torch.long, device=lm.device)
    tail = lm.tokenizer(" " + answer, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return torch.cat([tail, torch.tensor([[lm.tokenizer.eos_token_id]])], 1).to(lm.device)


def with_bridge(ex: Example, visual_ids: torch.Tensor, states: torch.Tensor) -> Example:
    """IVSB: the visual tokens' middle-layer states as pairs before the text pairs (no
    loss on them, never replaced by self-feedback)."""
    n = len(visual_ids)
    zeros = lambda t: torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype)  # noqa: E731
    return Example(torch.cat([visual_ids, ex.next_ids]), torch.cat([states, ex.hidden]),
                   torch.cat([zeros(ex.target_h), ex.target_h]),
                   torch.cat([zeros(ex.topk_p), ex.topk_p]), torch.cat([zeros(ex.topk_i), ex.topk_i]),
                   torch.cat([torch.zeros(n, dtype=torch.bool), ex.valid]),
                   torch.cat([torch.zeros(n, dtype=torch.bool), ex.contiguous]))


def pad_batch(examples: list[Example]):
    n = max(len(e.next_ids) for e in examples)

    def pad(t, fill=0):
        shape = (len(examples), n) + tuple(t[0].shape[1:])
        buf = torch.full(shape, fill, dtype=t[0].dtype)
        for k, x in enumerate(t):
            buf[k, : len(x)] = x
        return buf

    get = lambda name: [getattr(e, name) for e in examples]  # noqa: E731
    return {name: pad(get(name)) for name in
            ("next_ids", "hidden", "target_h", "topk_p", "topk_i", "valid", "contiguous")}


def head_loss(head, embed, lm_head, batch, steps: int, weights=(1.0, 0.5, 0.5)):
    """Sum over self-feedback steps 0..steps of Smooth-L1 + CE + top-K CE on valid pairs."""
    b, n = batch["next_ids"].shape
    pos = torch.arange(n)[None].expand(b, n)
    e = embed(batch["next_ids"])
    h_in = batch["hidden"]
    valid = batch["valid"]
    total = 0.0
    for j in range(steps + 1):
        step_ids = torch.full((b, n), j)
        o = head(e, h_in, pos, None, steps=step_ids)
        logits = lm_head(head.norm(o)).float()
        l1 = F.smooth_l1_loss(o[valid], batch["target_h"][valid])
        ce = F.cross_entropy(logits[valid], batch["topk_i"][valid][:, 0])
        logp = torch.log_softmax(logits[valid], -1).gather(-1, batch["topk_i"][valid])
        topk = -(batch["topk_p"][valid] * logp).sum(-1).mean()
        total = total + weights[0] * l1 + weights[1] * ce + weights[2] * topk
        # next step reads the head's own previous outputs (shifted one pair), where the
        # previous pair is the previous position; elsewhere the target's state
        shifted = torch.cat([h_in[:, :1], o[:, :-1]], 1)
        h_in = torch.where(batch["contiguous"][..., None], shifted, batch["hidden"])
    return total / (steps + 1)


def train_head(head, embed, lm_head, data: list[Example], stage1: int, stage2: int,
               feedback_steps: int, batch_size: int, lr: float, seed: int, log) -> None:
    """Stage 1 (``stage1`` steps) reads the target's states, stage 2 (``stage2`` steps)
    ``feedback_steps`` steps of the head's own outputs; ``log`` gets the progress lines."""
    rng = random.Random(seed)
    total = stage1 + stage2

    def batch_loss(step):
        batch = pad_batch(rng.sample(data, min(batch_size, len(data))))
        stage = 1 if step < stage1 else 2
        loss = head_loss(head, embed, lm_head, batch, 0 if stage == 1 else feedback_steps)
        return loss, lambda: f"stage {stage} loss {loss.item():.4f}"

    head.train()
    optimize([p for p in head.parameters() if p.requires_grad], total, batch_loss, "head",
             lr=lr, weight_decay=0.0, schedule=warmup_cosine(50, total), log=log)
    head.eval()


def new_head(lm, layer: int, max_steps: int, seed: int) -> HiddenDraftHead:
    torch.manual_seed(seed)
    text = lm.model.get_input_embeddings().weight
    config = lm.model.config.get_text_config()
    head = HiddenDraftHead(HiddenHeadConfig(
        hidden_size=text.shape[1], intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=getattr(config, "num_key_value_heads", None),
        head_dim=getattr(config, "head_dim", None), rms_norm_eps=config.rms_norm_eps,
        target_layer=layer, max_steps=max_steps, vocab_size=lm.vocab_size,
        target_model_type=lm.model.config.model_type))
    # start the head's norm as the target's final norm (it feeds the same LM head)
    norm = getattr(getattr(lm.model.model, "language_model", lm.model.model), "norm", None)
    if norm is not None:
        head.norm.load_state_dict(norm.state_dict())
    return head


def frozen_io(lm):
    embed, lm_head = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    for p in list(embed.parameters()) + list(lm_head.parameters()):
        p.requires_grad_(False)
    return embed, lm_head


def measure(lm, head, requests, gamma: int = 5) -> dict:
    """Mean acceptance length of the head drafting for the target (T = 0), and equality
    with target-only decoding."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.engine import SpeculativeEngine, eos_token_ids
    from vlmspec_cli.runtime.verify import SamplingParams

    greedy = SamplingParams(0.0)
    spec = SpeculativeEngine(lm, create_drafter("hidden", target=lm, head=head, sampling=greedy,
                                                eos_ids=eos_token_ids(lm)), gamma, greedy)
    base = SpeculativeEngine(lm, create_drafter("none"), 1, greedy)
    acc = drafts = same = 0
    for req in requests:
        a, b = spec.generate(req), base.generate(req)
        same += a.tokens == b.tokens
        acc += a.state.stats.num_accepted_tokens
        drafts += a.state.stats.num_drafts
    return {"requests": len(requests), "identical": same,
            "mean_accept_len": round(1 + acc / max(drafts, 1), 3)}


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


TARGETS = {
    "llava": ("zoo:tinyworld/llava-target", "llava-hidden", llava_data, -1),
    # the 32-layer caption target (zoo/deepen.py): same data, its own head
    "llava-deep": ("zoo:tinyworld/llava-target-deep", "llava-deep-hidden", llava_data, -1),
    "video": ("zoo:tinyworld/qwen-video-target", "qwen-video-hidden", video_data, -2),
    # the 24-layer video target (zoo/deepen.py --family video)
    "video-deep": ("zoo:tinyworld/qwen-video-target-deep", "qwen-video-deep-hidden", video_data, -2),
}


def build(name: str, examples: int, stage1: int, stage2: int, feedback: int, layer: int | None,
          seed: int = 0, save: bool = True, bridge: bool = False, max_steps: int | None = None) -> dict:
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models import ZOO_ROOT, load_model

    model, out_name, data_fn, default_layer = TARGETS[name]
    layer = default_layer if layer is None else layer
    torch.manual_seed(seed)
    lm = load_model(ModelSpec(model=model, device="cpu", dtype="float32"), "target")
    t0 = time.time()
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
    report = {"target": model, "layer": layer, "ivsb": bridge, "step_embeddings": steps,
              "examples": examples, "stage1_steps": stage1,
              "stage2_steps": stage2, "feedback_steps": feedback,
              "collect_s": round(collect_s, 1), "train_s": round(train_s, 1),
              "params": sum(p.numel() for p in head.parameters()),
              "fresh": measure(lm, head, fresh)}
    print(json.dumps(report, indent=1))
    if save:
        path = ZOO_ROOT / "tinyworld" / out_name
        head.save_pretrained(path)
        (path / "BUILD_REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> None:
    ap = arg_parser(__doc__.split("\n")[0], out=None)
    ap.add_argument("--target", default="llava",
                    help=f"a tinyworld target ({', '.join(sorted(TARGETS))}), or any model: a "
                         "directory or hub id, trained on SAMPLES into --out")
    ap.add_argument("samples", nargs="*", help="your target: images, folders, globs, - (stdin)")
    ap.add_argument("--out", default=None, help="your target: the head's folder (new or empty)")
    ap.add_argument("--force", action="store_true", help="replace a head already in --out")
    ap.add_argument("--task", choices=("caption", "video"), default="caption")
    ap.add_argument("--prompt", default=None, help="your target: the question asked of each sample")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--examples", type=int, default=1500)
    ap.add_argument("--stage1", type=int, default=600)
    ap.add_argument("--stage2", type=int, default=300)
    ap.add_argument("--feedback", type=int, default=3, help="self-feedback steps in stage 2")
    ap.add_argument("--layer", type=int, default=None, help="target hidden_states index")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--ivsb", action="store_true",
                    help="Sparrow IVSB: middle-layer visual states as extra training input")
    ap.add_argument("--step-embeddings", type=int, default=None,
                    help="number of step embeddings (0: none; default feedback + 1)")
    args = parse_args(ap, argv, deterministic=False)
    if args.target not in TARGETS:
        from vlmspec_cli.zoo.hidden_user import train_user_head

        raise SystemExit(train_user_head(args))
    build(args.target, args.examples, args.stage1, args.stage2, args.feedback, args.layer,
          seed=args.seed, save=not args.no_save, bridge=args.ivsb, max_steps=args.step_embeddings)


if __name__ == "__main__":
    main()
