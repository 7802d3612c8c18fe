"""Training an EAGLE-3 head (runtime/models/eagle3_head.py) on a target's own answers, the way
SpecForge trains one, small: what zoo/hidden.py ``--arch eagle3`` runs, for a tinyworld
target or the user's own (zoo/hidden_user.py); zoo/eagle3_export.py writes the result in
the published layout.

Data: each request with the target's answer runs once through the frozen target (the
runtime's own inputs, as zoo/hidden_train.py ``collect``). Kept per example: the ids, the
concatenated low ⊕ mid ⊕ high states g_t (the default layers 2, L // 2, L - 3 every engine
reads without a layer key), the positions (3-D for M-RoPE targets) and the target's
top-K next-token distribution at each position.

The draft vocabulary: the ``draft_vocab`` target ids the answers use most (SpecForge's
rule; filled up with the lowest unused ids), sorted, so d2t = id − index and t2d marks them.

Training-time test (EAGLE-3 §3.2): step 0 reads pairs (e(x_{t+1}), fc(g_t)); step j reads
(e(x_{t+1}), o^{j-1}_{t-1}), the previous step's output one position back, and attends as
decoding does: to step 0's keys at positions ≤ t − j and to its own chain, step i's key at
t − j + i (i = 1..j). Every step at t is scored against the target's distribution of
x_{t+2} restricted to the draft vocabulary (cross-entropy, step j weighted 0.8^j), on the
answer's positions only.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlmspec_cli.runtime.models.eagle3_format import Eagle3Config
from vlmspec_cli.runtime.models.eagle3_head import Eagle3Head
from vlmspec_cli.zoo.hidden_train import answer_ids
from vlmspec_cli.zoo.hidden_train import measure as hidden_measure
from vlmspec_cli.zoo.train import optimize, warmup_cosine

TOP_K = 8
STEP_WEIGHT = 0.8


@dataclass
class Example:
    ids: torch.Tensor        # (L,)
    states: torch.Tensor     # (L, 3H) target low ⊕ mid ⊕ high
    positions: torch.Tensor  # (3, L)
    top_p: torch.Tensor      # (L, K) target's next-token distribution at t (top K)
    top_i: torch.Tensor      # (L, K)
    answer: torch.Tensor     # (L,) bool: the token after t+1 is the answer's


def default_layers(lm) -> tuple[int, int, int]:
    """hidden_states indices every engine reads when a head names no layers."""
    n = int(lm.model.config.get_text_config().num_hidden_layers)
    if n < 4:
        raise ValueError(f"the target has {n} decoder layers; EAGLE-3's default layers "
                         "(2, L/2, L-3) need at least 4")
    return 2, n // 2, n - 3


def _sequence(lm, req, answer):
    """The request + its answer as the target's inputs, and its (3, L) positions."""
    prompt = lm.adapter.prompt_text(lm, req.messages)
    videos = {"videos": req.videos} if req.videos else {}
    inputs = lm.adapter.encode(lm, prompt, req.images or None, **videos)
    tail = answer_ids(lm, answer)
    n_prompt, ids = inputs["input_ids"].shape[1], torch.cat([inputs["input_ids"], tail], 1)
    given, delta = inputs.pop("position_ids", None), inputs.pop("rope_deltas", None)
    later = torch.arange(n_prompt, ids.shape[1])
    if given is not None and given.dim() == 3:
        later = later + int(delta.flatten()[0])
        positions = torch.cat([given[:, 0].cpu(), later[None].expand(3, -1)], 1)
    else:
        positions = torch.arange(ids.shape[1])[None].expand(3, -1)
    inputs = dict(inputs, input_ids=ids)
    if "attention_mask" in inputs:
        inputs["attention_mask"] = torch.ones_like(ids)
    if "mm_token_type_ids" in inputs:
        types = inputs["mm_token_type_ids"]
        inputs["mm_token_type_ids"] = torch.cat([types, torch.zeros_like(tail, dtype=types.dtype)], 1)
    return inputs, positions, n_prompt


@torch.inference_mode()
def collect(lm, requests, answers, layers) -> list[Example]:
    out = []
    for req, answer in zip(requests, answers):
        inputs, positions, n_prompt = _sequence(lm, req, answer)
        res = lm.model(**inputs, output_hidden_states=True)
        states = torch.cat([res.hidden_states[i][0] for i in layers], -1).float()
        p, i = torch.softmax(res.logits[0].float(), -1).topk(TOP_K, -1)
        n = inputs["input_ids"].shape[1]
        t = torch.arange(n)
        # pair t (x_{t+1}, g_t) predicts x_{t+2}: the target's distribution at t + 1
        answer_rows = (t + 2 >= n_prompt) & (t + 2 < n)
        out.append(Example(inputs["input_ids"][0].cpu(), states.cpu(), positions,
                           p.cpu(), i.cpu(), answer_rows))
    return out


def draft_vocabulary(examples: list[Example], vocab: int, size: int) -> torch.Tensor:
    """The ``size`` target ids the answers use most, sorted (the draft id → target id map)."""
    size = min(size, vocab)
    counts = Counter()
    for ex in examples:
        counts.update(ex.top_i[ex.answer, 0].tolist())
    chosen = [tok for tok, _ in counts.most_common(size)]
    taken = set(chosen)
    chosen += [t for t in range(vocab) if t not in taken][: size - len(chosen)]
    return torch.tensor(sorted(chosen))


def new_head(lm, draft_ids: torch.Tensor, seed: int) -> Eagle3Head:
    """An EAGLE-3 head as wide as the target's text decoder, its rotary the target's (its
    M-RoPE sections too), its vocabulary map set; the head's norm starts as the target's."""
    torch.manual_seed(seed)
    text = lm.model.config.get_text_config()
    rope = dict(getattr(text, "rope_parameters", None) or {})
    width = int(lm.model.get_input_embeddings().weight.shape[1])
    heads = int(text.num_attention_heads)
    scaling = None
    if rope.get("mrope_section"):
        scaling = {"type": "mrope", "mrope_section": list(rope["mrope_section"])}
        if rope.get("mrope_interleaved"):
            scaling["mrope_interleaved"] = True
    config = Eagle3Config(
        hidden_size=width, target_hidden_size=width, intermediate_size=int(text.intermediate_size),
        heads=heads, kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or width // heads),
        rms_norm_eps=float(text.rms_norm_eps), rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=scaling, max_position_embeddings=int(text.max_position_embeddings),
        vocab_size=lm.vocab_size, draft_vocab_size=len(draft_ids), attention_bias=False,
        norm_before_residual=False, raw={"target_model_type": lm.model.config.model_type})
    head = Eagle3Head(config)
    with torch.no_grad():
        head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        head.t2d.zero_()
        head.t2d[draft_ids] = True
        for p in head.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        norm = getattr(getattr(lm.model.model, "language_model", lm.model.model), "norm", None)
        if norm is not None:
            head.norm.weight.copy_(norm.weight.float())
    head.set_vocab_map()
    return head


def _batch(examples: list[Example], draft_index: torch.Tensor):
    """Padded tensors of a batch; the targets' top-K put on draft ids (renormalised over
    those the draft vocabulary holds; rows with none are not scored)."""
    n = max(len(e.ids) for e in examples) - 1
    b = len(examples)
    ids = torch.zeros(b, n, dtype=torch.long)
    states = torch.zeros(b, n, examples[0].states.shape[1])
    positions = torch.zeros(3, b, n, dtype=torch.long)
    probs = torch.zeros(b, n, TOP_K)
    picks = torch.zeros(b, n, TOP_K, dtype=torch.long)
    scored = torch.zeros(b, n, dtype=torch.bool)
    for r, e in enumerate(examples):
        m = len(e.ids) - 1                                  # pairs t = 0 .. L-2
        ids[r, :m], states[r, :m], positions[:, r, :m] = e.ids[1:], e.states[:m], e.positions[:, :m]
        top_i = e.top_i[1:]                                 # the target at t + 1
        mapped = draft_index[top_i]                         # -1: not in the draft vocabulary
        p = torch.where(mapped >= 0, e.top_p[1:], 0.0)
        mass = p.sum(-1, keepdim=True)
        probs[r, :m] = p / mass.clamp_min(1e-9)
        picks[r, :m] = mapped.clamp_min(0)
        scored[r, :m] = e.answer[:m] & (mass[:, 0] > 0)
    return ids, states, positions, probs, picks, scored


def _ttt_mask(n: int, step: int, device) -> torch.Tensor:
    """(n, (step + 1)·n) bool: what step ``step`` at position t sees, as in decoding."""
    t = torch.arange(n, device=device)[:, None]
    s = torch.arange(n, device=device)[None]
    blocks = [s <= t - step] + [s == t - step + i for i in range(1, step + 1)]
    return torch.cat(blocks, 1)


def ttt_outputs(head: Eagle3Head, embeds: torch.Tensor, states: torch.Tensor,
                positions: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's outputs o^0 … o^steps (each (B, n, H)) over pairs (embeds[t], states[t])
    at positions (3, B, n): step 0 reads fc(g_t), step j the previous step's output at
    t − 1, attending as decoding does (``_ttt_mask``)."""
    c = head.config
    b, n = embeds.shape[:2]
    groups = c.heads // c.kv_heads
    hidden = head.project(states)
    keys, values, outs = [], [], []
    for j in range(steps + 1):
        x, residual = head.layer_input(embeds, hidden)
        q, k, v = head.qkv(x, positions)
        keys.append(k)
        values.append(v)
        o = F.scaled_dot_product_attention(
            q, torch.cat(keys, 2).repeat_interleave(groups, 1),
            torch.cat(values, 2).repeat_interleave(groups, 1),
            attn_mask=_ttt_mask(n, j, embeds.device))
        outs.append(head.finish_layer(residual, o.transpose(1, 2).reshape(b, n, -1)))
        hidden = torch.cat([hidden[:, :1], outs[-1][:, :-1]], 1)   # o^j_{t-1} feeds step j+1 at t
    return outs


def ttt_loss(head: Eagle3Head, embed, batch, steps: int):
    """Σ_j 0.8^j · CE(step j's draft logits, the target's restricted distribution), and
    the top-1 agreement of step 0 (a progress note)."""
    ids, states, positions, probs, picks, scored = batch
    total, weights, agree = 0.0, 0.0, 0.0
    for j, out in enumerate(ttt_outputs(head, embed(ids), states, positions, steps)):
        logp = torch.log_softmax(head.logits(out).float(), -1)
        rows = scored.clone()
        rows[:, :j] = False                                # no chain of j steps before t = j
        if rows.any():
            ce = -(probs[rows] * logp[rows].gather(-1, picks[rows])).sum(-1).mean()
            total, weights = total + STEP_WEIGHT ** j * ce, weights + STEP_WEIGHT ** j
            if j == 0:
                agree = float((logp[rows].argmax(-1) == picks[rows][:, 0]).float().mean())
    return total / max(weights, 1e-9), agree


def train(head: Eagle3Head, embed, data: list[Example], steps: int, ttt: int, batch_size: int,
          lr: float, seed: int, log) -> None:
    rng = random.Random(seed)
    draft_index = torch.full((head.config.vocab_size,), -1, dtype=torch.long)
    draft_index[head.target_ids.cpu()] = torch.arange(head.config.draft_vocab_size)

    def batch_loss(step):
        loss, agree = ttt_loss(head, embed, _batch(rng.sample(data, min(batch_size, len(data))),
                                                   draft_index), ttt)
        return loss, lambda: f"loss {loss.item():.4f} top-1 {agree:.2f}"

    for p in embed.parameters():
        p.requires_grad_(False)
    head.train()
    optimize([p for p in head.parameters() if p.requires_grad], steps, batch_loss, "eagle3",
             lr=lr, weight_decay=0.0, schedule=warmup_cosine(min(50, steps), steps), log=log)
    head.eval()


def measure(lm, head, requests, gamma: int = 5) -> dict:
    """zoo/hidden_train.measure for an EAGLE-3 head (its chains against target-only)."""
    return hidden_measure(lm, head, requests, gamma, method="eagle3")
