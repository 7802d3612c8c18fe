"""The drafter protocol: what the engines ask of a drafting method, what they get back, and
the one place a verified round is recorded (``commit``).

A round, for one request or every row of a batch (engine.py ``SpeculativeEngine.step``),
reads top to bottom there:

1. the drafter proposes: a ``Proposal`` of at most n tokens, a chain (``Draft``) or a tree
   (tree.DraftTree). A proposal is data: its tokens, and (``target_feed``) how the target
   reads them: ids, explicit positions and a visibility mask where the shape needs them;
2. the engine runs the one target forward over the pending token and the proposals;
3. ``Proposal.judge`` hands the target's logits to verify.py, the one place acceptance is
   decided, and returns a ``Verdict`` (accepted tokens, the token the target adds, the
   verified logits; a tree's accepted path);
4. ``commit`` records the verdict: target cache rolled back to the accepted prefix, tokens
   appended, the drafter told (``accept(state, verdict)``), the stats counted, the request
   ended at EOS or its token limit.

Every hook the engine calls is declared on ``Drafter`` with a default, for a request
decoded alone and for the rows of a batch alike (``propose_rows``, ``admit``,
``end_round``), so a method overrides only what it uses; the engine never probes a drafter
for optional attributes. What a draft
model's cache has read of the committed tokens, and what to forget after a round, is one
helper for every drafter that keeps a cache of its own (``DraftCursor``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmspec_cli.runtime.adapters.base import cache_length, keep_branch, truncate_cache
from vlmspec_cli.runtime.request import DecodeState, TargetFeatures
from vlmspec_cli.runtime.round.verify import Relaxation, SamplingParams, verify_chain


@dataclass
class Verdict:
    """The outcome of verifying one proposal."""

    accepted: list[int]            # the accepted proposals' tokens, in order
    token: int                     # the token the target adds after them
    logits: torch.Tensor           # target logits at the verified positions (Drafter.accept)
    drafted: int                   # proposals verified
    positions: int | None = None   # how deep the proposals reach (a tree's depth)
    rejected: int = 0              # chain: trailing proposals the target cache must forget
    # tree: the target cache's (prefix, slots) to keep: the prefix, then those slots
    keep: tuple[int, list[int]] | None = None
    path: list[int] | None = None  # tree: the accepted nodes, root to leaf (None: a chain)

    @property
    def depth(self) -> int:
        """Positions deep the verified proposals reach: a chain's length, a tree's depth
        (``drafted`` counts a tree's nodes)."""
        return self.drafted if self.positions is None else self.positions

    def roll_back(self, state: DecodeState) -> None:
        """Cut the request's target cache back to the prompt, the committed tokens and the
        accepted proposals (and the target's hidden-state rows read from this round's
        forward, for a drafter that reads them, to the same rows)."""
        if self.keep is None:
            truncate_cache(state.target_cache, cache_length(state.target_cache) - self.rejected)
            return
        prefix, slots = self.keep
        keep_branch(state.target_cache, prefix, slots)
        f = state.features
        if f is not None and f.ids is None:
            rows = list(range(prefix - f.start)) + [s - f.start for s in slots]
            state.features = TargetFeatures(f.hidden[rows], f.start)

    def batch_drop(self, state: DecodeState) -> int | list[bool]:
        """A row of a batch, whose target cache is the batch's one (rolled back for every
        row at once, ``RaggedCache.rollback``): what it forgets of this round's feed. A
        chain: its last ``rejected`` tokens; a tree: a keep mask over the fed slots (the
        lead tokens and the accepted path's nodes stay where they are, ``keep`` naming
        them within the feed), with the row's target states read from the forward cut to
        the same rows, as ``roll_back`` does alone."""
        if self.keep is None:
            return self.rejected
        lead, slots = self.keep        # within the round's feed (a row's own past is 0)
        kept = set(range(lead)) | set(slots)
        mask = [i in kept for i in range(lead + self.drafted)]
        f = state.features
        if f is not None and f.ids is None and len(f.hidden) == len(mask):
            state.features = TargetFeatures(f.hidden[[i for i, k in enumerate(mask) if k]],
                                            f.start)
        return mask


@dataclass
class TargetFeed:
    """How the target reads a proposal in its one verification forward: ``ids`` = the
    pending token(s) then the proposals; ``positions`` (len(ids),) and ``allowed``
    (len(ids), past + len(ids)) bool visibility where the proposal is not a plain
    continuation of the cache (a tree); None: the cache's next positions, causal."""

    ids: list[int]
    positions: torch.Tensor | None = None
    allowed: torch.Tensor | None = None


class Proposal:
    """What ``Drafter.propose`` returns: a chain (``Draft``) or a tree (tree.DraftTree).
    ``dropped`` and ``stopped``: a chain its draft's confidence ended within the round
    (draft_stop.py) says so; no other proposal is ended that way."""

    dropped: float | None = None   # the confidence in the first position drafted, not proposed
    stopped: bool = False          # ended short of the length asked for

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def levels(self) -> int:
        """Draft positions deep (a chain's length; a tree's depth): the drafting steps it
        took, for the auto draft length's cost model."""
        return len(self)

    def cut_at(self, eos_ids: set[int]) -> "Proposal":
        """The proposal without anything after an EOS (a tree never grows past one)."""
        return self

    def target_feed(self, state: DecodeState) -> TargetFeed:
        """The target forward that verifies it (after the target cache)."""
        raise NotImplementedError

    def judge(self, state: DecodeState, out: torch.Tensor | None, sampling: SamplingParams,
              relax: Relaxation | None = None) -> Verdict:
        """Given ``out``, the target's logits (m, V) for ``target_feed``'s ids (None when
        nothing was fed), let verify.py decide which proposals stay."""
        raise NotImplementedError


@dataclass
class Draft(Proposal):
    """A chain of proposed tokens and the draft distributions q they were drawn from
    (``probs``: (n, V); None at temperature 0, where only the tokens matter)."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    # the positions drafted, when not its length (a chain its draft's confidence ended, or
    # one cut at an EOS); ``dropped`` and ``stopped`` as on Proposal
    steps: int | None = None
    dropped: float | None = None
    stopped: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def levels(self) -> int:
        return len(self) if self.steps is None else self.steps

    def cut_at(self, eos_ids: set[int]) -> "Draft":
        """The proposals before the first EOS. An EOS proposal is never verified: nothing
        can follow it, and a chain that stops early is still verified exactly (its length
        depends only on the draft's samples). A cut chain keeps its drafting steps
        (``levels``) and whether it stopped short; the confidence it ``dropped`` belongs to
        a position past the cut, so it is not kept."""
        for i, t in enumerate(self.tokens):
            if t in eos_ids:
                return Draft(self.tokens[:i], None if self.probs is None else self.probs[:i],
                             steps=self.levels, stopped=self.stopped)
        return self

    def target_feed(self, state: DecodeState) -> TargetFeed:
        """pending, x_1..x_n at the cache's next positions: p_1..p_{n+1} in one forward."""
        return TargetFeed(state.target_pending + self.tokens)

    def judge(self, state: DecodeState, out: torch.Tensor | None, sampling: SamplingParams,
              relax: Relaxation | None = None) -> Verdict:
        """Accept x_1..x_k (verify_chain) given ``out``, the target's logits (m, V) for the
        fed pending token and proposals (None or empty when nothing was fed)."""
        rows = [] if state.target_next_logits is None else [state.target_next_logits[None]]
        if out is not None and len(out):
            # the pending token's row is p_1; without one, p_1 is target_next_logits
            rows.append(out[len(state.target_pending) - 1 if state.target_pending else 0:])
        # (one source, as in every round after the first: no copy)
        target_logits = (rows[0] if len(rows) == 1 else torch.cat(rows, dim=0))[: len(self) + 1]
        n, tok = verify_chain(self.tokens, self.probs, target_logits, sampling,
                              state.target_generator)
        return Verdict(self.tokens[:n], tok, target_logits, drafted=len(self),
                       rejected=len(self) - n)


@dataclass
class DraftCursor:
    """What a draft model's own cache has read, for drafters that keep one: ``covered``
    committed tokens (after its prompt), plus ``fed`` of this round's proposals. A round
    feeds the draft the committed tokens it has not read (``unseen``: last round's target
    token, and x_n after a fully accepted chain), then proposals; after verification the
    cache keeps the accepted ones it fed and forgets the rest (``settle``)."""

    covered: int = 0
    fed: int = 0

    def unseen(self, tokens: list[int]) -> list[int]:
        return tokens[self.covered:]

    def read(self, tokens: list[int]) -> None:
        """Every committed token is now in the draft's cache."""
        self.covered = len(tokens)

    def settle(self, n_accepted: int) -> int:
        """After a round that accepted ``n_accepted`` proposals: the fed ones kept become
        covered; returns how many fed entries the cache must drop."""
        keep = min(n_accepted, self.fed)
        drop = self.fed - keep
        self.covered += keep
        self.fed = 0
        return drop


def commit(state: DecodeState, verdict: Verdict, drafter: "Drafter",
           eos_ids: set[int], target_drops: list[int] | None = None) -> None:
    """Record one verified round: the target cache keeps the accepted prefix, the accepted
    tokens and the target's own token are appended (that token becomes ``pending``: the
    target has not run it yet), the drafter rolls its own state back (``accept``), the
    stats count the round, and the request ends at EOS or at its token limit.

    ``target_drops``: a batch's rows share one ragged cache, rolled back for every row at
    once after the round; what the row forgets of its feed is appended there (a chain's
    number of rejected proposals, a tree's keep mask: ``Verdict.batch_drop``)."""
    if target_drops is None:
        verdict.roll_back(state)
    else:
        target_drops.append(verdict.batch_drop(state))
    state.target_pending = [verdict.token]
    state.target_next_logits = None
    state.tokens.extend(verdict.accepted)
    state.tokens.append(verdict.token)
    n = len(verdict.accepted)
    if not state.draft_deferred:   # a drafter not prefilled yet has nothing to roll back
        drafter.accept(state, verdict)
    state.stats.record_round(verdict.drafted, n, n + 1, positions=verdict.positions)
    if verdict.token in eos_ids or len(state.tokens) >= state.request.max_new_tokens:
        state.done = True


class Drafter:
    """A drafting method, one request at a time (SpeculativeEngine). The defaults draft
    nothing: the engine then decodes with the target alone."""

    name = "drafter"
    lossless = True             # False when the method changes the target it verifies against
    runs_target = False         # self-speculation: prefill and extend_target run the target
    # the target layer whose hidden states it reads (transformers' hidden_states index), or
    # a tuple of them read concatenated (EAGLE-3's low, mid and high layers)
    hidden_layer: int | tuple[int, ...] | None = None
    # its prefill reads only the request (a head: the target's states, the prompt's and
    # the plain rounds' kept until then, TargetFeatures.later), and propose catches up on
    # every committed token it has not read: with drafting.length auto the round policy
    # prefills it at the request's first drafted round (if any) instead of with the target
    late_prefill = False
    # it may end a chain within the round by its confidence (``state.draft_stop``,
    # draft_stop.py): with drafting.length auto the round policy builds that rule for it only
    reads_confidence = False

    def prepare(self, state: DecodeState) -> None:
        """Before the target's prefill: start work that can overlap it (e.g. captioning)."""

    def prefill(self, state: DecodeState) -> None:
        """After the target's prefill: build the drafter's own state for the request
        (``state.drafter_state``). With ``runs_target`` this also prefills the target
        (``state.target_cache`` and ``state.target_next_logits``); with ``hidden_layer``
        the prompt's hidden states are on ``state.features``."""
        state.drafter_state = None

    def propose(self, state: DecodeState, max_tokens: int) -> Proposal:
        """Propose at most ``max_tokens`` tokens continuing ``state.tokens``."""
        return Draft([])

    def feed_size(self, k: int) -> int:
        """The tokens a round drafting ``k`` positions deep feeds the target: the pending
        token and k proposals for a chain (a tree: its nodes up to depth k); the auto draft
        length's cost model (draft_length.py) prices verification by it."""
        return k + 1

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        """The round's ``verdict`` is committed (``state.tokens`` is extended and the target
        cache cut back): roll the drafter's own state back to match. ``verdict.accepted``:
        the kept proposals; ``verdict.logits``: the target's logits at the verified
        positions; ``verdict.path``: a tree's accepted nodes."""

    def finish(self, state: DecodeState) -> None:
        """After the last round: copy what the record reports to ``state.stats``."""

    def position_readers(self, profile) -> list[tuple[str, object]]:
        """(role, model) of the models besides the target that read the target's positions,
        so a request must fit theirs too (runtime.limits). None by default."""
        return []

    def extend_target(self, state: DecodeState, ids: torch.Tensor) -> torch.Tensor:
        """``runs_target`` drafters: the target's logits (1, n, V) for ``ids`` after its
        cache, replacing the engine's own forward."""
        raise NotImplementedError(f"method '{self.name}' does not run the target")

    # -- the rows of a batch (generation.batch_size > 1: methods that declare ``batches``)
    def check_batch(self) -> None:
        """Raise ValueError (the user's message) when this drafter, as built, cannot draft
        the rows of a batch although its method batches (e.g. a draft of another
        tokenizer)."""

    def propose_rows(self, states: list[DecodeState], budgets: list[int]) -> list[Proposal]:
        """At most ``budgets[b]`` proposals for row b of the round (one row: a request
        decoded alone). A method that drafts rows together overrides this."""
        return [self.propose(st, n) if n > 0 else Draft([]) for st, n in zip(states, budgets)]

    def start_batch(self, sampling: SamplingParams, eos_ids: set[int]) -> None:
        """A new batch, no rows yet (its rows share the drafter's batch state)."""

    def admit(self, state: DecodeState) -> None:
        """Prefill a request (its target already prefilled alone) as the batch's last row."""
        self.prefill(state)

    def discard_partial(self, n_rows: int) -> None:
        """A request failed halfway through admission: keep only the first ``n_rows`` rows."""

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows go on (finished requests leave the batch)."""

    def end_round(self, states: list[DecodeState]) -> None:
        """After every row's ``accept``: roll state the rows share back at once."""
