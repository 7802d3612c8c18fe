"""How a hidden-state draft head (runtime/models/hidden_head.py) is trained: the data collected
from the frozen target and the two training stages. zoo/hidden.py builds the tinyworld
heads with it, zoo/hidden_user.py a head for the user's own target.

Data: requests with their answers, run once through the frozen target exactly as the
runtime feeds it (``adapter.encode`` + one forward with hidden states), so the head learns
from the states it will read when drafting. Kept per example: the ids, which positions are
visual, the chosen layer's states and the target's top-K next-token distribution (the
head is distilled towards the target's own predictions).

Two stages (HiViS §3.3):

1. single-step: every pair (e(x_{t+1}), h_t) reads the target's own h_t;
2. multi-step self-feedback: the pairs read the head's previous-step outputs instead,
   o^j_t = head(e(x_{t+1}), o^{j-1}_{t-1}) for j = 1..K, with step embeddings s_j.

Loss per step: Smooth-L1(o_t, h_{t+1}) + CE(draft logits, the target's argmax) + a top-K
term (cross-entropy against the target's distribution renormalised over its top K tokens:
agreement where the target itself is confident, HiViS' top-K filtering).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead, HiddenHeadConfig, prompt_pairs
from vlmspec_cli.zoo.train import optimize, warmup_cosine

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


def measure(lm, head, requests, gamma: int = 5, method: str = "hidden") -> dict:
    """Mean acceptance length of the head drafting chains for the target (T = 0), and
    equality with target-only decoding. ``method``: the head's kind (hidden, eagle3)."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
    from vlmspec_cli.runtime.round.verify import SamplingParams

    greedy = SamplingParams(0.0)
    spec = SpeculativeEngine(lm, create_drafter(method, target=lm, head=head, sampling=greedy,
                                                eos_ids=eos_token_ids(lm)), gamma, greedy)
    base = SpeculativeEngine(lm, create_drafter("none"), 1, greedy)
    acc = drafts = same = 0
    for req in requests:
        a, b = spec.generate(req), base.generate(req)
        same += a.tokens == b.tokens
        acc += a.state.stats.num_accepted_tokens
        drafts += a.state.stats.num_drafts
    return {"requests": len(requests), "identical": same,
            "mean_acceptance_length": round(1 + acc / max(drafts, 1), 3)}
