"""Per-position acceptance for ``drafting.length: auto`` (draft_length.py): the chance
h_i that proposal i is kept given the ones before it were, counted per request and per
process (``Acceptance``, decayed Kaplan-Meier counts), the tokens a round of k proposals
emits on average (``expected_tokens``, Eq. 1's numerator), and a request's own
draft-length bookkeeping (``LengthState``)."""

from __future__ import annotations

from dataclasses import dataclass, field

SHRINK = 2.0              # the process's rates: rounds of the pooled (or shallower) rate


class Acceptance:
    """Per-position acceptance, decayed: h_i = P(proposal i kept | proposals 1..i-1 kept).
    A round that drafted k and kept n puts positions 1..min(n + 1, k) at risk and keeps
    1..n (a Kaplan-Meier count: a chain cut short says nothing of the positions it did not
    reach). Every count decays by ``decay`` per round."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.risk: list[float] = []
        self.kept: list[float] = []

    def observe(self, drafted: int, accepted: int, dropped: float | None = None) -> None:
        """``dropped``: the draft's confidence in the proposal after the last one verified,
        which the round drafted and did not verify (draft_stop.py); when every verified one
        was kept, that position was at risk and is counted kept by that much (the
        confidence is close to the chance; uncounted, the positions a chain stops at for
        low confidence would be seen only when the draft was confident there)."""
        reached, soft = min(accepted + 1, drafted), 0.0
        if dropped is not None and accepted == drafted:
            reached, soft = drafted + 1, dropped
        if len(self.risk) < reached:
            grow = reached - len(self.risk)
            self.risk += [0.0] * grow
            self.kept += [0.0] * grow
        for i in range(len(self.risk)):
            self.risk[i] = self.decay * self.risk[i] + (i < reached)
            kept = (i < accepted) + (soft if i == drafted else 0.0)
            self.kept[i] = self.decay * self.kept[i] + kept

    def rates(self, n: int, prior: list[float] | None = None, weight: float = 0.0) -> list[float]:
        """h_1..h_n from these counts and ``prior`` rates worth ``weight`` rounds at each
        position; without a prior, position 1's rate is shrunk towards the pooled one (all
        positions' kept ÷ at risk) and each deeper position's towards the one before it, by
        SHRINK rounds, so a position seen rarely, or never, is not taken as 0 or 1 from one
        round, nor as likely as the first positions (which dominate the pooled rate): a
        draft's agreement falls with depth, and a deep position reached in few rounds is
        taken as its shallower neighbour until it has been seen."""
        chained = prior is None
        if chained:
            pooled = (sum(self.kept) + 0.5) / (sum(self.risk) + 1.0)
            prior, weight = [pooled] * n, SHRINK
        out = []
        for i in range(n):
            risk = self.risk[i] if i < len(self.risk) else 0.0
            kept = self.kept[i] if i < len(self.kept) else 0.0
            towards = out[-1] if chained and out else prior[i]
            out.append(min((kept + weight * towards) / (risk + weight), 0.999))
        return out


def expected_tokens(rates: list[float], k: int) -> float:
    """E(k) = 1 + S_1 + … + S_k, S_i = h_1 ⋯ h_i: the tokens a round of k proposals
    emits on average."""
    total, survive = 1.0, 1.0
    for h in rates[:k]:
        survive *= h
        total += survive
    return total


@dataclass
class LengthState:
    """One request's draft-length bookkeeping (``DecodeState.length``)."""

    acceptance: Acceptance
    previous: int = -1           # the last round's choice (0: plain; -1: none yet)
    chose: bool = False          # this round's k was chosen (not the free first round)
    hist: list[int] = field(default_factory=list)   # [k]: rounds that chose k (0: plain)
    probes: int = 0
    stopped: int = 0             # rounds whose chain the draft's confidence ended short of k
    # a batch's row: its own draft_length.AutoGamma (round_policy.row_model); None: the
    # process's
    model: object | None = None

    def count(self, k: int) -> None:
        if len(self.hist) <= k:
            self.hist.extend([0] * (k + 1 - len(self.hist)))
        self.hist[k] += 1
