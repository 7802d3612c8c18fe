"""A draft that cannot pay, known before either model runs (``drafting.length: auto``).

Eq. 1's speedup is at most (γ + 1) / (γ·c + 1) with every proposal kept, c = T_q / T_p the
cost of a draft step over a target step: a draft whose step costs as much as the target's
(c ≥ 1) never pays. On a CPU a decoding step's time follows its arithmetic, the
multiply-adds of its linear layers (the weights are read at the cores' speed there, not
the memory's), so a draft that does as many of them per token as the target, in the
target's dtype or through 4-/8-bit weights that a CPU dequantizes back to it, has c ≥ 1:
tinyworld-selfquant's nf4 copy of its target took 36 ms to prefill against the target's
16 ms, and its rounds only lost. Auto finds such a draft dear at its first request anyway
(draft_length.py: its prefill timed against the target's), but that request pays the
draft's prefill and a round or two: over six short requests timed cold, 0.90x of the
target alone. Known here, drafting is off from the start (``AutoGamma.rule_out``).

On a GPU nothing is ruled out: decoding there reads weights from memory, and a 4-bit copy
reads a quarter of the bytes, so it can pay. Neither is a quantized target (its own
kernels, not compared here), nor a float draft in a narrower dtype than the target's.
"""

from __future__ import annotations

import torch


def multiply_adds(config) -> int | None:
    """Multiply-adds per token of a decoder's linear layers, from its config (the text
    config of a multimodal one): per layer q, k, v and o, and a gated MLP's three matrices;
    the output head. None when the config does not say (another architecture)."""
    text = getattr(config, "text_config", None) or config
    try:
        hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
        heads, inner = int(text.num_attention_heads), int(text.intermediate_size)
        vocab = int(text.vocab_size)
    except (AttributeError, TypeError):
        return None
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)     # q, o and k, v
    return layers * (attention + 3 * hidden * inner) + hidden * vocab


def quantized(model) -> bool:
    """Loaded with 4- or 8-bit weights (bitsandbytes, through transformers)."""
    return (getattr(model, "hf_quantizer", None) is not None
            or getattr(model.config, "quantization_config", None) is not None)


def cannot_pay(target, draft) -> str | None:
    """Why ``draft`` (a LoadedModel) can never make ``target`` faster here, or None."""
    if draft is None or target.device.type != "cpu" or draft.device.type != "cpu":
        return None
    if quantized(target.model):
        return None
    if not quantized(draft.model) and _bits(draft.dtype) < _bits(target.dtype):
        return None
    ours, theirs = multiply_adds(draft.model.config), multiply_adds(target.model.config)
    if ours is None or theirs is None or ours < theirs:
        return None
    return (f"the draft does {ours / theirs:.2g}x the target's multiply-adds per token: "
            f"on a CPU it cannot pay")


def _bits(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
