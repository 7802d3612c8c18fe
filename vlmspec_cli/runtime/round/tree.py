"""Draft trees: the data structure, its verification by the target, and tree attention
masks. Trees are grown by runtime/round/tree_growth.py (EAGLE-2 expansion, in tensors).

A tree hangs under the *root*: the last committed token (the target's pending token).
Node i holds ``tokens[i]``, its parent ``parents[i]`` (-1 = the root) and ``depth[i]``
(0 for the root's children), so node i sits at position base + depth[i]. Nodes are in
creation order, parents before children, and siblings in the order they were drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.round.draft import Proposal, TargetFeed, Verdict
from vlmspec_cli.runtime.fast.fast_decoder import additive
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.round.verify import Relaxation, SamplingParams, verify_tree


@dataclass
class DraftTree(Proposal):
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    # node (or -1 for the root) -> the distribution its children were drawn from (T > 0)
    q: dict[int, torch.Tensor] = field(default_factory=dict)
    origin: list[int] | None = None   # each node's index before subset() (None: its own)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depth) + 1 if self.depth else 0

    @property
    def levels(self) -> int:
        return self.max_depth

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def ancestry(self) -> torch.Tensor:
        """(N, N) bool: [i, j] is True when node j is node i or one of its ancestors
        (rows built in Python, one tensor made: cheaper than per-row tensor ops)."""
        n = len(self)
        rows: list[list[bool]] = []
        for i, p in enumerate(self.parents):
            row = list(rows[p]) if p >= 0 else [False] * n
            row[i] = True
            rows.append(row)
        return torch.tensor(rows, dtype=torch.bool).reshape(n, n)

    def subset(self, keep: list[int]) -> "DraftTree":
        """The tree restricted to ``keep`` (ascending, closed under ancestors), renumbered."""
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree([self.tokens[i] for i in keep],
                         [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
                         [self.depth[i] for i in keep],
                         {(index[u] if u >= 0 else -1): q for u, q in self.q.items()
                          if u < 0 or u in index},
                         origin=[self.origin[i] if self.origin else i for i in keep])

    def target_feed(self, state: DecodeState) -> TargetFeed:
        """The pending token, then every node: node i at position base + depth_i, seeing
        the cache, the pending token, its ancestors and itself (nothing drafted: an
        ordinary step of the pending token)."""
        if not len(self):
            return TargetFeed(list(state.target_pending))
        past = _own_past(state)
        lead = len(state.target_pending)
        depth = torch.tensor(self.depth)
        positions = torch.cat([torch.arange(past, past + lead), past + lead + depth])
        return TargetFeed(state.target_pending + self.tokens, positions,
                          tree_allowed(self.ancestry(), past, lead))

    def judge(self, state: DecodeState, out: torch.Tensor | None, sampling: SamplingParams,
              relax: Relaxation | None = None) -> Verdict:
        """``verify_tree`` picks the accepted path from the target's logits at the root
        (the pending token's row, or the prefill's) and after every node; the target
        cache will keep only that path (``Verdict.keep``: the accepted nodes' slots, moved
        down after the prefix)."""
        lead = len(state.target_pending)
        # the cache before this round's forward: it now also holds every fed row of ``out``
        # (a row of a batch: 0, ``_own_past``)
        fed = len(out) if out is not None and state.target_cache is not None else 0
        past = _own_past(state) - fed
        root = out[lead - 1] if lead else state.target_next_logits
        node_logits = out[lead:] if len(self) else None
        path, tok = verify_tree(self, root, node_logits, sampling, state.target_generator, relax)
        verified = torch.cat([root[None]] + ([node_logits[path]] if path else []))
        return Verdict([self.tokens[n] for n in path], tok, verified, drafted=len(self),
                       positions=self.max_depth, path=path,
                       keep=(past + lead, [past + lead + n for n in path]))


def _own_past(state: DecodeState) -> int:
    """The positions in the request's own target cache; 0 for a row of a batch, whose
    cache is the batch's (runtime/fast/ragged.py): its feed's positions and visibility are
    then relative to the row's own prefix, which the ragged cache adds, and ``Verdict.keep``
    names slots of the round's feed."""
    return 0 if state.target_cache is None else cache_length(state.target_cache)


def tree_allowed(anc: torch.Tensor, past: int, lead: int) -> torch.Tensor:
    """(lead + N, past + lead + N) bool, True = visible, for one forward over ``lead``
    chain tokens (e.g. the pending token) followed by a tree's N nodes with ancestry
    ``anc``: the cache and the lead tokens are visible causally, a node also sees its
    ancestors and itself."""
    n = anc.shape[0]
    q = lead + n
    lead_rows = torch.ones((lead, past + q), dtype=torch.bool).tril(past)
    node_rows = torch.cat([torch.ones((n, past + lead), dtype=torch.bool), anc], dim=1)
    return torch.cat([lead_rows, node_rows])


def tree_mask(tree: DraftTree, past: int, lead: int, dtype: torch.dtype,
              device) -> torch.Tensor:
    """``tree_allowed`` as the additive 4-D mask (1, 1, lead + N, past + lead + N)."""
    return additive_mask(tree_allowed(tree.ancestry(), past, lead), dtype, device)


def attention_for(lm, allowed: torch.Tensor, cache) -> torch.Tensor:
    """A (q, kv) visibility mask in the form a forward over ``cache`` takes: bool
    (1, 1, q, kv) on the fast path (a ``StaticKVCache``; scaled-dot-product attention reads
    True = visible), the additive float mask through transformers."""
    if isinstance(cache, StaticKVCache):
        return allowed[None, None].to(lm.device)
    return additive_mask(allowed, lm.dtype, lm.device)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """(q, kv) bool → the (1, 1, q, kv) additive float mask transformers passes through
    as is (0 where allowed, finfo.min elsewhere; a bool 4-D mask is wrong with eager)."""
    return additive(allowed, dtype)[None, None].to(device)


def path_to(tree: DraftTree, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]
