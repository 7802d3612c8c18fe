"""A preallocated KV cache for the fast path (fast_decoder.py).

Every layer's keys and values live in one tensor each, (L, B, kv_heads, capacity, head_dim),
allocated once per request from its size (prompt + max_new_tokens + the largest round).
Decoding writes new positions in place at ``length``; rolling back is setting ``length``
(nothing is freed, cat'ed or copied); keeping a tree round's accepted branch moves those
positions down in place. Positions past ``length`` hold stale values that no forward
reads: attention only ever spans ``[0, length + n)``.

It offers the parts of transformers' cache interface the engine uses (``get_seq_length``,
``crop``), so rollback code is shared with the eager path (adapters/base.py).
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 device, dtype, headroom: int = 0) -> None:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.grown = 0   # reallocations (0 when the request was sized right)
        # positions reserved past the prompt at ``load`` (max_new_tokens + a round)
        self.headroom = headroom

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def batch(self) -> int:
        return self.keys.shape[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """As ``DynamicCache.crop`` in transformers v5: a negative ``length`` drops that many
        positions from the end, a non-negative one keeps the first ``length``."""
        self.length = self.length + length if length < 0 else min(length, self.length)

    @torch.inference_mode()
    def reserve(self, n: int) -> None:
        """Room for ``n`` more positions. Only a request that outgrows the size it was
        given reallocates (doubling), so ``grown`` counts requests sized wrong."""
        need = self.length + n
        if need <= self.capacity:
            return
        # an empty cache filled by the fast path itself (a draft block with no prefill of
        # its own) is sized here for the first time: that is not growing
        self.grown += self.capacity > 0
        cap = max(need + (0 if self.capacity else self.headroom), 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:3], cap, old.shape[4])
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)

    @torch.inference_mode()
    def keep_positions(self, prefix: int, slots: list[int]) -> None:
        """Keep positions [0, prefix) where they are and move ``slots`` (ascending, past the
        prefix) down to follow them: a tree round's accepted branch."""
        moved = [i for i, s in enumerate(slots) if s != prefix + i]
        if moved:
            first = moved[0]
            src = torch.tensor(slots[first:], device=self.keys.device)
            dst = slice(prefix + first, prefix + len(slots))
            # index_select copies first, so overlapping source and target are safe
            self.keys[:, :, :, dst] = self.keys.index_select(3, src)
            self.values[:, :, :, dst] = self.values.index_select(3, src)
        self.length = prefix + len(slots)

    @torch.inference_mode()
    def load(self, cache) -> None:
        """Take over a transformers cache filled by an eager prefill (multimodal inputs are
        merged by the model's own forward, once per request): the buffers are allocated
        here, for its rows and its length plus ``headroom``."""
        self.load_tensors([(layer.keys, layer.values) for layer in cache.layers])

    @torch.inference_mode()
    def load_tensors(self, tensors) -> None:
        """The same from each layer's (keys, values), (B, kv_heads, n, head_dim)."""
        first = tensors[0][0]
        n = first.shape[2]
        shape = (self.keys.shape[0], first.shape[0], first.shape[1], n + self.headroom,
                 first.shape[3])
        self.keys = first.new_zeros(shape)
        self.values = first.new_zeros(shape)
        for i, (k, v) in enumerate(tensors):
            self.keys[i, :, :, :n] = k
            self.values[i, :, :, :n] = v
        self.length = n
