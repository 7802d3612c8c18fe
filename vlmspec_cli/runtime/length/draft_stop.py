"""Where a chain stops within a round (``drafting.length: auto``): by the draft's own
confidence in each proposal, priced at the rate this process decodes at.

The length γ that ``AutoGamma`` chooses before a round (Eq. 1') rests on the acceptance
of earlier rounds; within the round the draft says more. Its probability of its own
proposal, c_j (at T = 0 the softmax of its logits at the argmax; at T > 0 q(x_j), the
probability of the token it drew), is close to the chance the target keeps it: over the
mixed set of bench/auto_gamma_replay.py (481 proposals on the target's own prefix;
bench/history/RESULTS-until-2026-12-07.md, "Session 52") those drafted at c in [0.3, 0.5) were kept 35% of the
time, [0.5, 0.7) 48%, [0.7, 0.9) 72%, [0.9, 0.99) 91%, c ≥ 0.999 all of them. So
S_i = c_1 ⋯ c_i estimates P(proposals 1..i kept).

The rule (Dinkelbach's, for a ratio): the process decodes R tokens a second (``rate``,
over its last rounds, each priced by the round-cost lines). A round that keeps the
prefix x_1..x_L of what it drafted is worth, in expectation,

    W(L) = S_1 + … + S_L − R · V'(L),   V'(L) = V(L + 1), V'(0) = a plain step's V(1),

the time already spent drafting being sunk. Each round maximising tokens − R · seconds
raises R towards the best rate reachable. So:

- drafting goes on to position i + 1 while S_i · h_{i+1} ≥ R · (ΔD_i + ΔV_i),
  h_{i+1} the acceptance of position i + 1 seen in earlier rounds (``AutoGamma.rates``),
  ΔD_i = D(i + 1) − D(i) and ΔV_i = V(i + 2) − V(i + 1) what that position adds;
- of the i positions drafted the round verifies the prefix L with the largest W(L): L = 0
  when even the first proposal is unlikely enough that a plain step is the better use of
  the target's forward.

MARGIN scales R (``ChainStop``'s ``margin``): above 1 it asks each position for more than
its price at the rate reached so far. Replayed (bench/history/RESULTS-until-2026-12-07.md, "Session 52"), 1.2 and
1.0 each beat the best fixed γ on both mixed sets of every recording; on the demo's six
scenes alone 1.2 fell 3.2% under the best fixed γ in one recording, 1.0 matched it in both
(the demo's draft is underconfident on its scenes: proposals it gave 0.3-0.5 were kept
47% of the time), so the rule is Dinkelbach's as it stands.

Lossless: where a chain stops depends only on the proposals drawn before (whether x_{i+1}
is drawn is decided from x_1..x_i: a stopping time of the draft), and every proposal
verified is judged exactly as in a chain of that length (verify.py). The prefix ``keep``
verifies is the rule's at T = 0 only, where verification emits the target's argmax
whatever it is shown; at T > 0 the chain drafter verifies every proposal it drew: leaving
x_j out for its own q(x_j) would bias the law of the x_j it verifies (chain.py says by how
much). (Until session 55 it verified ``keep``'s prefix at T > 0 too: a chi-square over
four tokens rejected that at p ≈ 1e-18; over three, the test then used, it passed.)
"""

from __future__ import annotations

MARGIN = 1.0


class ChainStop:
    """One round's stopping rule for a chain of at most ``budget`` proposals: ``more``
    after each position drafted, ``keep`` once drafting stopped. ``rate``: R, tokens a
    second; ``rates``: h_1..h_budget; ``step``: ΔD_i + ΔV_i for i = 1..budget − 1 (index
    i − 1); ``price``: V'(L) for L = 0..budget, seconds."""

    def __init__(self, rate: float, rates: list[float], step: list[float],
                 price: list[float], margin: float = MARGIN) -> None:
        self.rate = margin * rate
        self.rates = rates
        self.step = step
        self.price = price

    @classmethod
    def build(cls, costs, rate: float, rates: list[float], budget: int,
              plain_s: float) -> "ChainStop | None":
        """From a ``RoundCosts`` (draft_s, verify_s), or None while its lines are unknown."""
        draft = [costs.draft_s(i) for i in range(1, budget + 1)]
        verify = [costs.verify_s(n) for n in range(2, budget + 2)]
        if any(x is None for x in draft + verify):
            return None
        # verifying k + 1 tokens never costs less than a plain step (as AutoGamma.best)
        verify = [max(v, plain_s) for v in verify]
        step = [draft[i] - draft[i - 1] + verify[i] - verify[i - 1] for i in range(1, budget)]
        return cls(rate, rates, step, [plain_s] + verify)

    def more(self, drafted: int, survival: float) -> bool:
        """Whether to draft position ``drafted`` + 1, the chain's survival S_drafted."""
        if drafted >= len(self.price) - 1:
            return False
        h = self.rates[drafted] if drafted < len(self.rates) else self.rates[-1]
        return survival * h >= self.rate * self.step[drafted - 1]

    def keep(self, survivals: list[float]) -> int:
        """The prefix L of the proposals drafted (S_1..S_n given) with the largest W(L)
        (at T = 0 only: the module's docstring)."""
        best, best_value, expected = 0, -self.rate * self.price[0], 0.0
        for length, survival in enumerate(survivals, start=1):
            expected += survival
            value = expected - self.rate * self.price[length]
            if value > best_value:
                best, best_value = length, value
        return best
