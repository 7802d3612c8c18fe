"""How big each round's draft tree is: fixed (static and EAGLE-2 dynamic trees) or
adapted per image region (ADT-Tree). What proposes the tokens is the drafter's business;
these policies only pick (depth, top_k) for the tree about to be drafted, and learn from
how much of it the target accepted.

ADT-Tree (Lei et al., §IV), for the tree whose first token is image token s^(i,j) in the
token grid (raster order, ``cols`` tokens per row):

* Adjacent initialisation (§IV-A): (d~, k~) = the (depth, top_k) of the tree that produced
  a neighbouring token: the left one s^(i,j-1) ("horizontal", the paper's choice), the one
  above s^(i-1,j) ("vertical"), or uniform in the bounds ("random"). At the first column
  (first row) horizontal (vertical) falls back to the other neighbour; with no neighbour
  yet, the profile's tree.depth / tree.top_k.
* Bisectional adaptation (§IV-B, Eq. 2) by that neighbour tree's acceptance rate
  α = accepted / d (draft tokens it got accepted over its depth; for "random", the last
  tree's), threshold β and steps l_d, l_k:

      α ≥ β  (positive: its depth was used)      d = d~ + l_d,  k = k~ − l_k
      α < β  (negative: levels went unused)      d = d~ − l_d,  k = k~ + l_k

  clamped to [d_min, d_max] × [k_min, k_max]: deeper and narrower where the draft is
  right (flat regions), shallower and wider where it is not (edges, texture).

Neither choice looks at the tokens being drafted, only at earlier rounds, so trees of any
shape are verified exactly as before (lossless at every temperature).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

INIT_STRATEGIES = ("horizontal", "vertical", "random")


@dataclass
class TreeRound:
    position: int       # index of the first token the tree drafted
    depth: int
    top_k: int
    accepted: int       # draft tokens accepted

    @property
    def alpha(self) -> float:
        return self.accepted / self.depth if self.depth else 0.0


@dataclass
class RoundLog:
    """Every round of one request, and which round produced each token position."""

    rounds: list[TreeRound] = field(default_factory=list)
    owner: dict[int, int] = field(default_factory=dict)     # token position -> round index

    def add(self, r: TreeRound) -> None:
        self.rounds.append(r)
        for pos in range(r.position, r.position + r.accepted + 1):   # + the target's token
            self.owner[pos] = len(self.rounds) - 1

    def summary(self, positions: int) -> dict:
        """Mean depth d̄ and width, and the acceptance length (tokens emitted by its round)
        of every token position: the paper's Figure 2 "depth matrix", row by row."""
        n = len(self.rounds)
        lengths = [self.rounds[self.owner[p]].accepted + 1 if p in self.owner else 1
                   for p in range(positions)]
        return {"mean_depth": round(sum(r.depth for r in self.rounds) / n, 4) if n else 0.0,
                "mean_top_k": round(sum(r.top_k for r in self.rounds) / n, 4) if n else 0.0,
                "depths": [r.depth for r in self.rounds],
                "top_ks": [r.top_k for r in self.rounds],
                "accept_lengths": lengths}


class FixedShape:
    """Every tree the same: the profile's tree.depth and tree.top_k."""

    def __init__(self, depth: int, top_k: int) -> None:
        self.depth, self.top_k = depth, top_k

    @property
    def width(self) -> int:
        """The top_k of the next tree (what a round's feed is estimated with)."""
        return self.top_k

    def choose(self, log: RoundLog, position: int, generator: torch.Generator | None) -> tuple[int, int]:
        return self.depth, self.top_k


@dataclass
class AdtBounds:
    min_depth: int = 1
    max_depth: int = 8
    min_top_k: int = 1
    max_top_k: int = 10


class AdjacencyAdaptive:
    """ADT-Tree: (depth, top_k) from a neighbour's tree, moved by Eq. 2."""

    def __init__(self, cols: int, init: str = "horizontal", beta: float = 1.0,
                 step_depth: int = 1, step_top_k: int = 2, bounds: AdtBounds | None = None,
                 depth: int = 4, top_k: int = 4) -> None:
        if init not in INIT_STRATEGIES:
            raise ValueError(f"adaptive_tree.init must be one of {INIT_STRATEGIES}, not '{init}'")
        self.cols = max(1, int(cols))
        self.init, self.beta = init, float(beta)
        self.step_depth, self.step_top_k = int(step_depth), int(step_top_k)
        self.bounds = bounds or AdtBounds()
        b = self.bounds
        if not (1 <= b.min_depth <= b.max_depth and 1 <= b.min_top_k <= b.max_top_k):
            raise ValueError("adaptive_tree bounds need 1 <= min_depth <= max_depth and "
                             "1 <= min_top_k <= max_top_k")
        self.start = (self._clamp_depth(depth), self._clamp_top_k(top_k))
        # the top_k last chosen, any request's: the next tree's is near it (its neighbour's
        # ± l_k), an estimate of a round's feed before the policy picks its shape
        self.width = self.start[1]

    def _clamp_depth(self, d: int) -> int:
        return min(max(d, self.bounds.min_depth), self.bounds.max_depth)

    def _clamp_top_k(self, k: int) -> int:
        return min(max(k, self.bounds.min_top_k), self.bounds.max_top_k)

    def neighbour(self, log: RoundLog, position: int) -> TreeRound | None:
        """The round that produced the neighbouring token of ``position``."""
        i, j = divmod(position, self.cols)
        left = position - 1 if j > 0 else None
        above = position - self.cols if i > 0 else None
        order = (left, above) if self.init == "horizontal" else (above, left)
        for pos in order:
            if pos is not None and pos in log.owner:
                return log.rounds[log.owner[pos]]
        return None

    def adapt(self, d: int, k: int, alpha: float) -> tuple[int, int]:
        """Eq. 2, clamped to the bounds."""
        if alpha >= self.beta:
            d, k = d + self.step_depth, k - self.step_top_k
        else:
            d, k = d - self.step_depth, k + self.step_top_k
        return self._clamp_depth(d), self._clamp_top_k(k)

    def choose(self, log: RoundLog, position: int, generator: torch.Generator | None) -> tuple[int, int]:
        depth, self.width = self._choose(log, position, generator)
        return depth, self.width

    def _choose(self, log: RoundLog, position: int, generator: torch.Generator | None) -> tuple[int, int]:
        if self.init == "random":
            b = self.bounds
            pick = torch.randint(0, 1 << 30, (2,), generator=generator).tolist()
            d = b.min_depth + pick[0] % (b.max_depth - b.min_depth + 1)
            k = b.min_top_k + pick[1] % (b.max_top_k - b.min_top_k + 1)
            if not log.rounds:
                return d, k
            return self.adapt(d, k, log.rounds[-1].alpha)
        ref = self.neighbour(log, position)
        if ref is None:
            return self.start
        return self.adapt(ref.depth, ref.top_k, ref.alpha)
