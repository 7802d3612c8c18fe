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

Models with 3-D rotary positions (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) run the same
way at the positions their own forward uses: the prompt's come from the adapter's
``encode`` (``get_rope_index``), each later token sits at its 1-D position + the prompt's
rope delta, expanded to (3, 1, n); the model's rotary module turns either into cos/sin.
The prompt's embeddings are the ones the model's own forward hands its text decoder
(visual features in place), and Qwen3-VL's "deepstack" visual features are added to the
hidden states after the first layers at the visual rows, as its decoder does.

On the fast path (``lm.fast``) the prompt is still prefilled this way, over a
``DynamicCache``; its layers are then moved into a ``SegmentedCache``: one
``StaticKVCache`` per run of layers that hold the same rows (the trunk, and the rest
split where pruning changes the rows), and every later forward runs a segment's layers
with ``FastDecoder.run_segment``, writing in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlmspec_cli.runtime.adapters.base import TextStack, cache_arg


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
               keep_from: dict[int, torch.Tensor] | None = None,
               add_after: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """Run decoder ``layers`` (a sequence; each writes to ``cache`` at its own layer_idx) on
    ``hidden`` (1, q, H) at true ``positions``: (1, q), or (3, 1, q) for 3-D rope.

    ``keep_from``: {i: bool mask over the q input rows}: before the i-th of these layers,
    keep only the rows the mask marks (masks are nested: later ones keep fewer).
    ``add_after``: {i: (1, q, H)}: added to the hidden states of the rows still there after
    the i-th layer (Qwen3-VL's deepstack features, zero off the visual rows). Returns the
    hidden states of the rows that reach the end."""
    rows = torch.arange(hidden.shape[1], device=hidden.device)
    pe = None
    masks: dict[int, torch.Tensor | None] = {}
    for i, layer in enumerate(layers):
        if keep_from and i in keep_from:
            sel = keep_from[i].to(hidden.device)[rows]
            hidden, positions, rows, pe = hidden[:, sel], positions[..., sel], rows[sel], None
            masks = {}
        if pe is None:
            pe = rotary(hidden, positions)
        past = layer_cache_length(cache, layer)
        if past not in masks:
            masks[past] = chunk_mask(hidden.shape[1], past, hidden.dtype, hidden.device)
        # 3-D positions go in through cos/sin only (as the model's own decoder passes them)
        hidden = layer(hidden, attention_mask=masks[past],
                       position_ids=positions if positions.dim() == 2 else None,
                       **cache_arg(layer, cache), use_cache=True, position_embeddings=pe)
        if add_after and i in add_after:
            hidden = hidden + add_after[i].to(hidden.device, hidden.dtype)[:, rows]
    return hidden


@dataclass
class PromptRun:
    """The prompt as the split trunk runs it."""

    embeds: torch.Tensor                  # (1, L, H), visual features in place
    visual: torch.Tensor                  # bool (L,): rows that hold visual features
    positions: torch.Tensor               # (1, L), or (3, 1, L) for 3-D rope
    rope_delta: int | None = None         # 3-D rope: later token at 1-D position p sits at p + delta
    add_after: dict[int, torch.Tensor] = field(default_factory=dict)   # run_layers' add_after


class _DecoderInputs(Exception):
    """Stops a model's forward once its text decoder's inputs are known."""


def decoder_inputs(lm, inputs: dict) -> dict:
    """The keyword arguments the multimodal model's own forward hands its text decoder
    (``language_model``) for ``inputs``: embeddings with the visual features in place,
    positions, Qwen3-VL's deepstack features. The decoder layers do not run."""
    seen: dict = {}

    def grab(_module, _args, kwargs):
        seen.update(kwargs)
        raise _DecoderInputs

    hook = lm.model.model.language_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        lm.model.model(**inputs, use_cache=False)
    except _DecoderInputs:
        pass
    finally:
        hook.remove()
    return seen


def rope_3d(stack: TextStack) -> bool:
    """Whether the decoder places tokens by 3-D (time, height, width) rotary positions."""
    return hasattr(stack.rotary, "mrope_section")


class SegmentedCache:
    """The split target's cache on the fast path: layers [bounds[i], bounds[i+1]) share
    one ``StaticKVCache`` (same rows, same length). Offers what the twig and the engine
    use of a transformers cache: ``get_seq_length(layer)``, ``crop`` (every layer)."""

    # 3-D rope families: a later token at 1-D position p sits at p + rope_delta (the
    # prompt's offset, as on vlmspec's other caches: a batch's row keeps it, ragged.py)
    rope_delta = 0

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

    def recycle(self) -> None:
        """The request is over: every segment's buffers back to the pool."""
        for seg in self.segments:
            seg.recycle()

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (keys, values), (rows, kv_heads, n, head_dim), its positions only
        (a batch's row joining the ragged cache: every segment holds the same rows)."""
        return [(seg.keys[j, :, :, : seg.length], seg.values[j, :, :, : seg.length])
                for seg in self.segments for j in range(seg.keys.shape[0])]

    def keep_below(self, layer: int) -> None:
        """Keep the segments of layers [0, ``layer``) only; the others' buffers go back to
        the pool (a batch's row: the rest of the target lives in the batch's cache)."""
        n = self.bounds.index(layer)
        for seg in self.segments[n:]:
            seg.recycle()
        self.segments, self.bounds = self.segments[:n], self.bounds[: n + 1]

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
            raise ValueError(f"model '{lm.name}' ({type(lm.adapter).__name__}) does not run its "
                             "decoder layers in parts: the twig's split trunk cannot serve it")
        self.lm = lm
        self.stack: TextStack = lm.adapter.text_stack(lm)
        self.num_layers = len(self.stack.layers)
        if not 1 <= k < self.num_layers:
            raise ValueError(f"twig.layers (K) must be between 1 and {self.num_layers - 1} for "
                             f"'{lm.name}' ({self.num_layers} decoder layers), got {k}")
        self.k = k
        self.rope_3d = rope_3d(self.stack)

    @property
    def lower_layers(self):
        return self.stack.layers[: self.k]

    @property
    def upper_layers(self):
        return self.stack.layers[self.k:]

    def embed_tokens(self, ids: list[int]) -> torch.Tensor:
        return self.stack.embed(torch.tensor([ids], device=self.lm.device))

    @torch.inference_mode()
    def prompt(self, prompt: str, images: list | None, videos: list | None = None) -> PromptRun:
        """The prompt's embeddings, visual rows and positions (and, for 3-D rope, its rope
        delta and Qwen3-VL's deepstack features), as the model's own prefill has them."""
        lm = self.lm
        if videos and not self.rope_3d:
            # the prompt's embeddings come from the adapter's images-only path here: a video
            # would be dropped and the twig's output would not be the target's (LLaVA-OneVision)
            raise ValueError(f"twig: the split trunk of '{lm.name}' builds prompts from images "
                             "only and cannot read this request's video; decode it with "
                             "another method (-m chain) or a Qwen-VL-family target")
        if not self.rope_3d:
            embeds, visual = lm.adapter.prompt_embeds(lm, prompt, images or None)
            positions = torch.arange(embeds.shape[1], device=embeds.device)[None]
            return PromptRun(embeds, visual, positions)
        inputs = dict(lm.adapter.encode(lm, prompt, images or None,
                                        **({"videos": videos} if videos else {})))
        delta = inputs.pop("rope_deltas", None)
        if delta is None or inputs.get("position_ids") is None:
            raise ValueError(f"model '{lm.name}' places tokens by 3-D rope positions, but its "
                             "adapter gives no prompt positions (position_ids, rope_deltas) for "
                             "the twig's split trunk")
        seen = decoder_inputs(lm, inputs)
        embeds = seen["inputs_embeds"]
        add_after: dict[int, torch.Tensor] = {}
        for i, feature in enumerate(seen.get("deepstack_visual_embeds") or []):
            dense = torch.zeros_like(embeds)
            dense[seen["visual_pos_masks"].to(embeds.device)] = feature.to(embeds.device, embeds.dtype)
            add_after[i] = dense
        ids = inputs["input_ids"][0]
        return PromptRun(embeds, lm.adapter.visual_mask(lm, ids), seen["position_ids"],
                         int(delta.flatten()[0]), add_after)

    def positions(self, start: int, n: int, rope_delta: int | None = None) -> torch.Tensor:
        """True positions of n new tokens from 1-D position ``start``: (1, n); for 3-D rope
        (``rope_delta`` of the request's prompt) start + delta, … expanded to (3, 1, n)."""
        pos = torch.arange(start, start + n, device=self.lm.device)[None]
        if rope_delta is None:
            return pos
        return (pos + rope_delta)[None].expand(3, 1, n)

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
    def lower(self, hidden: torch.Tensor, positions: torch.Tensor, cache,
              add_after: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """X^(K): the shared first K layers (their KV goes into the target cache).
        ``add_after``: the prompt's deepstack features, keyed by absolute layer index."""
        if isinstance(cache, SegmentedCache):
            return self._segments(cache, 0, self.k, hidden, positions)
        local = {i: a for i, a in (add_after or {}).items() if i < self.k}
        return run_layers(self.lower_layers, self.stack.rotary, hidden, positions, cache,
                          add_after=local)

    @torch.inference_mode()
    def upper(self, hidden_k: torch.Tensor, positions: torch.Tensor, cache,
              keep_from: dict[int, torch.Tensor] | None = None,
              add_after: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Target logits from X^(K): layers[K:], final norm, head. ``keep_from`` and
        ``add_after`` are keyed by absolute layer index; they only occur at prefill (a
        DynamicCache)."""
        if isinstance(cache, SegmentedCache):
            hidden = self._segments(cache, self.k, self.num_layers, hidden_k, positions)
        else:
            local = {i - self.k: m for i, m in (keep_from or {}).items()}
            added = {i - self.k: a for i, a in (add_after or {}).items() if i >= self.k}
            hidden = run_layers(self.upper_layers, self.stack.rotary, hidden_k, positions,
                                cache, local, added)
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
