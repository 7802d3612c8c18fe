"""Draft trees: the data structure, EAGLE-2 dynamic expansion, and tree attention masks.

A tree hangs under the *root*: the last committed token (the target's pending token).
Node i holds ``tokens[i]``, its parent ``parents[i]`` (-1 = the root) and ``depth[i]``
(0 for the root's children), so node i sits at position base + depth[i]. Nodes are in
creation order, parents before children, and siblings in the order they were drawn.

EAGLE-2 expansion (EAGLE-2 §3.1, Fig. 4), ``depth`` levels:
  each level, every frontier node u proposes ``top_k`` children from its draft
  distribution q_u; a child's score is its path probability, the product of the draft
  probabilities along the path from the root; the ``top_k`` best new nodes become the
  next frontier (one batched draft forward for all of them).

Which children a node gets, and which nodes stay, is where losslessness is won or lost:

* Temperature 0: the children are the top-k tokens of q_u, and at the end the best
  ``total_tokens`` nodes by score are kept (EAGLE-2's rerank). Anything goes: the
  verifier only follows the target's argmax.
* Temperature > 0: the children of u are drawn from q_u *without replacement*, and
  verification (verify.py, ``verify_tree``) checks them in that order with q_u renormalised
  over the tokens not yet drawn. That is exact only if which drawn children stay in the
  tree does not depend on the drawn tokens themselves (a rerank by their own scores would
  bias the kept tokens towards high q, the anchor bug of EAGLE#329 / transformers#47932).
  So at T > 0 every drawn child stays: the ``total_tokens`` budget is spread over the
  levels beforehand by counts (children per node = nodes left ÷ levels left ÷ frontier
  size, at most ``top_k``), never by scores. Scores still pick which nodes are
  *expanded*: that decides whether a node has children, not how the node was drawn.

EOS is never proposed (q_u(EOS) is set to 0 and q_u renormalised, and that q_u is the one
the verifier sees): nothing can follow it, and the target adds it itself when it wants it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.draft import Proposal, Verdict
from vlmspec_cli.runtime.request import DecodeState, TargetFeatures
from vlmspec_cli.runtime.verify import UNIT_TEMPERATURE, SamplingParams, probabilities, verify_tree

if TYPE_CHECKING:
    from vlmspec_cli.runtime.engine import SpeculativeEngine


@dataclass
class DraftTree(Proposal):
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    # node (or -1 for the root) -> the distribution its children were drawn from (T > 0)
    q: dict[int, torch.Tensor] = field(default_factory=dict)
    accepted: list[int] = field(default_factory=list)   # set by the engine after verifying
    origin: list[int] | None = None   # each node's index before subset() (None: its own)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depth) + 1 if self.depth else 0

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def ancestry(self) -> torch.Tensor:
        """(N, N) bool: [i, j] is True when node j is node i or one of its ancestors."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] |= mask[p]
        return mask

    def subset(self, keep: list[int]) -> "DraftTree":
        """The tree restricted to ``keep`` (closed under ancestors), renumbered in order."""
        keep = sorted(keep)
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree([self.tokens[i] for i in keep],
                         [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
                         [self.depth[i] for i in keep],
                         {(index[u] if u >= 0 else -1): q for u, q in self.q.items()
                          if u < 0 or u in index},
                         origin=[self.origin[i] if self.origin else i for i in keep])

    def verify(self, engine: "SpeculativeEngine", state: DecodeState) -> Verdict:
        """One target forward over the pending token and every node (4-D mask: a node sees
        the cache, the pending token, its ancestors and itself; node i at position
        base + depth_i); ``verify_tree`` picks the accepted path, and the target cache
        will keep only that path (``Verdict.keep``, an index_select)."""
        lm = engine.target
        past = cache_length(state.target_cache)
        lead = len(state.target_pending)
        if len(self):
            ids = torch.tensor([state.target_pending + self.tokens], device=lm.device)
            positions = torch.tensor([list(range(past, past + lead)) +
                                      [past + lead + d for d in self.depth]], device=lm.device)
            mask = tree_mask(self, past, lead, lm.dtype, lm.device)
            logits = engine.extend(state, ids, attention_mask=mask, position_ids=positions)
            root = logits[lead - 1] if lead else state.target_next_logits
            node_logits = logits[lead:]
        else:  # nothing drafted: an ordinary step of the pending token
            pending = torch.tensor([state.target_pending], device=lm.device)
            root = engine.extend(state, pending)[-1] if lead else state.target_next_logits
            node_logits = None
        path, tok = verify_tree(self, root, node_logits, engine.sampling, state.target_generator,
                                engine.relax)
        if state.features is not None and len(self):  # the kept rows: pending, then the path
            rows = state.features.hidden
            state.features = TargetFeatures(torch.cat([rows[:lead], rows[lead:][path]]), past)
        self.accepted = path
        verified = torch.cat([root[None]] + ([node_logits[path]] if path else []))
        return Verdict([self.tokens[n] for n in path], tok, verified, drafted=len(self),
                       positions=self.max_depth,
                       keep=list(range(past + lead)) + [past + lead + n for n in path])


StepFn = Callable[[DraftTree, list[int]], torch.Tensor]


def expand_tree(root_logits: torch.Tensor, step: StepFn, depth: int, top_k: int,
                total_tokens: int, sampling: SamplingParams, generator: torch.Generator | None,
                eos_ids: set[int] = frozenset(), static: bool = False) -> DraftTree:
    """Grow a tree under the root. ``step(tree, nodes)`` runs the draft on those nodes
    (already in ``tree``) and returns their next-token logits (len(nodes), V).

    ``static``: a fixed shape instead of EAGLE-2's dynamic one -- only the first child of
    each level (the draft's argmax at T = 0, its first draw at T > 0) is expanded, so every
    tree is a spine of ``depth`` nodes with ``top_k`` - 1 alternatives at each level, and
    nothing is reranked (the shape never depends on scores)."""
    tree = DraftTree()
    greedy = sampling.greedy
    score: list[float] = []
    frontier, logits = [-1], root_logits[None]
    root_score = {-1: 0.0}
    for level in range(depth):
        created = []
        if not greedy:
            # children per node from counts alone (never from the drawn tokens): spread the
            # nodes still allowed over the levels still to grow
            left = total_tokens - len(tree)
            if left <= 0:
                break
            budget = max(1, min(top_k, left // (depth - level) // len(frontier)))
        if greedy:
            created = _grow_greedy(tree, score, frontier, logits, top_k, level, eos_ids,
                                   root_score[-1])
        for u, row in zip(frontier, [] if greedy else logits):
            q = probabilities(row.float(), sampling.scoring)
            for e in eos_ids:
                if e < q.shape[-1]:
                    q[e] = 0.0
            mass = float(q.sum())
            if mass <= 0:
                continue
            q = q / mass
            k = min(budget, int((q > 0).sum()))
            picks = torch.multinomial(q.cpu(), k, replacement=False, generator=generator).tolist()
            tree.q[u] = q
            base = root_score[-1] if u < 0 else score[u]
            for tok in picks:
                tree.tokens.append(int(tok))
                tree.parents.append(u)
                tree.depth.append(level)
                score.append(base + float(torch.log(q[tok])))
                created.append(len(tree) - 1)
        if level == depth - 1 or not created:
            break
        frontier = created[:1] if static else sorted(created, key=lambda i: -score[i])[:top_k]
        logits = step(tree, frontier)
    if len(tree) <= total_tokens:
        return tree
    if greedy and not static:  # EAGLE-2 rerank: the best nodes by path probability (ancestor-closed,
        # since a child's score never exceeds its parent's; ties broken towards parents)
        best = sorted(range(len(tree)), key=lambda i: (-score[i], tree.depth[i], i))[:total_tokens]
        keep = set(best)
        for i in best:
            p = tree.parents[i]
            while p >= 0 and p not in keep:
                keep.add(p)
                p = tree.parents[p]
        return tree.subset(list(keep))
    return tree.subset(list(range(total_tokens)))   # creation order: a count, not a score


def _grow_greedy(tree: DraftTree, score: list[float], frontier: list[int], logits: torch.Tensor,
                 top_k: int, level: int, eos_ids: set[int], root_score: float) -> list[int]:
    """T = 0: each frontier node gets its top_k children by the draft's softmax (EOS
    excluded, renormalised), all rows in a few tensor ops; returns the new nodes."""
    q = probabilities(logits.float(), UNIT_TEMPERATURE)            # (F, V)
    eos = [e for e in eos_ids if e < q.shape[-1]]
    if eos:
        q[:, eos] = 0.0
    q = q / q.sum(-1, keepdim=True)
    values, picks = q.topk(min(top_k, q.shape[-1]), dim=-1)
    logq = torch.log(values).tolist()
    values, picks = values.tolist(), picks.tolist()
    created = []
    for r, u in enumerate(frontier):
        base = root_score if u < 0 else score[u]
        for v, tok, lq in zip(values[r], picks[r], logq[r]):
            if not v > 0:        # fewer than top_k tokens with mass (or none: NaN row)
                break
            tree.tokens.append(int(tok))
            tree.parents.append(u)
            tree.depth.append(level)
            score.append(base + lq)
            created.append(len(tree) - 1)
    return created


def tree_mask(tree: DraftTree, past: int, lead: int, dtype: torch.dtype,
              device) -> torch.Tensor:
    """Additive 4-D mask (1, 1, lead + N, past + lead + N) for one forward over ``lead``
    chain tokens (e.g. the pending token) followed by the tree's nodes: the cache and the
    lead tokens are visible causally, a node also sees its ancestors and itself."""
    n = len(tree)
    q = lead + n
    allowed = torch.zeros((q, past + q), dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:, past:past + lead] = torch.tril(torch.ones((q, lead), dtype=torch.bool), diagonal=0)
    allowed[lead:, past:past + lead] = True
    allowed[lead:, past + lead:] = tree.ancestry()
    return additive_mask(allowed, dtype, device)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """(q, kv) bool → the (1, 1, q, kv) additive float mask transformers passes through
    as is (0 where allowed, finfo.min elsewhere; a bool 4-D mask is wrong with eager)."""
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def path_to(tree: DraftTree, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]
