"""The target's text decoder run in two parts for self-speculation (TwigVLM §3.2).

A twig draft shares the target's first K layers ("the trunk"): every token runs through
``layers[:K]`` exactly once, and the hidden state it leaves there, X^(K), serves both the
draft (twig layers + head on top) and, later, verification (``layers[K:]`` on top). The
shared layers write their keys/values straight into the target's KV cache, so the draft
and the target share those too.

Visual-token pruning (TTP, Eq. 5) and FinalWipe happen here as row selections between
layers: from layer ``P`` on only the kept rows go on (and only they enter those layers'
caches), from layer ``K_f`` on no visual rows at all. Layers therefore hold caches of
different lengths; every layer keeps the *true* positions of its rows for RoPE, and each
forward masks causally against that layer's own cache length. A DynamicCache crop with a
negative count removes that many entries from every layer, which stays right because
every layer receives the same new (text) tokens after the prompt.
"""

from __future__ import annotations

import torch

from vlmspec_cli.runtime.adapters.base import TextStack


def chunk_mask(q: int, past: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive mask (1, 1, q, past + q) for q new rows after ``past`` cached ones: row i
    (cache slot past + i) sees slots j <= past + i. None for one row (it sees everything)."""
    if q == 1:
        return None
    full = torch.full((q, past + q), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.triu(full, diagonal=past + 1)[None, None]


def layer_cache_length(cache, layer) -> int:
    return int(cache.get_seq_length(layer.self_attn.layer_idx))


def run_layers(layers, rotary, hidden: torch.Tensor, positions: torch.Tensor, cache,
               keep_from: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """Run decoder ``layers`` (a sequence; each writes to ``cache`` at its own layer_idx) on
    ``hidden`` (1, q, H) at true ``positions`` (1, q).

    ``keep_from``: {i: bool mask over the q input rows}: before the i-th of these layers,
    keep only the rows the mask marks (masks are nested: later ones keep fewer). Returns
    the hidden states of the rows that reach the end."""
    rows = torch.arange(hidden.shape[1], device=hidden.device)
    pe = None
    masks: dict[int, torch.Tensor | None] = {}
    for i, layer in enumerate(layers):
        if keep_from and i in keep_from:
            sel = keep_from[i].to(hidden.device)[rows]
            hidden, positions, rows, pe = hidden[:, sel], positions[:, sel], rows[sel], None
            masks = {}
        if pe is None:
            pe = rotary(hidden, positions)
        past = layer_cache_length(cache, layer)
        if past not in masks:
            masks[past] = chunk_mask(hidden.shape[1], past, hidden.dtype, hidden.device)
        hidden = layer(hidden, attention_mask=masks[past], position_ids=positions,
                       past_key_values=cache, use_cache=True, position_embeddings=pe)
    return hidden


class SplitTarget:
    """The target's text stack split after layer K: ``lower`` = layers[:K] (shared with the
    draft), ``upper`` = layers[K:] (the rest of the target)."""

    def __init__(self, lm, k: int) -> None:
        self.lm = lm
        self.stack: TextStack = lm.adapter.text_stack(lm)
        self.num_layers = len(self.stack.layers)
        if not 1 <= k < self.num_layers:
            raise ValueError(f"twig.layers (K) must be between 1 and {self.num_layers - 1} for "
                             f"'{lm.name}' ({self.num_layers} decoder layers), got {k}")
        self.k = k

    @property
    def lower_layers(self):
        return self.stack.layers[: self.k]

    @property
    def upper_layers(self):
        return self.stack.layers[self.k:]

    def embed_tokens(self, ids: list[int]) -> torch.Tensor:
        return self.stack.embed(torch.tensor([ids], device=self.lm.device))

    @staticmethod
    def next_positions(cache, n: int, device) -> torch.Tensor:
        """True positions of n new tokens: layer 0 is never pruned, so its cache length is
        the number of tokens before them."""
        start = int(cache.get_seq_length(0))
        return torch.arange(start, start + n, device=device)[None]

    @torch.inference_mode()
    def lower(self, hidden: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """X^(K): the shared first K layers (their KV goes into the target cache)."""
        return run_layers(self.lower_layers, self.stack.rotary, hidden, positions, cache)

    @torch.inference_mode()
    def upper(self, hidden_k: torch.Tensor, positions: torch.Tensor, cache,
              keep_from: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Target logits from X^(K): layers[K:], final norm, head. ``keep_from`` is keyed
        by absolute layer index (>= K)."""
        local = {i - self.k: m for i, m in (keep_from or {}).items()}
        hidden = run_layers(self.upper_layers, self.stack.rotary, hidden_k, positions, cache, local)
        return self.stack.head(self.stack.norm(hidden))

    @torch.inference_mode()
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Layer-skip drafting: the target's own norm + head on X^(K)."""
        return self.stack.head(self.stack.norm(hidden))


def mean_retained_tokens(visual: int, kept: int, prune_layer: int, final_wipe: int,
                         num_layers: int) -> float:
    """TwigVLM Eq. 6: R̄ = [M·K + R·(K_f − K)] / L, the visual tokens an average layer
    attends to (M visual tokens in layers before K, R up to K_f, none after)."""
    return (visual * prune_layer + kept * (final_wipe - prune_layer)) / num_layers
