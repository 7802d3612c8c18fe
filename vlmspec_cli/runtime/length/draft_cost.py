"""A draft that cannot pay, known before either model runs (``drafting.length: auto``).

Eq. 1's speedup is at most (γ + 1) / (γ·c + 1) with every proposal kept, c = T_q / T_p the
cost of a draft step over a target step: a draft whose step costs as much as the target's
(c ≥ 1) never pays. On a CPU, a float draft with at least the target's layers and
multiply-adds per token (from the configs), in a dtype at least as wide, runs at least as
many kernels over at least as much data: c ≥ 1. (Layers too: on small models a step is
mostly per-operator cost, and a draft of one wide layer could be cheaper than a target of
many narrow ones with the same arithmetic.) The target itself drafted by itself is one
(a test's set-up, or a mistake). Auto would find it dear at its first request (its prefill
timed against the target's, draft_length.py), after paying that prefill and a round or
two; known here, drafting is off from the start (``AutoGamma.rule_out``).

Not ruled out: anything on a GPU; a quantized target; a quantized draft (bitsandbytes has a
fused 4-bit CPU kernel, and a 4-bit copy of a large target, whose steps are bound by
reading its weights, reads an eighth of the bytes: it may pay, and is measured instead —
tinyworld-selfquant's nf4 copy took about twice its target's time to prefill (by hand,
session 46), and is switched off after its first request); a float draft in a narrower
dtype.
"""

from __future__ import annotations

import torch


def multiply_adds(config) -> int | None:
    """Multiply-adds per token of a decoder's linear layers, from its config (the text
    config of a multimodal one): per layer q, k, v and o, and a gated MLP's three matrices;
    the output head. None when the config does not say (another architecture)."""
    text = _text(config)
    try:
        hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
        heads, inner = int(text.num_attention_heads), int(text.intermediate_size)
        vocab = int(text.vocab_size)
    except (AttributeError, TypeError, ValueError):
        return None
    if min(hidden, layers, heads, inner, vocab) <= 0:   # a broken config: say nothing
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
    if quantized(target.model) or quantized(draft.model):
        return None
    if _bits(draft.dtype) < _bits(target.dtype):
        return None
    ours, theirs = multiply_adds(draft.model.config), multiply_adds(target.model.config)
    if ours is None or theirs is None or ours < theirs:
        return None
    if _layers(draft.model.config) < _layers(target.model.config):
        return None
    return f"{ours / theirs:.2g}x the target's multiply-adds per token: cannot pay on a CPU"


def _text(config):
    """The decoder's config: a multimodal model's text config, else the config itself."""
    return getattr(config, "text_config", None) or config


def _layers(config) -> int:
    return int(_text(config).num_hidden_layers)


def _bits(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
