"""A target's forwards of several new rows (verification) with its weights laid out (in, out).

On a CPU, ``nn.Linear`` computes x·Wᵀ against its weight W stored (out, in): MKL's kernel
for a transposed right operand. For the small matrices of a model whose step is operator
overhead (the tinyworld target: 128 → 128 and 128 → 384, 32 layers, 224 products a
forward) that kernel took about twice the time of the same product against Wᵀ stored
contiguously, for one row and for ten alike (by hand on the 2-core Xeon, not recorded;
the whole forwards: bench/runs/2026-11-28/wide-rows-s53.txt). A chain's verification is such a forward
of k + 1 rows every round; target-only decoding is one of a single row per token.

The products equal x·Wᵀ up to float rounding, not bit for bit. So only **forwards of
several new rows after the prompt** use these (a chain's or a tree's verification, a
self-speculative trunk's catch-up): their rows already differ from one-row steps at that
level (a ten-row product's rows are not the one-row product's, bit for bit), and each
verified position's distribution is the target's in exact arithmetic, so the output
stays the target's (rounding at most moves a near-tie, as any batched verification
can). A plain step (one new row) and the prompt's prefill keep the model's own modules
op for op, as fast_decoder.py says: target-only decoding stays transformers' computation.

It costs a second copy of the decoder's projection weights (and the output head's): built
only on a CPU, for floating ``nn.Linear`` layers, and only while the copy stays under
``MAX_BYTES``: a large model's second copy would cost gigabytes, and its step is less
per-operator cost than bytes read (where the kernels were not compared: not measured).
"""

from __future__ import annotations

from typing import Callable

import torch

# the most the (in, out) copies of one decoder's weights may take (the tinyworld target's
# take 27 MB)
MAX_BYTES = 256 * 2**20


def plain_weight(linear, bias_ok: bool = False) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A float nn.Linear's (weight, bias); None for anything else (4-bit, 8-bit layers)."""
    if type(linear) is not torch.nn.Linear or not linear.weight.dtype.is_floating_point:
        return None
    if linear.bias is not None and not bias_ok:
        return None
    return linear.weight, linear.bias


def _nbytes(weight: torch.Tensor) -> int:
    return weight.numel() * weight.element_size()


def in_out(weight: torch.Tensor) -> torch.Tensor:
    """An (out, in) weight laid out (in, out), contiguous."""
    return weight.detach().t().contiguous()


def times(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x·Wᵀ (+ b) from Wᵀ laid out (in, out): what F.linear computes from W (out, in)."""
    y = torch.matmul(x, weight_t)
    return y if bias is None else y + bias


class WideLinear:
    """x·Wᵀ + b computed as x·(Wᵀ stored contiguously) + b."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight_t = in_out(weight)
        self.bias = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return times(x, self.weight_t, self.bias)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weight_t)


class WideLayer:
    """One decoder layer's projections, named as the layer's own modules (``q_proj`` …
    ``o_proj``; fast_decoder.project_qkv reads them from either), and its MLP."""

    def __init__(self, linears: dict[str, WideLinear], act: Callable) -> None:
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            linears[p] for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.gate_proj, self.up_proj, self.down_proj = (
            linears[p] for p in ("gate_proj", "up_proj", "down_proj"))
        self.act = act

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The gated MLP as the model's (down(act(gate(x)) · up(x)))."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    @property
    def nbytes(self) -> int:
        return sum(lin.nbytes for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj,
                                          self.gate_proj, self.up_proj, self.down_proj))


PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
               ("mlp", ("gate_proj", "up_proj", "down_proj")))


def wide_layers(layers, head, device) -> tuple[list[WideLayer], WideLinear | None] | None:
    """The decoder layers' copies (and the head's, None where it is not a plain linear or
    would not fit), or None: not on a CPU, a layer that is not a gated-MLP layer of float
    linears, or copies over ``MAX_BYTES`` (sized before any is made)."""
    if torch.device(device).type != "cpu":
        return None
    found = []   # per layer: its plain linears by name, and its MLP's activation
    for layer in layers:
        act = getattr(layer.mlp, "act_fn", None)
        linears = {name: plain_weight(getattr(getattr(layer, owner), name, None), bias_ok=True)
                   for owner, names in PROJECTIONS for name in names}
        if act is None or None in linears.values():
            return None
        found.append((linears, act))
    total = sum(_nbytes(w) for linears, _ in found for w, _ in linears.values())
    if total > MAX_BYTES:
        return None
    wide = [WideLayer({name: WideLinear(*plain) for name, plain in linears.items()}, act)
            for linears, act in found]
    head_plain = plain_weight(head, bias_ok=True)
    out = (WideLinear(*head_plain) if head_plain is not None
           and total + _nbytes(head_plain[0]) <= MAX_BYTES else None)
    return wide, out
