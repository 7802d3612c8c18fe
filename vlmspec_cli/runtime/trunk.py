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

On the fast path (``lm.fast``) the prompt is still prefilled this way, over a
``DynamicCache``; its layers are then moved into a ``SegmentedCache``: one
``StaticKVCache`` per run of layers that hold the same rows (the trunk, and the rest
split where pruning changes the rows), and every later forward runs a segment's layers
with ``FastDecoder.run_segment``, writing in place.
"""

from __future__ import annotations

import torch

from vlmspec_cli.runtime.adapters.base import TextStack
from vlmspec_cli.runtime.static_cache import StaticKVCache


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


class SegmentedCache:
    """The split target's cache on the fast path: layers [bounds[i], bounds[i+1]) share
    one ``StaticKVCache`` (same rows, same length). Offers what the twig and the engine
    use of a transformers cache: ``get_seq_length(layer)``, ``crop`` (every layer)."""

    def __init__(self, fast, bounds: list[int]) -> None:
        self.bounds = bounds
        self.segments = [fast.new_segment_cache(b - a) for a, b in zip(bounds, bounds[1:])]

    def segment_of(self, layer_idx: int) -> int:
        return max(i for i, a in enumerate(self.bounds[:-1]) if a <= layer_idx)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.segments[self.segment_of(layer_idx)].length

    def crop(self, length: int) -> None:
        """A negative ``length`` drops that many positions from every layer (all layers
        received the same tokens after the prompt)."""
        if length >= 0:
            raise ValueError("a split cache is cropped by a negative count")
        for seg in self.segments:
            seg.crop(length)

    @torch.inference_mode()
    def load(self, cache) -> None:
        """Take over the prefill's ``DynamicCache``, layer by layer."""
        for seg, a, b in zip(self.segments, self.bounds, self.bounds[1:]):
            seg.load_tensors([(cache.layers[i].keys, cache.layers[i].values) for i in range(a, b)])


def crop_layers(cache, layers, count: int) -> None:
    """Drop the last ``count`` positions of ``layers`` only (the trunk's rows of draft
    tokens the engine cut)."""
    if isinstance(cache, SegmentedCache):
        first = layers[0].self_attn.layer_idx
        seg = cache.segments[cache.segment_of(first)]
        seg.crop(-count)
        return
    for layer in layers:
        cache.layers[layer.self_attn.layer_idx].crop(-count)


class SplitTarget:
    """The target's text stack split after layer K: ``lower`` = layers[:K] (shared with the
    draft), ``upper`` = layers[K:] (the rest of the target)."""

    def __init__(self, lm, k: int) -> None:
        if not lm.adapter.splits_layers:
            raise ValueError(f"model '{lm.name}' places tokens by 3-D rope positions (Qwen2-VL "
                             "family); the twig does not run its layers in parts yet")
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

    def static_cache(self, cache, keep_from: dict[int, torch.Tensor] | None):
        """On the fast path: the prefill's ``cache`` moved into a ``SegmentedCache`` split
        at K and wherever pruning (``keep_from``) changes the rows; else ``cache``."""
        if self.lm.fast is None:
            return cache
        bounds = sorted({0, self.k, self.num_layers, *(keep_from or {})})
        seg = SegmentedCache(self.lm.fast, bounds)
        seg.load(cache)
        return seg

    def _segments(self, cache, first: int, last: int, hidden, positions):
        for seg, a, b in zip(cache.segments, cache.bounds, cache.bounds[1:]):
            if first <= a and b <= last:
                hidden = self.lm.fast.run_segment(hidden, seg, a, positions)
        return hidden

    @torch.inference_mode()
    def lower(self, hidden: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """X^(K): the shared first K layers (their KV goes into the target cache)."""
        if isinstance(cache, SegmentedCache):
            return self._segments(cache, 0, self.k, hidden, positions)
        return run_layers(self.lower_layers, self.stack.rotary, hidden, positions, cache)

    @torch.inference_mode()
    def upper(self, hidden_k: torch.Tensor, positions: torch.Tensor, cache,
              keep_from: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Target logits from X^(K): layers[K:], final norm, head. ``keep_from`` is keyed
        by absolute layer index (>= K); it only occurs at prefill (a DynamicCache)."""
        if isinstance(cache, SegmentedCache):
            hidden = self._segments(cache, self.k, self.num_layers, hidden_k, positions)
        else:
            local = {i - self.k: m for i, m in (keep_from or {}).items()}
            hidden = run_layers(self.upper_layers, self.stack.rotary, hidden_k, positions,
                                cache, local)
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
