"""Growing a draft tree: EAGLE-2 dynamic expansion (and static shapes), and the bookkeeping
a draft needs to feed a tree's frontier into its KV cache.

A round grows the tree level by level (EAGLE-2 §3.1, Fig. 4, ``depth`` levels): every
frontier node u proposes children from its draft distribution q_u; a node's score is its
path probability, the sum of log q along the path from the root; the ``top_k`` best new
nodes become the next frontier (one batched draft forward for all of them).

Where the bookkeeping lives is a measured choice. A level's maths is a few tensor ops on
all frontier rows at once (log-softmax, top-k, one host read of the results); the tree's
structure (a few dozen nodes: tokens, parents, depths, scores) is kept in Python lists, and
each forward's mask is made from them with one tensor construction. Holding the structure
in preallocated tensors too (ancestry rows gathered per level, index writes per node
batch) was tried and measured slower on the CPU (by hand, not recorded): twice the time to
grow and mask a depth-5, top-k-4 tree, and half as much again of drafting overhead per
round in the engine. Ops on tensors of a few dozen elements cost more than the Python they
replace.

Which children a node gets, and which nodes stay, is where losslessness is won or lost:

* Temperature 0: the children are the top-k tokens of q_u, and at the end the best
  ``total_tokens`` nodes by score are kept (EAGLE-2's rerank). Anything goes: the
  verifier only follows the target's argmax. Ties go to the node created first, so a
  parent always ranks before its children (a child's log-score never exceeds its
  parent's) and the kept nodes are closed under ancestors.
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

from typing import Callable

import torch

from vlmspec_cli.runtime.round.tree import DraftTree
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities

StepFn = Callable[[DraftTree, list[int]], torch.Tensor]


def no_eos(logits: torch.Tensor, eos_ids) -> torch.Tensor:
    """Logits (…, V) with EOS made impossible (-inf)."""
    eos = [e for e in eos_ids if e < logits.shape[-1]]
    if not eos:
        return logits
    return logits.index_fill(-1, torch.tensor(eos, device=logits.device), float("-inf"))


def expand_tree(root_logits: torch.Tensor, step: StepFn, depth: int, top_k: int,
                total_tokens: int, sampling: SamplingParams, generator: torch.Generator | None,
                eos_ids=frozenset(), static: bool = False) -> DraftTree:
    """Grow a tree under the root. ``step(tree, nodes)`` runs the draft on those nodes
    (already in ``tree``) and returns their next-token logits (len(nodes), V).

    ``static``: a fixed shape instead of EAGLE-2's dynamic one -- only the first child of
    each level (the draft's argmax at T = 0, its first draw at T > 0) is expanded, so every
    tree is a spine of ``depth`` nodes with ``top_k`` - 1 alternatives at each level, and
    nothing is reranked (the shape never depends on scores)."""
    tree = DraftTree()
    score: list[float] = []
    frontier, logits = [-1], root_logits[None]
    for level in range(depth):
        if sampling.greedy:
            created = _grow_greedy(tree, score, frontier, logits, top_k, level, eos_ids)
        else:
            created = _grow_sampled(tree, score, frontier, logits, top_k, level, depth,
                                    total_tokens, sampling, generator, eos_ids)
        if level == depth - 1 or not created:
            break
        frontier = created[:1] if static else sorted(created, key=lambda i: -score[i])[:top_k]
        logits = step(tree, frontier)
    if len(tree) <= total_tokens:
        return tree
    if sampling.greedy and not static:
        # EAGLE-2 rerank: the best nodes by path probability (ancestor-closed, since a
        # child's score never exceeds its parent's; ties broken towards parents)
        best = sorted(range(len(tree)), key=lambda i: (-score[i], tree.depth[i], i))[:total_tokens]
        keep = set(best)
        for i in best:
            p = tree.parents[i]
            while p >= 0 and p not in keep:
                keep.add(p)
                p = tree.parents[p]
        return tree.subset(sorted(keep))
    return tree.subset(list(range(total_tokens)))   # creation order: a count, not a score


def tree_nodes(depth: int, top_k: int, total_tokens: int, greedy: bool = True,
               static: bool = False) -> int:
    """The nodes ``expand_tree`` grows for these settings, from counts alone: every level's
    frontier (min(created, top_k) nodes; one when ``static``) gets top_k children at T = 0,
    and at T > 0 the children its count budget allows; at most ``total_tokens`` stay. Exact
    while each draft distribution has mass on enough tokens (fewer: fewer nodes). What a
    round of this depth feeds the target, for the auto draft length's cost model."""
    nodes, frontier = 0, 1
    for level in range(depth):
        if greedy:
            per_node = top_k
        else:
            left = total_tokens - nodes
            if left <= 0:
                break
            per_node = max(1, min(top_k, left // (depth - level) // frontier))
        created = per_node * frontier
        nodes += created
        frontier = 1 if static else min(created, top_k)
    return min(nodes, total_tokens)


def _add(tree: DraftTree, score: list[float], parent: int, token: int, level: int,
         path_score: float) -> int:
    tree.tokens.append(token)
    tree.parents.append(parent)
    tree.depth.append(level)
    score.append(path_score)
    return len(tree) - 1


def _grow_greedy(tree: DraftTree, score: list[float], frontier: list[int], logits: torch.Tensor,
                 top_k: int, level: int, eos_ids) -> list[int]:
    """T = 0: each frontier node gets its top_k children by the draft's log-softmax (EOS
    excluded, i.e. renormalised without it), every row in a few tensor ops and one read;
    returns the new nodes."""
    logq = torch.log_softmax(no_eos(logits.float(), eos_ids), dim=-1)     # (F, V)
    values, picks = logq.topk(min(top_k, logq.shape[-1]), dim=-1)
    values, picks = values.tolist(), picks.tolist()
    created = []
    for r, u in enumerate(frontier):
        base = 0.0 if u < 0 else score[u]
        for lq, tok in zip(values[r], picks[r]):
            if not lq > float("-inf"):   # fewer than top_k tokens with mass (or a NaN row)
                break
            created.append(_add(tree, score, u, tok, level, base + lq))
    return created


def _grow_sampled(tree: DraftTree, score: list[float], frontier: list[int], logits: torch.Tensor,
                  top_k: int, level: int, depth: int, total_tokens: int,
                  sampling: SamplingParams, generator: torch.Generator | None,
                  eos_ids) -> list[int]:
    """T > 0: children drawn without replacement, as many per node as the count budget
    allows; each node's q (EOS removed, renormalised) is kept for the verifier."""
    left = total_tokens - len(tree)
    if left <= 0:
        return []
    # children per node from counts alone (never from the drawn tokens): spread the
    # nodes still allowed over the levels still to grow
    budget = max(1, min(top_k, left // (depth - level) // len(frontier)))
    created = []
    for u, row in zip(frontier, logits):
        q = probabilities(no_eos(row.float(), eos_ids), sampling.scoring)
        mass = float(q.sum())
        if not mass > 0:
            continue
        q = q / mass
        k = min(budget, int((q > 0).sum()))
        picks = torch.multinomial(q.cpu(), k, replacement=False, generator=generator)
        tree.q[u] = q
        base = 0.0 if u < 0 else score[u]
        for tok, lq in zip(picks.tolist(), torch.log(q.cpu()[picks]).tolist()):
            created.append(_add(tree, score, u, tok, level, base + lq))
    return created


class FrontierFeed:
    """What a draft has fed of this round's tree: nodes in feeding order, which are also
    their cache slots (prefix, prefix + 1, …). A frontier node sees the prefix, its
    ancestors (all fed at earlier levels, as earlier frontiers) and itself."""

    def __init__(self) -> None:
        self.slot: dict[int, int] = {}   # fed node -> its index in feeding order
        self.prefix = 0

    def start(self, prefix: int) -> None:
        self.slot, self.prefix = {}, prefix

    def feed(self, tree: DraftTree, nodes: list[int]):
        """The draft's inputs for ``nodes``: tokens (1, F), positions (1, F) and the
        allowed mask (F, prefix + fed) over its cache (bool, True = visible)."""
        first = len(self.slot)
        for i, u in enumerate(nodes):
            self.slot[u] = first + i
        rows = []
        for u in nodes:
            row = [False] * len(self.slot)
            row[self.slot[u]] = True
            p = tree.parents[u]
            while p >= 0:
                row[self.slot[p]] = True
                p = tree.parents[p]
            rows.append(row)
        allowed = torch.cat([torch.ones((len(nodes), self.prefix), dtype=torch.bool),
                             torch.tensor(rows, dtype=torch.bool)], dim=1)
        ids = torch.tensor([[tree.tokens[u] for u in nodes]])
        positions = torch.tensor([[self.prefix + tree.depth[u] for u in nodes]])
        return ids, positions, allowed

    def slots(self, tree: DraftTree, path: list[int]) -> list[int]:
        """Cache slots of the path's nodes that were fed (a path ends in a leaf or a node
        the draft never fed), in path order; ``tree`` may be the reranked subset."""
        origin = tree.origin or list(range(len(tree)))
        return [self.prefix + self.slot[origin[n]] for n in path if origin[n] in self.slot]
