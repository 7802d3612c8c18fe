"""A KV cache shared by B requests that each keep their own length (batched decoding).

Rows of one ``DynamicCache`` must have the same physical width W, but speculative decoding
gives every row its own accepted length each round. So the cache is *ragged*: next to the
keys and values it keeps

* ``valid`` (B, W) bool — which slots hold a token of that row (prompt, committed tokens);
  left padding, feed padding and rejected proposals are invalid slots;
* ``next_pos`` (B,)   — each row's next position id (its number of valid slots);
* ``deltas`` (B,)     — each row's rope offset (a family with 3-D positions, Qwen-VL's
  M-RoPE: a token after the prompt at 1-D position p sits at p + the offset its prompt's
  prefill gave, on all three axes; 0 for every other family). The family turns the rows'
  positions and offsets into the position ids its forward takes (``row_positions``:
  (3, B, t) for M-RoPE), so rows of different prompts keep their own offsets.

Invalid slots are masked out of attention by the 2-D attention mask, and every fed token
gets its row's own position id, so a row attends to exactly the keys, at exactly the
positions, it would see decoded alone. Rolling back a row only marks slots invalid;
``trim`` drops columns that are invalid for every row and ``compact`` (a gather, run when
enough space is wasted) packs each row's valid slots to the right.

A request may bring several rows (``add_rows``: an ensemble's drafting inputs, prefilled
as left-padded rows; their padding becomes invalid slots).

A row may feed a draft *tree* (``feed_hidden``'s ``trees``): its nodes flattened after
the row's own prefix, node i at the row's next position + its offset (the pending token
0, a node 1 + its depth), seeing the row's valid slots and the fed tokens its visibility
marks (its ancestors and itself); the forward then takes a 4-D mask, each row's own. The
rollback keeps the accepted path's slots where they are (``rollback`` with a keep mask):
their keys were computed at the positions the path has, over exactly the path's
ancestors, so no key moves; the other nodes' slots become invalid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vlmspec_cli.runtime.fast.fast_decoder import additive
from vlmspec_cli.runtime.fast.trunk import SegmentedCache
from vlmspec_cli.runtime.static_cache import StaticKVCache

if TYPE_CHECKING:
    from transformers import DynamicCache


class RaggedCache:
    def __init__(self, lm) -> None:
        self.lm = lm
        self.static = lm.fast is not None
        self.cache = self._new_cache()
        self.valid = torch.zeros((0, 0), dtype=torch.bool, device=lm.device)
        self.next_pos = torch.zeros(0, dtype=torch.long, device=lm.device)
        self.deltas = torch.zeros(0, dtype=torch.long, device=lm.device)

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def _new_cache(self, rows: int = 1):
        return self.lm.fast.new_cache(rows) if self.static else self.lm.adapter.new_cache(
            self.lm, static=False)

    def _tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values), (B, kv_heads, width, head_dim)."""
        if isinstance(self.cache, StaticKVCache):
            n = self.cache.length
            if not n:
                return []
            return [(self.cache.keys[i, :, :, :n], self.cache.values[i, :, :, :n])
                    for i in range(self.cache.keys.shape[0])]
        return [(layer.keys, layer.values) for layer in self.cache.layers
                if layer.is_initialized and layer.keys.numel()]

    # -- rows joining and leaving ----------------------------------------------------
    def add_row(self, single: DynamicCache | StaticKVCache | SegmentedCache, length: int) -> int:
        """Append a request prefilled alone (a batch-1 cache of ``length`` positions, a
        transformers cache, a static one or the twig's split one, whose buffers the caller
        may recycle after: its positions are copied; its rope offset, ``rope_delta`` of
        vlmspec's caches, is kept as the row's); returns its row index. Whichever side is
        shorter is left-padded."""
        return self.add_rows(single, torch.ones((1, length), dtype=torch.bool,
                                                device=self.valid.device))

    def add_rows(self, prefilled: DynamicCache | StaticKVCache | SegmentedCache,
                 valid: torch.Tensor) -> int:
        """``add_row`` for a cache prefilled with r left-padded rows (an ensemble's drafting
        inputs, drafters/ensemble.py): ``valid`` (r, length) marks each row's slots that
        hold a token (its left padding stays invalid, so a row attends to, and is
        positioned after, its own tokens only). Every row keeps the cache's rope offset.
        Returns the index of its first row."""
        r, length = valid.shape
        width = max(self.width, length) if self.rows else length
        if isinstance(prefilled, StaticKVCache):
            layers = [(prefilled.keys[i, :, :, :length], prefilled.values[i, :, :, :length])
                      for i in range(prefilled.keys.shape[0])]
        elif isinstance(prefilled, SegmentedCache):   # the twig's split trunk (trunk.py)
            layers = prefilled.layer_tensors()
        else:
            layers = [(layer.keys, layer.values) for layer in prefilled.layers
                      if layer.is_initialized]
        if self.rows == 0:
            merged = layers
        else:
            mine = self._tensors()
            if len(mine) != len(layers):
                raise ValueError("caches of different depth cannot share a batch")
            merged = [(_stack_rows(ak, bk, width), _stack_rows(av, bv, width))
                      for (ak, av), (bk, bv) in zip(mine, layers)]
        self._set(merged)
        rows_valid = torch.zeros((r, width), dtype=torch.bool, device=self.valid.device)
        rows_valid[:, width - length:] = valid.to(self.valid.device).bool()
        old = torch.zeros((self.rows, width), dtype=torch.bool, device=self.valid.device)
        old[:, width - self.width:] = self.valid
        self.valid = torch.cat([old, rows_valid])
        self.next_pos = torch.cat([self.next_pos, rows_valid.sum(-1).to(self.next_pos.dtype)])
        delta = int(getattr(prefilled, "rope_delta", 0) or 0)
        self.deltas = torch.cat([self.deltas, self.deltas.new_full((r,), delta)])
        return self.rows - r

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (finished requests leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        valid = self.valid.index_select(0, index)
        used = valid.any(0).nonzero().flatten()
        first, last = (int(used[0]), int(used[-1]) + 1) if len(used) else (0, 0)
        # the kept rows' columns that one of them uses, gathered in one copy
        self._set([(k[:, :, first:last].index_select(0, index),
                    v[:, :, first:last].index_select(0, index))
                   for k, v in self._tensors()] if rows else [])
        self.valid = valid[:, first:last]
        self.next_pos = self.next_pos.index_select(0, index)
        self.deltas = self.deltas.index_select(0, index)

    # -- forwards --------------------------------------------------------------------
    def feed(self, feeds: list[list[int]]) -> list[torch.Tensor]:
        """Run each row's new tokens (rows may feed different numbers, or none) through the
        model in one forward; returns per row the logits (len(feed), V) of its tokens.
        Shorter feeds are left-padded with invalid slots."""
        return [logits for logits, _ in self.feed_hidden(feeds, None)]

    def feed_hidden(self, feeds: list[list[int]], layer, trees: list | None = None
                    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """``feed``, and per row the hidden states (len(feed), H) of its tokens at
        ``layer`` (transformers' ``hidden_states`` index, or a tuple of them concatenated:
        a hidden-state drafter's; None: not asked for, None returned). ``trees``: per row
        None (its tokens at its next positions, causal) or (offsets (n,), allowed (n, n)
        bool): a tree's feed, token i at the row's next position + offsets[i], seeing the
        row's cache and the fed tokens ``allowed[i]`` marks."""
        lm = self.lm
        t = max(len(f) for f in feeds)
        if t == 0:
            return [(torch.empty(0), None) for _ in feeds]
        ids = torch.zeros((self.rows, t), dtype=torch.long, device=lm.device)
        new_valid = torch.zeros((self.rows, t), dtype=torch.bool, device=lm.device)
        for b, f in enumerate(feeds):
            if f:
                ids[b, t - len(f):] = torch.tensor(f, device=lm.device)
                new_valid[b, t - len(f):] = True
        shape = None
        if trees is not None and any(tr is not None for tr in trees):
            shape = _tree_shape(feeds, trees, t, lm.device)
        logits, hidden = self._forward(ids, new_valid, layer, shape)
        return [(logits[b, t - len(f):], None if hidden is None else hidden[b, t - len(f):])
                for b, f in enumerate(feeds)]

    def feed_tensor(self, ids: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        """``feed`` for tokens already on the device: ids (B, t), and new_valid (B, t) says
        which of them a row feeds (the others are padding, invalid slots). Returns the
        logits (B, t, V); nothing is read back to the host."""
        return self._forward(ids, new_valid, None)[0]

    def _forward(self, ids: torch.Tensor, new_valid: torch.Tensor, layer, shape=None):
        """(logits (B, t, V), the chosen layer's states (B, t, H) or None). ``shape``:
        (offsets (B, t), visible (B, t, t)) where a row feeds a tree (``_tree_shape``)."""
        lm = self.lm
        if shape is None:
            # each fed token at its row's next position; padding slots get a harmless one
            positions = self.next_pos[:, None] + new_valid.long().cumsum(-1) - 1
            positions = positions.clamp_min(0)
            mask = torch.cat([self.valid, new_valid], dim=1).long()
        else:
            offsets, visible = shape
            positions = self.next_pos[:, None] + offsets
            t = ids.shape[1]
            # (B, 1, t, width + t): each row's valid slots, then its own fed tokens' visibility
            mask = torch.cat([self.valid[:, None, :].expand(-1, t, -1), visible], dim=2)[:, None]
            if not self.static:   # transformers takes an additive float mask as is
                mask = additive(mask, lm.dtype)
        # the family's positions for the rows: M-RoPE's (3, B, t) with each row's offset
        positions = lm.adapter.row_positions(positions, self.deltas)
        if layer is None:
            out = lm.adapter.extend(lm, ids, self.cache, attention_mask=mask,
                                    position_ids=positions), None
        else:
            out = lm.adapter.extend_hidden(lm, ids, self.cache, layer, attention_mask=mask,
                                           position_ids=positions)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.next_pos = self.next_pos + new_valid.sum(-1)
        return out

    def rollback(self, drop: list[int | list[bool]]) -> None:
        """Forget the last ``drop[b]`` tokens of row b (rejected proposals): mark its last
        valid slots invalid. A list of bools instead is a keep mask over the row's last
        len(mask) valid slots (a tree's feed: the pending token and its accepted path are
        kept where they are). Nothing is copied; ``trim``/``compact`` reclaim the space."""
        for b, n in enumerate(drop):
            if isinstance(n, list):
                if n and not all(n):
                    self._drop_slots(b, n)
                continue
            if n <= 0:
                continue
            slots = self.valid[b].nonzero().flatten()
            if n > len(slots):
                raise ValueError(f"row {b} holds {len(slots)} tokens, cannot drop {n}")
            self.valid[b, slots[-n:]] = False
            self.next_pos[b] -= n
        self.trim()
        self.compact()

    def _drop_slots(self, b: int, keep: list[bool]) -> None:
        """Row b's last len(keep) valid slots: those not kept become invalid."""
        slots = self.valid[b].nonzero().flatten()
        if len(keep) > len(slots):
            raise ValueError(f"row {b} holds {len(slots)} tokens, not a feed of {len(keep)}")
        kept = torch.tensor(keep, dtype=torch.bool, device=slots.device)
        gone = slots[len(slots) - len(keep):][~kept]
        self.valid[b, gone] = False
        self.next_pos[b] -= len(gone)

    # -- reclaiming space ------------------------------------------------------------
    def trim(self) -> None:
        """Drop columns at either end that no row uses (a slice, no copy of the rest). A
        static cache drops only trailing ones, by length (leading ones go when a row
        leaves, ``keep_rows``, or at ``compact``)."""
        if self.rows == 0:
            self.cache = self._new_cache()
            self.valid = self.valid[:, :0]
            return
        used = self.valid.any(0).nonzero().flatten()
        first, last = (int(used[0]), int(used[-1]) + 1) if len(used) else (0, 0)
        if isinstance(self.cache, StaticKVCache):
            # the trailing columns go by length (no copy); leading ones wait for compact
            first = 0
            self.cache.length = min(self.cache.length, last)
        elif first or last != self.width:
            self._set([(k[:, :, first:last], v[:, :, first:last]) for k, v in self._tensors()])
        self.valid = self.valid[:, first:last]

    def compact(self, waste: float = 0.25) -> None:
        """When more than ``waste`` of the width is not needed by the longest row, gather
        every row's valid slots to the right end (order kept) and shrink the width."""
        if self.rows == 0:
            return
        counts = self.valid.sum(-1)
        width = int(counts.max())
        if self.width - width <= waste * self.width:
            return
        # for each row: the column of its k-th valid slot, right-aligned into `width`
        index = torch.zeros((self.rows, width), dtype=torch.long, device=self.valid.device)
        valid = torch.zeros((self.rows, width), dtype=torch.bool, device=self.valid.device)
        for b in range(self.rows):
            slots = self.valid[b].nonzero().flatten()
            index[b, width - len(slots):] = slots
            valid[b, width - len(slots):] = True

        def gather(x: torch.Tensor) -> torch.Tensor:
            i = index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
            return x.gather(2, i)

        self._set([(gather(k), gather(v)) for k, v in self._tensors()])
        self.valid = valid

    def _set(self, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.static:
            fresh = self._new_cache(tensors[0][0].shape[0] if tensors else 1)
            if tensors:
                fresh.load_tensors(tensors)
        else:
            fresh = self.lm.adapter.new_cache(self.lm, static=False)
            for i, (k, v) in enumerate(tensors):
                fresh.update(k, v, i)
        self.cache = fresh


def _tree_shape(feeds: list[list[int]], trees: list, t: int, device):
    """(offsets (B, t), visible (B, t, t) bool) of a forward where some rows feed a tree:
    each row's feed right-aligned in t slots; a tree row's own offsets and visibility, a
    chain row's 0, 1, … causal; a padding slot sees itself alone (its key is invalid for
    every later query, and no query of the row sees it)."""
    rows = len(feeds)
    offsets = torch.zeros((rows, t), dtype=torch.long)
    visible = torch.eye(t, dtype=torch.bool).repeat(rows, 1, 1)
    for b, (f, tree) in enumerate(zip(feeds, trees)):
        n = len(f)
        if not n:
            continue
        if tree is None:
            offsets[b, t - n:] = torch.arange(n)
            visible[b, t - n:, t - n:] = torch.ones((n, n), dtype=torch.bool).tril()
        else:
            pos, allowed = tree
            if allowed.shape != (n, n) or len(pos) != n:
                raise ValueError("a row's tree feed needs n offsets and an (n, n) visibility")
            offsets[b, t - n:] = pos
            visible[b, t - n:, t - n:] = allowed
    return offsets.to(device), visible.to(device)


def _stack_rows(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """Rows a (B, H, Sa, D) above rows b (B', H, Sb, D), each right-aligned in ``width``
    columns with zeros before it: (B + B', H, width, D), written once."""
    out = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], width, a.shape[3])
    out[: a.shape[0], :, width - a.shape[2]:] = a
    out[a.shape[0]:, :, width - b.shape[2]:] = b
    return out
