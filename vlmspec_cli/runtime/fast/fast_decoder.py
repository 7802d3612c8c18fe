"""The fast path: decoding steps run by vlmspec itself over a preallocated KV cache.

A decoding step of a small model through transformers' generic forward is mostly fixed
per-call cost: output dataclasses, mask construction, cache bookkeeping, kwargs plumbing
in every layer. Speculative decoding makes γ + 1 such calls a round, so that cost, not the
arithmetic, decides whether speculation pays. ``FastDecoder`` runs the same decoder layers
(the model's own modules and weights: projections, norms, rotary embedding, MLP) with only
the operations the maths needs, writing keys and values into a ``StaticKVCache`` in place.

* The prompt (and its images/video) is still prefilled by the model's own forward, once per
  request; its cache is then copied into the static cache (``StaticKVCache.load``).
* Every later forward — a draft step, a chain's verification, a tree's verification with
  its 4-D mask, a padded ensemble's rows — runs here.
* The computation is the eager one, op for op (RMSNorm in float32, rotary from the model's
  own module, scaled-dot-product attention over positions [0, length + n)); the tests
  check token equality with transformers' ``generate`` with the fast path on and off.
  Two exceptions, neither in a step that decides a token alone: a draft's layers run
  packed (runtime/fast/packed_layers.py), and a CPU target's forwards of several new rows
  after the prompt (its verifications) take copies of its weights laid out (in, out)
  (runtime/fast/wide_rows.py), equal to the modules' products up to float rounding.

Supported: Llama-style decoders (Llama, Mistral without sliding window, Qwen2, and the text
decoders of Qwen2-VL / Qwen2.5-VL, whose 3-D positions arrive as (3, B, n) position ids and
go through the model's own rotary module) — every tinyworld target and draft. Others
decode through transformers (``reason_unsupported`` says why). The twig's split trunk
(runtime/fast/trunk.py) runs its layer ranges here with ``run_segment``. Batches of several requests (runtime/fast/ragged.py) decode
here too, as rows with a 0/1 mask and per-row positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vlmspec_cli.runtime.adapters.base import TextStack, pick_layers
from vlmspec_cli.runtime.fast.packed_layers import RotaryTable, pack_layers, packed_layer, rms_weight
from vlmspec_cli.runtime.static_cache import BufferPool, StaticKVCache
from vlmspec_cli.runtime.fast.wide_rows import wide_layers

# the text decoders it runs; Qwen2-VL / Qwen2.5-VL's rotary module folds their 3-D
# (time, height, width) positions into ordinary cos/sin, so their decoders qualify too
FAST_FAMILIES = ("llama", "mistral", "qwen2", "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text")


def reason_unsupported(lm) -> str | None:
    """Why ``lm`` cannot decode on the fast path (None when it can)."""
    try:
        stack = lm.adapter.text_stack(lm)
    except (ValueError, AttributeError) as exc:
        return str(exc)
    return stack_problem(stack.config)


def stack_problem(config) -> str | None:
    """Why a decoder with this (text) config cannot run here (None when it can)."""
    kind = getattr(config, "model_type", None)
    if kind not in FAST_FAMILIES:
        return f"its text decoder ('{kind}') is not one of {', '.join(FAST_FAMILIES)}"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        return f"rotary type '{rope}' is not supported on the fast path"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention is not supported on the fast path"
    return None


def additive(allowed: torch.Tensor, dtype: torch.dtype, hidden: float | None = None) -> torch.Tensor:
    """A bool visibility mask (True = visible) as an additive one: 0 where visible,
    ``hidden`` elsewhere (what attention adds to its scores; default the dtype's most
    negative value)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min if hidden is None else hidden)


def layer_indices(hidden_layer, layers: int) -> tuple[int, ...] | None:
    """``hidden_layer`` as indices of transformers' ``hidden_states`` in [0, layers]: one
    index, or a tuple of them (EAGLE-3 reads three layers, concatenated); None: none."""
    if hidden_layer is None:
        return None
    wanted = (hidden_layer,) if isinstance(hidden_layer, int) else tuple(hidden_layer)
    return tuple(int(i) % (layers + 1) for i in wanted)


def follow_target(target, decoder: "FastDecoder | None", make_stack, config,
                  dtype) -> "FastDecoder | None":
    """The fast path of a draft block that is not a model of its own (the hidden head, the
    twig): None unless ``target`` decodes on the fast path and the block's layers
    (``config``) can; ``decoder`` (the one made for an earlier request) or a new one over
    ``make_stack()``, given the target's headroom."""
    if target.fast is None or stack_problem(config):
        return None
    if decoder is None:
        decoder = FastDecoder(make_stack(), target.device, dtype)
        decoder.pack()   # a draft's own layers (runtime/fast/packed_layers.py)
    decoder.headroom = target.fast.headroom
    return decoder


class FastDecoder:
    """Decoding steps for one decoder stack over ``StaticKVCache``s: a model's text decoder
    (``for_model``), or the layers of a draft block that has no model of its own (the
    hidden-state head, the twig: drafters/hidden.py, drafters/twig.py)."""

    def __init__(self, stack: TextStack, device, dtype, headroom: int = 256) -> None:
        self.stack = stack
        config = stack.config
        self.layers = list(stack.layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.scaling = float(attn.scaling)
        self.device = torch.device(device)
        self.dtype = dtype
        # positions a request may add after its prompt (max_new_tokens + the largest
        # round); the session sets it from the profile so caches are allocated once
        self.headroom = headroom
        # finished requests' cache buffers, taken by the next request (static_cache.py)
        self.pool = BufferPool()
        # runtime.compile: the compiled step (runtime/fast/compiled_step.py ``set_compiled``),
        # None = eager
        self.compiled = None
        # a draft's layers packed into fewer operators (runtime/fast/packed_layers.py, ``pack``)
        self.packed = None
        # a target's weights laid out (in, out) for its forwards of several new rows after
        # the prompt, on a CPU (runtime/fast/wide_rows.py, ``widen``): (layers, head or None)
        self.wide = None

    @classmethod
    def for_model(cls, lm, headroom: int = 256, packed: bool = False,
                  wide: bool = False) -> "FastDecoder":
        dtype = next(lm.model.parameters()).dtype if lm.dtype is None else lm.dtype
        decoder = cls(lm.adapter.text_stack(lm), lm.device, dtype, headroom)
        if packed:
            decoder.pack()
        if wide:
            decoder.widen()
        return decoder

    def widen(self) -> bool:
        """Run this decoder's forwards of several new rows after the prompt on its weights
        laid out (in, out) (a target's verifications, on a CPU: runtime/fast/wide_rows.py says
        why only those). False where it does not apply (not a CPU, other layers, too big)."""
        self.wide = wide_layers(self.layers, self.stack.head, self.device)
        return self.wide is not None

    def pack(self) -> bool:
        """Run this decoder's steps with packed layers (drafts only: runtime/fast/packed_layers.py
        says why never a target). False where a layer is not one it packs exactly."""
        layers = pack_layers(self.layers, self.stack.config, self.dtype)
        # the final norm (none in a block whose caller applies it: the hidden head)
        final = () if isinstance(self.stack.norm, torch.nn.Identity) else rms_weight(self.stack.norm)
        if layers is None or final is None:
            return False
        self.packed = (layers, final, RotaryTable(self.stack.rotary))
        return True

    def new_cache(self, batch: int = 1) -> StaticKVCache:
        return StaticKVCache(len(self.layers), batch, self.kv_heads, self.head_dim, 0,
                             self.device, self.dtype, headroom=self.headroom, pool=self.pool)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.stack.embed(input_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head over hidden (B, n, H): several rows (a verification) on the head's
        (in, out) copy where the decoder has one."""
        if self.wide is not None and self.wide[1] is not None and hidden.shape[1] > 1:
            return self.wide[1](hidden)
        return self.stack.head(hidden)

    @torch.inference_mode()
    def run(self, embeds: torch.Tensor, cache: StaticKVCache, attention_mask=None,
            position_ids=None, hidden_layer: int | None = None):
        """The decoder over ``embeds`` (B, n, H) after the cache's ``length`` positions.

        ``attention_mask``: None (causal), a (B, length + n) 0/1 padding mask combined with
        causality (left-padded ensemble rows), or a 4-D mask (B|1, 1, n,
        length + n), bool (True = visible) or additive float, used as is (trees). ``position_ids`` (B, n), or (3, B, n) for
        Qwen2-VL's 3-D positions: default length, length + 1, … Returns the final-normed hidden states (B, n, H) and, with
        ``hidden_layer``, that entry of transformers' ``hidden_states`` (0 = embeddings,
        i = after layer i; the last entry, -1, is after the final norm, as in transformers),
        or a tuple of entries concatenated (``adapters.base.pick_layers``)."""
        batch, n, _ = embeds.shape
        want = layer_indices(hidden_layer, len(self.layers))
        if self.compiled is not None and n <= self.compiled.max_rows:
            return self.compiled.run(embeds, cache, attention_mask, position_ids, want)
        start = cache.length
        end = start + n
        cache.reserve(n)
        want = want or ()
        mask = self._mask(attention_mask, batch, n, start, embeds)
        if self.packed is not None and (position_ids is None or position_ids.dim() == 2):
            # a draft's packed layers (runtime/fast/packed_layers.py): cos/sin from its table
            layers, final, table = self.packed
            cos, sin = (table.span(start, end, embeds) if position_ids is None
                        else table.rows(position_ids, embeds))
            def step(i, h):
                return packed_layer(layers[i], h, cache, i, start, mask, cos, sin, self.heads,
                                    self.kv_heads, self.head_dim, self.scaling)
            def norm(h):
                return F.rms_norm(h, (h.shape[-1],), *final) if final else h
        else:
            if position_ids is None:
                position_ids = torch.arange(start, end, device=embeds.device)[None].expand(batch, n)
            # cos/sin from the model's own rotary module: (B, n, head_dim), in the model dtype
            cos, sin = self.stack.rotary(embeds, position_ids)
            cos, sin = cos[:, None], sin[:, None]
            wide = self._wide_rows(n, start)
            def step(i, h):
                return self._layer(self.layers[i], h, cache, i, start, mask, cos, sin,
                                   wide and wide[i])
            norm = self.stack.norm
        picked = {0: embeds}
        h = embeds
        for i in range(len(self.layers)):
            h = step(i, h)
            if i + 1 in want:
                picked[i + 1] = h
        cache.length = end
        out = norm(h)
        # transformers (v5) puts the final-normed states in the last hidden_states entry
        picked[len(self.layers)] = out
        return out, (pick_layers(picked, want if len(want) > 1 else want[0]) if want else None)

    def _wide_rows(self, n: int, start: int):
        """The (in, out) layers for a forward of n new rows at ``start``: several rows after
        the prompt only (a plain step and the prefill stay the model's modules op for op)."""
        return self.wide[0] if self.wide is not None and n > 1 and start > 0 else None

    def _layer(self, layer, h, cache: StaticKVCache, i: int, start: int, mask, cos, sin,
               wide=None):
        """One decoder layer over h (B, n, H); its keys/values go to the cache's layer i at
        [start, start + n), and it attends over [0, start + n). ``wide``: the layer's
        projections laid out (in, out) (runtime/fast/wide_rows.py), used in place of its own."""
        batch, n, _ = h.shape
        end = start + n
        attn = layer.self_attn
        q, k, v = project_qkv(layer, h, self.head_dim, cos, sin, wide)
        cache.keys[i, :, :, start:end] = k
        cache.values[i, :, :, start:end] = v
        o = F.scaled_dot_product_attention(q, cache.keys[i, :, :, :end],
                                           cache.values[i, :, :, :end], attn_mask=mask,
                                           scale=self.scaling,
                                           enable_gqa=self.kv_heads != self.heads)
        o = o.transpose(1, 2).reshape(batch, n, -1)
        if wide is None:
            h = h + attn.o_proj(o)
            return h + layer.mlp(layer.post_attention_layernorm(h))
        h = h + wide.o_proj(o)
        return h + wide.mlp(layer.post_attention_layernorm(h))

    def new_segment_cache(self, layers: int) -> StaticKVCache:
        """A cache for ``layers`` consecutive layers (a split trunk's part, runtime/fast/trunk.py)."""
        return StaticKVCache(layers, 1, self.kv_heads, self.head_dim, 0, self.device,
                             self.dtype, headroom=self.headroom, pool=self.pool)

    @torch.inference_mode()
    def run_segment(self, hidden: torch.Tensor, cache: StaticKVCache, first: int,
                    positions: torch.Tensor) -> torch.Tensor:
        """Layers [first, first + the cache's layers) over ``hidden`` (B, n, H) at true
        ``positions`` (B, n), causal over that cache; no final norm (a split trunk: the
        layers shared with a twig, or the rest of the target)."""
        n = hidden.shape[1]
        start = cache.length
        cache.reserve(n)
        mask = self._mask(None, hidden.shape[0], n, start, hidden)
        cos, sin = self.stack.rotary(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]
        h = hidden
        wide = self._wide_rows(n, start)
        for j in range(cache.keys.shape[0]):
            h = self._layer(self.layers[first + j], h, cache, j, start, mask, cos, sin,
                            wide and wide[first + j])
        cache.length = start + n
        return h

    @staticmethod
    def _mask(attention_mask, batch: int, n: int, start: int, like: torch.Tensor):
        """The attention mask over positions [0, start + n) for the new rows: None (one row
        sees every position), else additive in ``like``'s dtype."""
        if attention_mask is not None and attention_mask.dim() == 4:
            # bool (True = visible; trees' masks on this path) or additive float; made
            # additive here, once, rather than by attention in every layer
            mask = attention_mask[..., : start + n]
            return additive(mask, like.dtype) if mask.dtype == torch.bool else mask.to(like.dtype)
        visible = FastDecoder._visible(attention_mask, n, start, like.device)
        # what scaled_dot_product_attention does with a bool mask (0 where visible, -inf
        # elsewhere), done once here rather than in each of the layers: the same values,
        # so the same outputs bit for bit; it saved under 1% of a 32-layer target's
        # verification on the 2-core CPU (by hand, not recorded)
        return None if visible is None else additive(visible, like.dtype, -math.inf)

    @staticmethod
    def _visible(attention_mask, n: int, start: int, device) -> torch.Tensor | None:
        """Which of positions [0, start + n) each new row sees (True: visible), causal and
        with a (B, length) 0/1 padding mask's zeros hidden; None: every position (one row,
        no padding)."""
        causal = None
        if n > 1:
            causal = torch.ones(n, start + n, dtype=torch.bool, device=device).tril(start)
        if attention_mask is None:
            return causal
        pad = attention_mask[:, None, None, : start + n].bool()   # (B, 1, 1, start + n)
        if causal is None:
            return pad
        if start:   # steps after the prompt: every new row is a real token
            return pad & causal
        # a left-padded prompt's padding rows would see no position at all: a softmax over
        # nothing, which torch 2.13's CPU kernel returns as zeros but a kernel may return as
        # NaN, carried by their keys/values into later layers (0 x NaN is NaN even where
        # masked). So they see themselves; rows of real tokens see their own position anyway.
        return (pad & causal) | torch.eye(n, dtype=torch.bool, device=device)


def project_qkv(layer, h: torch.Tensor, head_dim: int, cos, sin, wide=None):
    """A layer's input norm and q/k/v projections of h (B, n, H), as (B, heads, n, head_dim),
    rotary applied to q and k (cos/sin broadcast over heads). Qwen3-family attention
    normalises each head's queries and keys (``q_norm``, ``k_norm``) before the rotary.
    ``wide``: the projections laid out (in, out) (runtime/fast/wide_rows.py) in place of the
    layer's own."""
    batch, n, _ = h.shape
    attn = layer.self_attn
    proj = attn if wide is None else wide
    x = layer.input_layernorm(h)
    q = proj.q_proj(x).view(batch, n, -1, head_dim)
    k = proj.k_proj(x).view(batch, n, -1, head_dim)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = proj.v_proj(x).view(batch, n, -1, head_dim).transpose(1, 2)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
