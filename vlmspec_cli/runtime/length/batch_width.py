"""One width for a batch's round: the rows' own lengths capped where the batch gains most.

In a batch every row's round shares one draft forward per position and one target forward
as wide as the widest row's feed (runtime/fast/ragged.py). Each row's length model
(round_policy.row_model) picks the k with the most tokens per second *for that row* at the
batch's costs, so the widest row sets the round's cost for all: one row that accepts
well drafts 12 and every row pays a 13-wide forward and 12 draft steps while the others
keep 2 or 3 tokens of it. Per-row auto at ≤ 12 made 1.03-1.07x target-only batched
where a fixed γ = 5 made 1.23x (bench/runs/2026-12-07/scale-folder-auto-length-3.txt).

So the batch's width K is chosen jointly: the K in 1..max(k_i) with the most tokens per
second over the whole batch,

    rate(K) = Σ_i E_i(min(k_i, K)) / (D(K) + V(feed(K))),

E_i(k) = 1 + S_1 + … + S_k from row i's acceptance rates (a plain row: 1), D and V the
batch round's timed costs (round_policy._observe_batch times them at the widest row),
and each row drafts min(k_i, K). The longest K within TIE of the best is kept (as
AutoGamma.best does for one row). Until the batch's verification slope is told, a round
at another width measures it (a flat guess would price 13 tokens a row like 2). Lossless: K is decided from earlier rounds only, and
every token is still the target's (verify.py).
"""

from __future__ import annotations

from vlmspec_cli.runtime.length.acceptance import expected_tokens
from vlmspec_cli.runtime.length.draft_length import TIE, AutoGamma
from vlmspec_cli.runtime.length.round_costs import BATCH_EXPLORE_AFTER
from vlmspec_cli.runtime.request import DecodeState


def batch_width(states: list[DecodeState], ks: list[int], auto: AutoGamma) -> int | None:
    """The joint width K for a batch's round (None: keep every row's own k: one row, no
    more than one proposal anywhere, or the costs not timed yet)."""
    top = max(ks, default=0)
    if len(states) < 2 or top <= 1:
        return None
    costs = auto.costs
    v1 = costs.plain_s()
    if v1 is None:
        return None
    # V's slope not told yet: a round at another width measures it (RoundCosts.explore),
    # after BATCH_EXPLORE_AFTER batch rounds rather than a request's EXPLORE_AFTER: taken
    # flat, every width looks as cheap as one token and every row drafts its longest
    probe = costs.explore(top, top, BATCH_EXPLORE_AFTER)
    if probe != top:
        return probe
    rows = [(state.length.model or auto).rates(state.length) if k > 0 else None
            for state, k in zip(states, ks)]
    rate = {}
    for width in range(1, top + 1):
        draft = costs.draft_s(width)
        verify = max(costs.verify_s(auto.feed_size(width)), v1)
        cost = verify + (draft if draft is not None else 0.1 * v1)
        tokens = sum(expected_tokens(r, min(k, width)) if r is not None else 1.0
                     for r, k in zip(rows, ks))
        rate[width] = tokens / max(cost, 1e-12)
    best = max(rate.values())
    return max(w for w, r in rate.items() if r >= (1.0 - TIE) * best)


def cap_rows(states: list[DecodeState], ks: list[int], width: int | None) -> list[int]:
    """Each row's k capped at ``width``, its length histogram counting what it drafts."""
    if width is None:
        return ks
    out = []
    for state, k in zip(states, ks):
        if k > width:
            state.length.hist[k] -= 1
            state.length.count(width)
            k = width
        out.append(k)
    return out
