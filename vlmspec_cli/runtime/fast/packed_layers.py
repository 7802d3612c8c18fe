"""Packed decoder layers: a draft model's decoding step in fewer operators.

A small draft's step on a CPU is almost all per-operator cost: the 1-layer tinyworld draft
spends 0.26 ms a step in operators whose arithmetic takes a few microseconds each (RMSNorm
alone is eight of them, the rotary embedding about ten). A chain drafts γ such steps a
round, so their count decides how much of the round the draft takes. Here the same layer
runs in fewer (0.13 ms a step: bench/draft_step.py, bench/runs/2026-11-26/draft-step-s45.txt):

* q, k and v come from one matrix product over their weights stacked (as gate and up);
* each RMSNorm's weight (and √H) is folded into the matrix after it (its input rows), and
  the norm itself is x / √(‖x‖² + H ε): three operators (``normed``); the final norm,
  whose output is also a hidden state read out, is torch's ``F.rms_norm``;
* cos/sin are rows of a table filled from the model's own rotary module (for 1-D positions:
  the module's product is one multiplication per entry, so rows equal its output), and
  rotate-half is one ``roll`` against a sign-folded sine, for q and k together.

The results equal the eager layer's up to float rounding, not bit for bit: so this runs
only in **drafts**, whose proposals the target verifies (any draft is lossless; rounding
at most moves a near-tie proposal), never in the target, whose steps stay the eager
computation op for op (fast_decoder.py). ``pack_layers`` answers None for a layer it does
not know exactly (quantized or biased MLP weights, per-head q/k norms, another norm or
activation): that decoder keeps the eager path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlmspec_cli.runtime.fast.wide_rows import in_out, plain_weight, times


@dataclass
class PackedLayer:
    # every matrix laid out (in, out) for x·W (on a CPU, MKL's kernel against nn.Linear's
    # (out, in) layout took about twice the time on such small products: runtime/fast/wide_rows.py)
    # q_proj, k_proj, v_proj side by side, (H, q + k + v outputs), each row scaled by the
    # input RMSNorm's weight and √H (``normed``); the bias as is
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor       # (H, 2 I): gate_proj beside up_proj, scaled as qkv (post norm)
    down: torch.Tensor
    eps_in: torch.Tensor        # √(H ε) of each norm, as a 0-d tensor (``normed``)
    eps_post: torch.Tensor


def normed(x: torch.Tensor, root_eps: torch.Tensor) -> torch.Tensor:
    """x / √(‖x‖² + H ε) over its last axis: RMSNorm's x / √(mean(x²) + ε) is √H times
    this (the √H and the norm's weight are folded into the next matrix's columns). Three
    operators (a norm, a hypot, a division) where the eager norm takes eight. ε is kept:
    on a small model's token embeddings mean(x²) is ~1e-3, where dropping ε = 1e-6 moved
    the outputs by 1e-3 of their size."""
    return x / torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), root_eps)


def rms_weight(norm) -> tuple[torch.Tensor, float] | None:
    """An RMSNorm computed as ``weight * x / sqrt(mean(x^2) + eps)`` (Llama's, Qwen2's …)."""
    if not type(norm).__name__.endswith("RMSNorm") or type(norm).__name__.startswith("Gemma"):
        return None
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    return None if eps is None or weight is None else (weight, float(eps))


def pack_layers(layers, config, dtype: torch.dtype) -> list[PackedLayer] | None:
    """The layers packed, or None where one of them is not the plain Llama-style layer."""
    if dtype != torch.float32 or getattr(config, "hidden_act", "silu") != "silu":
        return None    # F.rms_norm keeps a half model's dtype; eager norms compute in float32
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if (getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0 or head_dim % 2:
        return None    # rotary over part of each head
    packed = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if getattr(attn, "q_norm", None) is not None or not hasattr(mlp, "gate_proj"):
            return None
        qkv = [plain_weight(getattr(attn, f"{p}_proj"), bias_ok=True) for p in "qkv"]
        rest = [plain_weight(m) for m in (attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        norms = [rms_weight(layer.input_layernorm), rms_weight(layer.post_attention_layernorm)]
        if None in qkv or None in rest or None in norms:
            return None
        biases = [b for _, b in qkv]
        if any(b is None for b in biases) and any(b is not None for b in biases):
            return None
        width = layer.self_attn.q_proj.in_features
        root = float(width) ** 0.5
        weight = norms[0][0]
        with torch.no_grad():
            packed.append(PackedLayer(
                in_out(torch.cat([w for w, _ in qkv]) * (norms[0][0] * root)),
                torch.cat(biases) if biases[0] is not None else None,
                in_out(rest[0][0]),
                in_out(torch.cat([rest[1][0], rest[2][0]]) * (norms[1][0] * root)),
                in_out(rest[3][0]),
                weight.new_tensor((width * norms[0][1]) ** 0.5),
                weight.new_tensor((width * norms[1][1]) ** 0.5)))
    return packed


class RotaryTable:
    """cos and sign-folded sin rows per position, filled from the model's rotary module."""

    def __init__(self, rotary) -> None:
        self.rotary = rotary
        self.cos = self.sin = None

    def rows(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin' for (B, n) positions, each (B, 1, n, head_dim): x·cos + roll(x)·sin'
        is the rotary embedding of x (sin' is -sin on the first half, as rotate-half has)."""
        top = int(positions.max()) + 1
        if self.cos is None or top > self.cos.shape[0]:
            size = max(top, 2 * (0 if self.cos is None else self.cos.shape[0]), 256)
            cos, sin = self.rotary(like, torch.arange(size, device=like.device)[None])
            half = sin.shape[-1] // 2
            self.cos = cos[0]
            self.sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)
        return self.cos[positions][:, None], self.sin[positions][:, None]

    def span(self, start: int, end: int, like: torch.Tensor):
        """``rows`` for positions [start, end) of every row, as views (no gather)."""
        if self.cos is None or end > self.cos.shape[0]:
            self.rows(torch.tensor([[end - 1]]), like)
        return self.cos[start:end], self.sin[start:end]


def packed_layer(p: PackedLayer, h: torch.Tensor, cache, i: int, start: int, mask, cos, sin,
                 heads: int, kv_heads: int, head_dim: int, scaling: float) -> torch.Tensor:
    """The decoder layer over h (B, n, H) with packed weights; keys/values into the cache's
    layer i at [start, start + n), attention over [0, start + n)."""
    batch, n, _ = h.shape
    end = start + n
    qkv = times(normed(h, p.eps_in), p.qkv, p.qkv_bias).view(batch, n, heads + 2 * kv_heads, head_dim)
    qkv = qkv.transpose(1, 2)                          # (B, heads + 2 kv, n, head_dim)
    qk = qkv[:, : heads + kv_heads]
    qk = qk * cos + qk.roll(head_dim // 2, -1) * sin   # rotary on q and k at once
    cache.keys[i, :, :, start:end] = qk[:, heads:]
    cache.values[i, :, :, start:end] = qkv[:, heads + kv_heads:]
    o = F.scaled_dot_product_attention(qk[:, :heads], cache.keys[i, :, :, :end],
                                       cache.values[i, :, :, :end], attn_mask=mask,
                                       scale=scaling, enable_gqa=kv_heads != heads)
    h = h + times(o.transpose(1, 2).reshape(batch, n, -1), p.o)
    gate, up = times(normed(h, p.eps_post), p.gate_up).chunk(2, -1)
    return h + times(F.silu(gate) * up, p.down)
