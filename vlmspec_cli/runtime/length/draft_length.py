"""``drafting.length: auto``: the draft length γ chosen each round, and drafting switched
off while it does not pay (issue 34: never slower, on any machine).

Eq. 1' online. A round that drafts k tokens emits on average

    E(k) = 1 + S_1 + … + S_k,   S_i = h_1 ⋯ h_i

tokens (h_i: the chance that proposal i is kept given that the ones before it were; with
one rate α everywhere, E(k) = (1 − α^{k+1}) / (1 − α)), and costs C(k) = D(k) + V(k + 1):
D(k) the drafting of k positions, V(n) the target verifying n fed tokens (the pending one
and the proposals) with the round's bookkeeping. A plain target step emits 1 token and
costs V(1). Each round drafts the k in 1..budget (budget ≤ the ceiling, ``drafting.gamma``)
with the most tokens per unit time, E(k) / C(k) (the longest of those within TIE, 2%, of
the best: near its optimum the rate is flat). When even the best is below a plain step's,
1 / V(1) by STAY (5%: the round's expected gain is below 1.05), drafting goes off: plain target steps,
and one round of one proposal (a probe) after ``probe_after`` of them, then twice as many
after each probe that did not pay (exponential backoff, up to ``max_backoff``; or more, so
that probes take at most PROBE_SHARE, 1%, of the plain rounds' time: a probe in a new
request prefills the draft then, and costs several plain steps; before a probe is timed,
its cost is the model's; a head's probe due within a new request comes at its first chosen
round, the wait it skipped carried to the next: ``_rejudge``); drafting
comes back when a round is expected to gain RESUME (15%) over a plain step, with the
acceptance taken DOUBT standard errors low (``doubted``: a probe kept by luck is one
round): on a busy machine a round's cost swings by that much, and a draft near the
break-even must not switch on and off with it. The off state and its backoff are the
process's (a new request starts where the last one left off), so a bad draft costs a
probe every few tens of tokens, not a few rounds per request.

- h_i: this request's rounds, per position and decayed per round (``decay``), with the
  process's earlier rounds as a prior worth ``prior_weight`` rounds at each position
  (``Acceptance``: a round that drafted k and kept n puts positions 1..min(n + 1, k) at
  risk and keeps 1..n).
- D and V: this process's own rounds (``round_costs.py``): decayed least-squares lines over
  the rounds' sizes, a plain step (one token fed) timed apart, D scaled down where the
  median of the last rounds is below it. A process's first WARMUP_ROUNDS rounds are not
  timed, and a round after plain ones (the draft caught up on them) only when its
  drafting came in under the line. While drafting is off, one plain step in PLAIN_SAMPLE
  is timed, the others only counted (``untimed``).
- Positions few rounds reached: shrunk towards the position before (``Acceptance.rates``),
  so the deep positions of a ceiling seldom drafted to are not taken as likely as the first.

Within the round, a chain drafter (a request alone) may end its chain before k by the
draft's confidence in each proposal (``stop_rule``, draft_stop.py), priced at the rate
this process decodes at (``rate``): k is then the most it may draft. A chain ended there
reports the confidence in the first proposal it drafted and did not verify, counted as
that position's chance of being kept (``Acceptance.observe``).

Lossless by construction: γ and the plain rounds are decided before the round, from
earlier rounds only; every emitted token is still the target's (verify.py), at T = 0
token for token and at T > 0 in distribution. A seed's sample at T > 0 can differ between
runs (the γ sequence follows timings), as it differs between two fixed γ.

A process's first request prefills its draft with the target, timed against it
(``note_prefill``): a draft whose prefill is the dearer (``AutoGamma.dear``) drafts one
proposal a round until a round is timed, and goes off after one timed round that does not
pay (others wait for MIN_TIMED). While a request's draft is not prefilled yet, each token
drafting would emit also pays a share of that prefill (``prefill_overhead``: the prefill
over the tokens the request has left), so a draft near the break-even does not pay a
prefill in every request for rounds that gain a few per cent; the best k is unchanged by
it. A draft known before running not to pay (draft_cost.py:
on a CPU, a float draft with the target's arithmetic per token) is ruled out
(``rule_out``): never prefilled, no round drafts, no probe.

The round policy (round_policy.AutoLength) asks ``choose`` before a round and reports
with ``observe``; the costs are an injectable object (``RoundCosts``, or a test's own), so tests can force the
switch. In a batch (SpeculativeEngine.run) each row has its own AutoGamma (round_policy.row_model):
its own acceptance and on/off state, the process's costs and prior; a row off decodes
plain in the round's one target forward.

Trees (methods tree, adt): k caps the tree's depth, D(k) is k draft levels, a round feeds
the target its nodes up to depth k (``feed_size(k)``, the drafter's, in place of k + 1)
and h_i is the chance the accepted path reaches depth i given it reached i − 1.
"""

from __future__ import annotations

import math
from typing import Callable

from vlmspec_cli.runtime.length.acceptance import Acceptance, LengthState, expected_tokens
from vlmspec_cli.runtime.length.draft_stop import ChainStop
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.length.round_costs import RoundCosts
from vlmspec_cli.runtime.stats import length_section

PROBE_AFTER = 4           # plain rounds before the first probe
MAX_BACKOFF = 64          # the most plain rounds between two probes
DECAY = 0.9               # per round, this request's acceptance counts
PROCESS_DECAY = 0.98      # per round, the process's (the prior of its next requests)
PRIOR_WEIGHT = 4.0        # the process's rates, in rounds at each position
WARMUP_ROUNDS = 1         # a process's first round pays one-time costs: not timed
TIE = 0.02                # lengths this close to the best rate count as equal: the longest
STAY = 0.05               # drafting stays on while a round is expected to gain this much
RESUME = 0.15             # once off, drafting resumes when a round is expected to gain this much
# probes take at most this share of the plain rounds' time. At 2% probes were most of a
# useless draft's drafted rounds (12-13 of 16-22 over three processes), each of them in a
# new request also prefilling the draft (half a plain step)
PROBE_SHARE = 0.01
MIN_TIMED = 3             # timed rounds before drafting may be switched off
DOUBT = 1.0               # once off, acceptance is taken this many standard errors low
RATE_DECAY = 0.97         # per round, the tokens and seconds the process's rate is over
# while drafting is off, one plain round in this many is observed (a plain step's time, the
# rate); the others are only counted (``untimed``). Observing each cost 9 µs of Python a
# round, and the target's forward after it ran slower by some µs more: a useless draft's
# plain rounds took 1.5-2.7% over target-only's on a 0.9 ms step (timed by hand, piece by
# piece; the A/B: bench/runs/2026-12-07/plain-rounds/)
PLAIN_SAMPLE = 8
REQUEST_DECAY = 0.8       # per request, the process's mean request length


def rounds_left(state: DecodeState) -> int:
    """The rounds a request has left, the coming one included, at one token a round (the
    last token has no round that drafts: the target adds it)."""
    return state.request.max_new_tokens - len(state.tokens) - 1


class AutoGamma:
    """The auto draft length of one engine: its costs, acceptance prior and on/off state
    are this process's. ``ceiling``: the most proposals a round may draft
    (``drafting.gamma``; a tree's depth). ``feed_size(k)``: the tokens a round k positions
    deep feeds the target (``Drafter.feed_size``; default k + 1, a chain's)."""

    def __init__(self, ceiling: int, costs=None, probe_after: int = PROBE_AFTER,
                 max_backoff: int = MAX_BACKOFF, decay: float = DECAY,
                 prior_weight: float = PRIOR_WEIGHT, process_decay: float = PROCESS_DECAY,
                 probe_share: float = PROBE_SHARE,
                 feed_size: Callable[[int], int] | None = None, doubt: float = DOUBT) -> None:
        if ceiling < 1:
            raise ValueError("the draft length's ceiling must be >= 1")
        self.ceiling = ceiling
        self.feed_size = feed_size or (lambda k: k + 1)   # a chain: pending + k proposals
        self.costs = costs if costs is not None else RoundCosts()
        self.rounds = 0                         # rounds this engine has decoded
        self.probe_after = max(1, probe_after)
        self.max_backoff = max(self.probe_after, max_backoff)
        self.probe_share = probe_share
        self.decay = decay
        self.prior_weight = prior_weight
        self.doubt = doubt
        self.seen = Acceptance(process_decay)   # this process's rounds: the requests' prior
        self.wait = 0                           # plain rounds left before the next probe
        self.carried = 0                        # of it, rounds a probe was brought forward by
        # a probe due within a new request comes at its start (``_rejudge``): the drafter
        # waits for its prefill with the target's states of every plain round kept for it
        self.probe_first = False
        self.backoff = self.probe_after         # plain rounds before the probe after it
        self.probe_due = False
        self.on = True                          # drafting was on at the last decision
        self.probing = False                    # the round being decoded is a probe
        self.probe_cost: float | None = None    # what a probe costs over a plain round
        self.prefill_ratio: float | None = None  # draft prefill ÷ target prefill, first request
        self.draft_prefill_s = 0.0              # the draft's last prefill
        self.round_prefill_s = 0.0              # the draft's prefill in the round being decoded
        self.ruled_out: str | None = None       # why drafting can never pay here (rule_out)
        self.tokens_w = self.seconds_w = 0.0    # decayed: the rounds' tokens and time (rate)
        self.request_tokens: float | None = None  # decayed: the tokens a request decodes
        self.plain_seen = 0                     # plain rounds while off (``untimed``)

    # -- the model ---------------------------------------------------------------------
    def rates(self, ls: LengthState) -> list[float]:
        """h_1..h_ceiling for this request: its own rounds, the process's as a prior."""
        prior = self.seen.rates(self.ceiling)
        return ls.acceptance.rates(self.ceiling, prior, self.prior_weight)

    def doubted(self, ls: LengthState, rates: list[float]) -> list[float]:
        """``rates`` taken ``doubt`` standard errors low, each over the rounds it rests on
        (this request's at risk there, plus the prior's weight): what resuming drafting
        is judged by. A bad draft's probe kept by luck (τ ≈ 1: one in twenty) made h_1
        0.3 from a prior of 0.1, and under load, where plain steps were timed slower than
        the drafted rounds before, that looked worth drafting again: the bad draft drafted 47
        of 114 rounds beside two competitors (0.85x, bench/runs/2026-11-26/load-default-s45.txt).
        One standard error is 0.2 there, and 0.02 for a good draft a few rounds in."""
        risk = ls.acceptance.risk
        out = []
        for i, h in enumerate(rates):
            n = (risk[i] if i < len(risk) else 0.0) + self.prior_weight
            out.append(max(h - self.doubt * math.sqrt(h * (1.0 - h) / n), 0.0))
        return out

    def best(self, rates: list[float], budget: int, cautious: bool = False,
             overhead: float = 0.0) -> tuple[int, float | None]:
        """(the k in 1..budget with the most tokens per second (the longest within TIE of
        it), the best gain over a plain step: (E(k)/C(k)) / (1/V(1))); gain None while the
        costs are unknown. ``cautious``: V(1) as ``RoundCosts.plain_s`` caps it.
        ``overhead``: seconds each token drafted rounds emit must also pay for (the
        draft's prefill still ahead in this request, ``prefill_overhead``): C(k) grows
        by overhead · E(k), which leaves the best k where it was (E / (C + cE) is largest
        where C / E is least) and lowers the gain."""
        v1 = self.costs.plain_s(cautious)
        if v1 is None:
            return budget, None
        rate = {}
        for k in range(1, budget + 1):
            draft = self.costs.draft_s(k)
            # verifying k + 1 fed tokens costs no less than a plain step's one: a line whose
            # slope comes out negative (its few rounds timed in calmer moments than the
            # plain steps, on a busy machine) prices a bad draft's round below a plain step,
            # a gain that can pass RESUME (the bad draft drafted 35 rounds of 352 beside two
            # competitors at 0.94x, against 10 idle: bench/runs/2026-11-27/load-end-s50a.txt)
            verify = max(self.costs.verify_s(self.feed_size(k)), v1)
            cost = verify + (draft if draft is not None else 0.1 * v1)
            tokens = expected_tokens(rates, k)
            rate[k] = tokens / max(cost + overhead * tokens, 1e-12)
        top = max(rate.values())
        # near the optimum tokens per second is flat: of the lengths within TIE of the best,
        # the longest (the deep positions' rates are the least observed, shrunk towards the
        # pooled rate, and a round cut short by a low guess cannot show they were higher)
        best_k = max(k for k, r in rate.items() if r >= (1.0 - TIE) * top)
        return best_k, top * v1

    @property
    def rate(self) -> float | None:
        """Tokens a second over this process's last rounds (decayed by RATE_DECAY), plain
        ones included, each round's time as the cost lines price it: R, what a position
        drafted must pay for (draft_stop.py)."""
        return self.tokens_w / self.seconds_w if self.seconds_w > 0 else None

    def stop_rule(self, state: DecodeState, k: int) -> ChainStop | None:
        """Where a chain of at most ``k`` proposals may stop by the draft's confidence
        (draft_stop.py); None before the process has a rate and costs to price it by."""
        if k < 1 or state.length is None:    # (a plain round: nothing to price, every round)
            return None
        rate, v1 = self.rate, self.costs.plain_s()
        if rate is None or v1 is None:
            return None
        return ChainStop.build(self.costs, rate, self.rates(state.length), k, v1)

    # -- the engine's side -------------------------------------------------------------
    def start(self, state: DecodeState) -> None:
        state.length = LengthState(Acceptance(self.decay))

    def rule_out(self, reason: str) -> None:
        """Drafting off for the process, no probe ever: the draft was known before running
        not to pay on this machine (draft_cost.py: a CPU, a float draft doing as many
        multiply-adds per token as the target). Its prefill never runs; ``reason`` goes to
        the records."""
        self.ruled_out = reason

    @property
    def measures_prefill(self) -> bool:
        """The request starting now should prefill its draft with the target, timed against
        it (``note_prefill``): the process's first, whose first round drafts anyway (no cost
        is known yet)."""
        return self.prefill_ratio is None and not self.off and self.costs.plain_s() is None

    def note_prefill(self, draft_s: float, target_s: float | None = None) -> None:
        """The draft's prefill took ``draft_s``; ``target_s``: the target's, of the same
        request under the same thread plan (the process's first request)."""
        self.draft_prefill_s = draft_s
        if target_s is None:                  # at a round's start (timed within its drafting)
            self.round_prefill_s = draft_s
        elif self.prefill_ratio is None:
            self.prefill_ratio = draft_s / max(target_s, 1e-9)

    @property
    def dear(self) -> bool:
        """The draft's prefill took longer than the target's over the same request: its
        forward is likely dearer than the target's (by hand, session 46: a 4-bit copy of
        the target on a CPU took twice the target's, the demo's one-layer draft a tenth).
        Such a draft's first rounds draft one proposal, and one timed round that does not
        pay switches it off (a second witness: not a stall alone, ``MIN_TIMED``): even
        with every proposal kept, a draft step dearer than a target step cannot pay."""
        return self.prefill_ratio is not None and self.prefill_ratio >= 1.0

    @property
    def unproven(self) -> bool:
        """Before MIN_TIMED rounds are timed (drafting cannot go off yet), this process's
        drafted rounds have kept nothing: its next rounds draft one proposal, the cheapest
        that still measure. The own-model walk's random pair drafted its ceiling (4) for
        the four rounds before it could go off, in a first request of 16 tokens
        (bench/runs/2026-12-07/useless-walk-cold-before.txt); a draft that keeps anything
        drafts as before."""
        return self.costs.timed < MIN_TIMED and bool(self.seen.risk) and not any(self.seen.kept)

    @property
    def off(self) -> bool:
        """Drafting is off: the next round decodes plain, or is the probe (which prefills a
        drafter that can wait, so its prefill is timed as part of the probe's cost)."""
        return self.ruled_out is not None or self.wait > 0 or self.probe_due

    def choose(self, state: DecodeState, budget: int) -> int:
        """The proposals this round drafts (0: a plain target step), at most ``budget``."""
        ls: LengthState = state.length
        new = ls.previous < 0 and self.off and self.ruled_out is None   # (judged again)
        left = rounds_left(state) if new else 0
        k = self._decide(ls, min(budget, self.ceiling), self.prefill_overhead(state), left)
        ls.count(k)
        return k

    def prefill_overhead(self, state: DecodeState) -> float:
        """While a request's draft is not prefilled yet (``state.draft_deferred``: the round
        policy prefills it at the first drafted round), drafting in this request costs that
        prefill too (the last one timed), spread over the tokens the request has left: its
        token budget, or fewer where this process's requests have been shorter (their
        decayed mean length, while this one has not outrun it). Once prefilled, that cost
        is sunk: 0. Without it a draft near the break-even would pay its prefill in every
        request it drafts in for rounds that gain a few per cent (the useless draft,
        drafting from a request's second token, agrees now and then: its rounds priced a
        few per cent over a plain step)."""
        if not state.draft_deferred or self.draft_prefill_s <= 0.0:
            return 0.0
        done = len(state.tokens)
        left = state.request.max_new_tokens - done
        if self.request_tokens is not None and self.request_tokens - done >= 1.0:
            left = min(left, self.request_tokens - done)
        return self.draft_prefill_s / max(left, 1.0)

    def _decide(self, ls: LengthState, budget: int, overhead: float = 0.0,
                left: int = 0) -> int:
        """``left``: the rounds this request has left, this one included."""
        if self.ruled_out is not None:       # known not to pay here: the target alone
            return 0
        if ls.previous < 0 and self.off:     # a new request while drafting is off
            self._rejudge(ls, budget, overhead, left)
        if self.wait > 0:                    # drafting is off: plain until the probe
            self.wait -= 1
            return 0
        # off, the gain that would turn drafting back on is judged cautiously
        rates = self.rates(ls)
        k, gain = self.best(rates if self.on else self.doubted(ls, rates), budget,
                            cautious=not self.on, overhead=overhead)
        if gain is None and self.dear:       # nothing timed yet, the draft likely dear:
            return 1                         # the cheapest round that measures it
        if self.unproven:                    # nothing kept yet, cannot go off yet:
            return 1                         # the cheapest round that still measures
        if self.probe_due:                   # draft once more, to see if it pays again:
            self.probe_due = False           # one proposal, the cheapest round that tells
            ls.probes += 1                   # whether the first position is kept now
            self.probing = True
            return 1
        # drafting stays on while a round is expected to gain STAY over a plain step; once
        # off, it comes back only at RESUME (a draft near the break-even gains nothing,
        # and a noisy estimate must not switch it every few rounds)
        # (not before MIN_TIMED rounds were timed: on a busy machine the first few rounds
        # of a process can take several times their cost, and one of them switched a good
        # draft off for the demo's first request; a draft whose prefill was dearer than the
        # target's needs one: ``dear``)
        if (gain is not None and gain < 1.0 + (STAY if self.on else RESUME)
                and self.costs.timed >= (1 if self.dear else MIN_TIMED)):
            self.on = False                  # does not pay: plain, probe later (and the
            self.wait = self._plain_rounds(rates[0]) - 1 + self.carried   # wait it skipped)
            self.carried = 0
            self.backoff = min(2 * self.backoff, self.max_backoff)
            self.probe_due = True
            return 0
        self.on, self.carried = True, 0
        self.backoff = self.probe_after
        # a round to measure verification at another size: only while k ≥ 2 pays (chains)
        return self.costs.explore(k, budget) if k >= 2 else k

    def _rejudge(self, ls: LengthState, budget: int, overhead: float = 0.0,
                 left: int = 0) -> None:
        """A new request starts while drafting is off: judged at once from the process's
        acceptance (at RESUME, costs taken cautiously; not doubted: it rests on all the
        process's rounds, not on one probe), it resumes without waiting for the probe when
        that pays; else the off state goes on as it was (its wait and backoff). One
        request the draft could not predict switched a good draft off, and the requests
        after it decoded 51 rounds plain before a probe turned it back on (the mixed set
        at 1.80x: bench/runs/2026-11-27/auto-gamma-ceiling-s46d.txt).

        With ``probe_first`` (a head, whose late prefill reads the target's states kept
        for it each plain round), a probe that would come within the request's ``left``
        rounds comes now, at its first chosen round, and the wait it skipped is added to the
        next one (probes keep their share): later in the request, its prefill would read
        every token decoded before it, and each plain round until then would keep the
        target's states for it; after a probe at the start that does not pay, the rest of
        the request decodes as target-only does (round_policy.plain_from_here). A chain's
        draft keeps nothing while it waits, and its probes, cheaper at a request's start,
        came more often (their measured cost sets the wait) and cost more in all: the useless
        LLaVA-1.5 chain read 0.978x of target-only with them against 0.995x without
        (bench/runs/2026-12-07/probe-first-ab/)."""
        if self.resumes(ls, budget, overhead):
            self.wait, self.probe_due, self.on, self.backoff = 0, False, True, self.probe_after
            self.carried = 0
        elif self.probe_first and self.probe_due and 0 < self.wait < left:
            self.carried, self.wait = self.carried + self.wait, 0

    def resumes(self, ls: LengthState, budget: int, overhead: float = 0.0) -> bool:
        """``_rejudge``'s test: a round is expected to gain RESUME, costs taken cautiously."""
        gain = self.best(self.rates(ls), budget, cautious=True, overhead=overhead)[1]
        return (gain or 0.0) >= 1.0 + RESUME

    def _plain_rounds(self, h1: float) -> int:
        """Plain rounds before the next probe: the backoff, or more while a probe costs
        more than ``probe_share`` of them (a probe that lands in a new request prefills the
        draft, and catches it up on the tokens decoded without it). Before any probe was
        timed, its cost is the model's: D(1) + V(its feed: 2 for a chain) over the 1 + h_1
        tokens it emits at V(1) each, and the draft's prefill (the last one timed: the probe
        is taken to land in a new request) (a draft whose step is dearer than the target's,
        e.g. a 4-bit copy of the target on a CPU, must not be probed every few rounds until
        a probe is timed)."""
        v1 = self.costs.plain_s()
        if not v1:
            return self.backoff
        cost = self.probe_cost
        if cost is None:
            draft, verify = self.costs.draft_s(1), self.costs.verify_s(self.feed_size(1))
            if draft is None or verify is None:
                return self.backoff
            cost = max(draft + verify - v1 * (1 + h1), 0.0) + self.draft_prefill_s
        return max(self.backoff, math.ceil(cost / (self.probe_share * v1)))

    def untimed(self, state: DecodeState, k: int) -> bool:
        """A plain round while drafting is off, once the costs are known, goes unobserved
        but for one in PLAIN_SAMPLE: it is counted, and ``observe`` is not called."""
        if k or self.on or self.probing or self.costs.timed < MIN_TIMED:
            return False
        self.plain_seen += 1
        if self.plain_seen % PLAIN_SAMPLE == 0:
            return False
        self.rounds += 1
        state.length.previous = 0
        return True

    def observe(self, state: DecodeState, k: int, *, levels: int, fed: int, drafted: int,
                accepted: int, draft_s: float, verify_s: float,
                dropped: float | None = None, stopped: bool = False) -> None:
        """A round that chose ``k`` drafted ``levels`` positions in ``draft_s``, and fed the
        target ``fed`` tokens (``drafted`` proposals verified, after an EOS cut; ``accepted``
        kept), verified and committed in ``verify_s``. A round that fed nothing (the first
        token comes from the prefill) times no target forward. ``dropped``: the draft's
        confidence in the first proposal it drafted and did not verify (its chain ended by
        ``stop_rule``), else None; ``stopped``: the chain ended short of k that way."""
        ls: LengthState = state.length
        prefill, self.round_prefill_s = self.round_prefill_s, 0.0   # this round's, if any
        own = draft_s - prefill
        # after plain rounds the draft first caught up on them (and a new request's first
        # drafted round prefilled it): such a round is timed only when its own drafting came
        # in under the line, which it can then only pull down. Otherwise a line that one
        # stall pushed up was never measured again once drafting went off (a probe follows
        # plain rounds): one 0.3 s stall in an early round kept a good draft off for good
        clean = ls.previous > 0 and not prefill
        if not clean and levels > 0:
            line = self.costs.draft_s(levels)
            clean = line is not None and own <= line
        self.rounds += 1
        if fed > 0 and self.rounds > WARMUP_ROUNDS:
            self.costs.observe(levels, own if clean else None, fed, verify_s)
        ls.previous = k
        v1 = self.costs.plain_s()    # (once a round: _priced reads it too)
        if self.probing and v1 is not None:   # its time over the plain rounds it stood for
            extra = max(draft_s + verify_s - v1 * (1 + accepted), 0.0)
            self.probe_cost = extra if self.probe_cost is None else (self.probe_cost + extra) / 2
        self.probing = False
        spent = self._priced(levels, fed, v1)
        if spent is not None:
            self.tokens_w = RATE_DECAY * self.tokens_w + accepted + 1
            self.seconds_w = RATE_DECAY * self.seconds_w + spent
        ls.stopped += stopped
        if drafted > 0 or dropped is not None:
            ls.acceptance.observe(drafted, accepted, dropped)
            self.seen.observe(drafted, accepted, dropped)

    def _priced(self, levels: int, fed: int, v1: float | None) -> float | None:
        """A round's time as the cost lines put it (the rate's: as smooth as the lines, a
        stall as in them; ``v1``: a plain step's); None: it fed nothing or is not priced."""
        draft = self.costs.draft_s(levels) if levels > 0 else 0.0
        verify = v1 if fed == 1 else self.costs.verify_s(fed)
        return None if fed < 1 or draft is None or verify is None else draft + verify

    def finish(self, state: DecodeState) -> None:
        """The request's record: what its rounds chose (``stats.draft_length``)."""
        ls: LengthState | None = state.length
        n = len(state.tokens)
        if n:   # the tokens a request decodes, decayed (prefill_overhead spreads it over)
            last = n if self.request_tokens is None else self.request_tokens
            self.request_tokens = REQUEST_DECAY * last + (1 - REQUEST_DECAY) * n
        if ls is not None:
            state.stats.draft_length = length_section(self.ceiling, ls.hist, ls.probes,
                                                      [round(h, 3) for h in self.rates(ls)],
                                                      self.ruled_out, ls.stopped)
