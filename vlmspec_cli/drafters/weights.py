"""TABED's test-time adaptive ensemble weights (TABED §5.1, Algorithm 1 lines 2-3).

Every verified position t' gives the target's distribution p_t' (the "soft label") next to
the m member distributions q_t'^(1..m) the draft produced there. Before each drafting
block the weight policy S_W offers candidate weight vectors W = [w^1..w^n] and keeps

    w* = argmin_j  sum_{t' in window}  D(p_t', sum_i w^j_i q_t'^(i))

which then holds for the whole block of γ tokens. D is KL(p || q) or the total variation
distance. Policies:

- ``grid``:    w^j = [1 - j/n, j/n] for two members (n = ``grid``); for m > 2 members every
               point of the simplex with step 1/n.
- ``softmax``: one candidate, w = softmax([1/e^(1) .. 1/e^(m)] / τ) with e^(i) each member's
               own summed distance (App. B.2; cheap when m grows).
- ``static``:  equal weights forever (the paper's MT / MTCP rows).

Weights never touch losslessness: whatever w is, the drafted token is sampled from the
mixture q = sum_i w_i q^(i) and verification uses exactly that q.
"""

from __future__ import annotations

import itertools
from collections import deque

import torch

POLICIES = ("grid", "softmax", "static")
DISTANCES = ("kl", "tvd")
_EPS = 1e-10


def distance(p: torch.Tensor, q: torch.Tensor, kind: str) -> torch.Tensor:
    """D(p, q) over the last dimension (any leading shape)."""
    if kind == "kl":
        # KL(p || q) = sum_v p_v (log p_v - log q_v); terms with p_v = 0 are 0. q is floored
        # so that a member giving 0 where the target does not costs a large, finite amount.
        return (torch.xlogy(p, p) - p * torch.log(q.clamp_min(_EPS))).sum(-1)
    if kind == "tvd":
        return 0.5 * (p - q).abs().sum(-1)
    raise ValueError(f"unknown distance '{kind}' (choose from {DISTANCES})")


def grid_candidates(members: int, steps: int) -> torch.Tensor:
    """All weight vectors with entries in {0, 1/n, ..., 1} summing to 1, shape (K, m).
    For two members: row j is [1 - j/n, j/n]."""
    rows = []
    # stars and bars: choose m-1 bar positions among n + m - 1 slots
    for bars in itertools.combinations(range(steps + members - 1), members - 1):
        edges = (-1, *bars, steps + members - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(members)])
    rows.sort(key=lambda r: [-x for x in r])  # two members: j = 0, 1, ..., n
    return torch.tensor(rows, dtype=torch.float32) / steps


def parse_window(window: int | str) -> int | None:
    """A window length h, or None for all verified positions."""
    if window in (None, "all"):
        return None
    h = int(window)
    if h < 1:
        raise ValueError(f"ensemble window must be >= 1 or 'all' (got {window!r})")
    return h


class EnsembleWeights:
    """Chooses the weight vector for each drafting block from the verified history."""

    def __init__(self, members: int, policy: str = "grid", distance_kind: str = "kl",
                 window: int | str = "all", grid: int = 10, temperature: float = 1.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown ensemble policy '{policy}' (choose from {POLICIES})")
        if distance_kind not in DISTANCES:
            raise ValueError(f"unknown distance '{distance_kind}' (choose from {DISTANCES})")
        self.members = members
        self.policy = policy
        self.distance_kind = distance_kind
        self.temperature = temperature
        self.equal = torch.full((members,), 1.0 / members)
        self.candidates = grid_candidates(members, grid) if policy == "grid" else None
        h = parse_window(window)
        # per verified position: each member's own distance (m,) and, for the grid, each
        # candidate mixture's distance (K,); with no window, only their running sums
        self.member_history: deque[torch.Tensor] = deque(maxlen=h)
        self.candidate_history: deque[torch.Tensor] = deque(maxlen=h)
        self.windowed = h is not None
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    @property
    def observed(self) -> int:
        return len(self.member_history) if self.windowed else self.count

    def _keep(self, name: str, history: deque, rows: torch.Tensor) -> None:
        if self.windowed:
            history.extend(rows)
        else:
            self.sums[name] = rows.sum(0) + self.sums.get(name, 0)

    def _total(self, name: str, history: deque) -> torch.Tensor:
        """The summed distances over the window (all verified positions: the running sum)."""
        return torch.stack(list(history)).sum(0) if self.windowed else self.sums[name]

    def observe(self, p: torch.Tensor, member_q: torch.Tensor) -> None:
        """Verified positions: target p (n, V) and the members' q (n, m, V) at the same
        positions (the prefix before each position was the accepted one)."""
        p = p.float()
        member_q = member_q.float()
        own = distance(p[:, None, :], member_q, self.distance_kind)          # (n, m)
        self._keep("member", self.member_history, own)
        self.count += own.shape[0]
        if self.candidates is not None:
            mixtures = torch.einsum("km,nmv->nkv", self.candidates, member_q)  # (n, K, V)
            self._keep("candidate", self.candidate_history,
                       distance(p[:, None, :], mixtures, self.distance_kind))

    def current(self) -> torch.Tensor:
        """w* for the next block, shape (m,)."""
        if self.policy == "static" or self.members == 1 or not self.observed:
            return self.equal.clone()
        if self.policy == "grid":
            errors = self._total("candidate", self.candidate_history)          # (K,)
            return self.candidates[int(torch.argmin(errors))].clone()
        errors = self._total("member", self.member_history)                    # (m,)
        inverse = 1.0 / errors.clamp_min(_EPS)
        return torch.softmax(inverse / self.temperature, dim=0)
