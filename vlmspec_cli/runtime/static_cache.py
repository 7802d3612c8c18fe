"""A preallocated KV cache for the fast path (fast_decoder.py).

Every layer's keys and values live in one tensor each, (L, B, kv_heads, capacity, head_dim),
sized once per request (prompt + max_new_tokens + the largest round). A finished request's
buffers go back to its decoder's ``BufferPool`` (``recycle``) and the next request takes
them: allocating fresh megabytes per request cost the 32-layer caption target about a
tenth of its prefill (the pages are faulted in and zeroed; by hand, not recorded).
Decoding writes new positions in place at ``length``; rolling back is setting ``length``
(nothing is freed, cat'ed or copied); keeping a tree round's accepted branch moves those
positions down in place. Positions past ``length`` hold stale values that no forward
reads: attention only ever spans ``[0, length + n)``.

It offers the parts of transformers' cache interface the engine uses (``get_seq_length``,
``crop``), so rollback code is shared with the eager path (adapters/base.py).
"""

from __future__ import annotations

import torch


class BufferPool:
    """The key/value buffers of finished requests, for the next request of the same model.

    It keeps at most one pair per layout (layers, batch, heads, head_dim, dtype, device):
    the largest given back. ``take`` hands it out (and forgets it) when it holds at least the
    positions asked for. A buffer is only ever in the pool or in one live cache, never
    both: ``StaticKVCache.recycle`` gives its buffers up as it hands them over."""

    def __init__(self) -> None:
        self._spare: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _layout(keys: torch.Tensor) -> tuple:
        return (*keys.shape[:3], keys.shape[4], keys.dtype, keys.device)

    def take(self, like: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A spare (keys, values) of ``like``'s layout with room for ``capacity`` positions."""
        spare = self._spare.get(self._layout(like))
        if spare is None or spare[0].shape[3] < capacity:
            return None
        del self._spare[self._layout(like)]
        return spare

    def give(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        held = self._spare.get(self._layout(keys))
        if held is None or held[0].shape[3] < keys.shape[3]:
            self._spare[self._layout(keys)] = (keys, values)


class StaticKVCache:
    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 device, dtype, headroom: int = 0, pool: BufferPool | None = None) -> None:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.grown = 0   # reallocations (0 when the request was sized right)
        # positions reserved past the prompt at ``load`` (max_new_tokens + a round)
        self.headroom = headroom
        self.pool = pool
        self.recycled = False
        # 3-D rope families (adapters/qwen2_vl.py): a later token at 1-D position p sits at
        # p + rope_delta, the offset the request's prefill gave (0 for every other family)
        self.rope_delta = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def batch(self) -> int:
        return self.keys.shape[1]

    def set_batch(self, batch: int) -> None:
        """An empty cache's rows (a prompt of several left-padded rows fills it)."""
        if batch != self.batch:
            if self.capacity:
                raise RuntimeError("only an empty cache changes its number of rows")
            shape = (self.keys.shape[0], batch, *self.keys.shape[2:])
            self.keys, self.values = self.keys.new_zeros(shape), self.values.new_zeros(shape)

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
        if self.recycled:
            raise RuntimeError("a finished request's cache was recycled; it holds no positions")
        # an empty cache filled by the fast path itself (a draft block with no prefill of
        # its own) is sized here for the first time: that is not growing
        self.grown += self.capacity > 0
        cap = max(need + (0 if self.capacity else self.headroom), 2 * self.capacity)
        if not self.capacity and self._take(cap):
            return
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
        if not self._take(shape[3], first.new_empty(shape[:3] + (0, shape[4]))):
            self.keys = first.new_zeros(shape)
            self.values = first.new_zeros(shape)
        for i, (k, v) in enumerate(tensors):
            self.keys[i, :, :, :n] = k
            self.values[i, :, :, :n] = v
        self.length = n

    def _take(self, capacity: int, like: torch.Tensor | None = None) -> bool:
        """Take a pooled pair of ``like``'s layout (default: this cache's) with room for
        ``capacity`` positions. Positions past ``length`` are never read, so what a
        recycled buffer still holds there needs no clearing."""
        spare = None if self.pool is None else self.pool.take(
            self.keys if like is None else like, capacity)
        if spare is None:
            return False
        self.keys, self.values = spare
        return True

    def recycle(self) -> None:
        """The request is over: hand the buffers to the pool for the next one. ``length``
        and ``grown`` stay for whoever reads the finished state; a later forward on it
        raises rather than read another request's positions."""
        if self.pool is None or not self.capacity:
            return
        self.recycled = True
        self.pool.give(self.keys, self.values)
        empty = self.keys.new_empty(*self.keys.shape[:3], 0, self.keys.shape[4])
        self.keys, self.values = empty, empty.clone()
