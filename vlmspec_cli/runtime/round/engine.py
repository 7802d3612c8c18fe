"""The draft → verify → accept loop. Acceptance itself is decided in ``verify.py``.

One round, for a request whose target cache holds the prompt and the committed tokens
except ``pending`` (the token the target added last round, not yet run through it):

1. the drafter proposes up to γ tokens x_1..x_n (never past max_new_tokens; a chain is cut
   at EOS), as a chain or a tree: data (draft.py ``Proposal``), with q_1..q_n at T > 0;
2. the engine runs one target forward over pending + x_1..x_n (``Proposal.target_feed``:
   ids, and for a tree explicit positions and a visibility mask), giving p_1..p_{n+1};
3. ``Proposal.judge`` hands p and q to verify.py: ``verify_chain`` / ``verify_tree`` accept
   x_1..x_k (x_i with probability min(1, p_i(x_i) / q_i(x_i)); at T = 0 while x_i is
   argmax p_i) and add one token of the target's: from p_{k+1} after a full acceptance, or
   from the residual norm(max(0, p_{k+1} − q_{k+1})) after a rejection;
4. ``commit`` rolls the target cache back to the accepted prefix and tells the drafter the
   ``Verdict``, so it rolls its own state back.

All four are ``SpeculativeEngine.step``, on one screen. Each round emits accepted + 1
tokens, so new_tokens = num_accepted_tokens + num_drafts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.round.draft import Draft, Drafter, TargetFeed, commit
from vlmspec_cli.runtime.models.loading import LoadedModel
from vlmspec_cli.runtime.fast.ragged import RaggedCache
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.request import DecodeState, Request, TargetFeatures, make_generators
from vlmspec_cli.runtime.round.round_policy import FixedLength, RoundRecord
from vlmspec_cli.runtime.threads import ThreadPlan
from vlmspec_cli.runtime.round.tree import attention_for
from vlmspec_cli.runtime.fast.trunk import SegmentedCache
from vlmspec_cli.runtime.round.verify import Relaxation, SamplingParams


@dataclass
class Result:
    tokens: list[int]
    text: str
    state: DecodeState


ProgressFn = Callable[[DecodeState], None]


class SpeculativeEngine:
    def __init__(self, target: LoadedModel, drafter: Drafter | None, gamma: int,
                 sampling: SamplingParams, batch_size: int = 1) -> None:
        """``drafter``: None decodes with the target alone; ``batch_size``: rows ``run``
        decodes together (one request at a time: ``generate``)."""
        if gamma < 1:
            raise ValueError("gamma must be >= 1")
        if batch_size < 1:
            raise ValueError("batch size must be >= 1")
        drafter = drafter if drafter is not None else Drafter()
        self.target = target
        self.batch_size = batch_size
        # the rows of the batch ``run`` decodes share one ragged target cache; None: a
        # request decodes alone, in its own cache
        self.rows: RaggedCache | None = None
        self.drafter = drafter
        self.gamma = gamma
        self.sampling = sampling
        # self-speculative drafters (twig) run the target's forwards themselves, reusing
        # the layers they share with it: prefill(state) and extend_target(state, ids)
        self.runs_target = drafter.runs_target
        self.eos_ids = eos_token_ids(target)
        # hidden-state drafters (HiViS/Sparrow) read this layer of the target's forwards
        # (EAGLE-3: a tuple of layers, concatenated)
        self.hidden_layer = None if self.runs_target else drafter.hidden_layer
        # LANTERN relaxed acceptance of tree nodes (verify.Relaxation; lossy, opt-in)
        self.relax: Relaxation | None = None
        # CPU threads for the prefill and for the rounds (runtime/threads.py); none: as set
        self.threads = ThreadPlan()
        # the round policy (round_policy.py): how many proposals a round drafts per row
        # (drafting.length fixed: its budget, up to ``gamma``; auto: chosen per round and
        # per row, and plain target steps while drafting does not pay) and when the
        # drafter is prefilled
        self.use_policy(FixedLength())

    # -- one request -----------------------------------------------------------------
    def use_policy(self, policy: FixedLength) -> None:
        """The round policy (round_policy.py): k per row each round, and when the drafter
        is prefilled."""
        policy.bind(self.drafter, self._prefill_draft)
        self.policy = policy

    def start(self, request: Request) -> DecodeState:
        """Prefill target and drafter; the target's prefill logits give the first token's
        distribution (kept as ``target_next_logits``, consumed by the first round)."""
        self.threads.enter("prefill")
        state = self._prefill(request)
        # the rounds that follow (a long prompt's at the prefill's count)
        self.threads.enter("decode", cache_length(state.target_cache))
        return state

    def _new_state(self, request: Request) -> DecodeState:
        """A request's decoding state: its prompt as the target's template renders it, and
        its target and draft generators."""
        lm = self.target
        state = DecodeState(request=request, prompt=lm.adapter.prompt_text(lm, request.messages))
        state.target_generator, state.draft_generator = make_generators(request.seed)
        return state

    def _result(self, state: DecodeState, started: float) -> Result:
        state.stats.wall_s = time.perf_counter() - started
        return Result(list(state.tokens), decode_text(self.target, state.tokens, self.eos_ids),
                      state)

    def _prefill(self, request: Request) -> DecodeState:
        """The request's prefill: the target's, and the drafter's when the policy says."""
        state = self._new_state(request)
        t0 = time.perf_counter()
        self.policy.prefill(state, lambda: self._prefill_target(state))
        state.stats.prefill_s = time.perf_counter() - t0
        return state

    def _prefill_target(self, state: DecodeState) -> None:
        """The target's prefill over the request's prompt and media: its cache, the first
        token's logits and, for a hidden-state drafter, the prompt's features."""
        if self.runs_target:
            # a self-speculative drafter shares layers with the target and runs its
            # prefill itself (setting target_cache and target_next_logits) with its own
            self.drafter.prefill(state)
            return
        lm, request = self.target, state.request
        videos = {"videos": request.videos} if request.videos else {}
        inputs = lm.adapter.encode(lm, state.prompt, request.images or None, **videos)
        state.target_cache = lm.adapter.new_cache(lm)
        if self.hidden_layer is None or state.plain_throughout:
            state.target_next_logits = lm.adapter.prefill(lm, inputs, state.target_cache)[0]
            return
        logits, hidden = lm.adapter.prefill_hidden(lm, inputs, state.target_cache,
                                                   self.hidden_layer)
        ids = inputs["input_ids"][0]
        state.target_next_logits = logits[0]
        pos = inputs.get("position_ids")     # (3, 1, L): M-RoPE families
        state.features = TargetFeatures(hidden[0], 0, ids, lm.adapter.visual_mask(lm, ids),
                                        None if pos is None or pos.dim() != 3 else pos[:, 0])

    def _prefill_draft(self, state: DecodeState, late: bool) -> float:
        """Prefill the drafter for ``state`` (the round policy decides when); seconds taken.
        ``late``: the rounds have begun, so this one forward over the prompt's rows runs at
        the prefill's thread count, not the rounds' (a late prefill at one thread was the
        larger part of a useless draft's probes)."""
        if self.runs_target:   # prefilled with the target (``_prefill_target``)
            return 0.0
        if late:
            self.threads.enter("prefill")
        t0 = time.perf_counter()
        self.drafter.prefill(state)
        seconds = time.perf_counter() - t0
        if late:
            self.threads.enter("decode", cache_length(state.target_cache))
        return seconds

    def step(self, state: DecodeState) -> None:
        """One round for a request decoded alone."""
        self.step_rows([state])

    def step_rows(self, states: list[DecodeState]) -> None:
        """One draft → verify → accept round for every row: a request decoded alone, or the
        rows of a batch (``run``). The module's docstring states the maths."""
        # at most remaining - 1 proposals a row: the target always adds one token of its own
        budgets = [min(self.gamma, st.request.max_new_tokens - len(st.tokens) - 1) for st in states]
        t0 = time.perf_counter()
        ks = self.policy.plan(states, budgets)    # k_b ≤ budget_b per row (0: a plain step)
        # 1. the drafter proposes x_1..x_n (n ≤ k) per row, a chain or a tree, as data;
        #    nothing follows an EOS
        drafted = self.drafter.propose_rows(states, ks) if any(ks) else [Draft([]) for _ in states]
        proposals = [p.cut_at(self.eos_ids) for p in drafted]
        t1 = time.perf_counter()
        # 2. one target forward over every row's pending token and proposals, at the
        #    positions and with the visibility each proposal's shape needs: p_1..p_{n+1}
        feeds = [p.target_feed(st) for p, st in zip(proposals, states)]
        outs = self._target_forward(states, feeds)
        drops: list[int] | None = None if self.rows is None else []
        for st, k, proposal, feed, out in zip(states, ks, proposals, feeds, outs):
            # 3. verify.py: x_i kept with probability min(1, p_i(x_i) / q_i(x_i)) (T = 0:
            #    while x_i = argmax p_i), then one token of the target's: from p_{m+1} after
            #    a full acceptance, else from the residual norm(max(0, p_{m+1} − q_{m+1}))
            verdict = proposal.judge(st, out, self.sampling, self.relax)
            # 4. commit: caches cut back to the accepted prefix, tokens appended, stats
            commit(st, verdict, self.drafter, self.eos_ids, drops)
            self.policy.observe(st, RoundRecord(
                k, proposal.levels, len(feed.ids), verdict.depth, len(verdict.accepted),
                t1 - t0, time.perf_counter() - t1, proposal.dropped, proposal.stopped))
        if self.rows is not None:     # a batch's rows share their caches: cut back at once
            self.rows.rollback(drops)
        self.drafter.end_round(states)

    def _target_forward(self, states: list[DecodeState],
                        feeds: list[TargetFeed]) -> list[torch.Tensor | None]:
        """Target logits (n_b, V) for each row's ``feed.ids`` after its cache (None where
        nothing is fed): the batch's rows in one forward over the ragged cache."""
        if self.rows is not None:
            return self._feed_rows(states, feeds)
        (state,), (feed,) = states, feeds
        if not feed.ids:
            return [None]
        lm = self.target
        ids = torch.tensor([feed.ids], device=lm.device)
        if feed.allowed is None:
            return [self.extend(state, ids)]
        return [self.extend(state, ids,
                            attention_mask=attention_for(lm, feed.allowed, state.target_cache),
                            position_ids=feed.positions[None].to(lm.device))]

    def _feed_rows(self, states: list[DecodeState], feeds: list[TargetFeed]) -> list[torch.Tensor]:
        """The batch's rows in one forward over the ragged cache: a chain's feed at the
        row's own next positions; a tree's flattened after the row's own prefix (its
        positions and visibility are relative to it: a row has no cache of its own), each
        row with its own mask in the one 4-D mask. For a hidden-state drafter each row that
        fed tokens gets their states of the chosen layer on ``state.features``, from the
        row's own position: what ``extend`` gives a request decoded alone."""
        starts = self.rows.next_pos.tolist()
        trees = [None if f.allowed is None else (f.positions, f.allowed) for f in feeds]
        outs = self.rows.feed_hidden([f.ids for f in feeds], self.hidden_layer, trees)
        for state, start, (_, hidden) in zip(states, starts, outs):
            if hidden is not None and len(hidden):
                state.features = TargetFeatures(hidden, start)
        return [logits for logits, _ in outs]

    def extend(self, state: DecodeState, ids: torch.Tensor, **extra) -> torch.Tensor:
        """Target logits (n, V) for ``ids`` (1, n) after the target cache (``extra``: a tree's
        4-D mask and positions). A self-speculative drafter runs the forward itself; for a
        hidden-state drafter the chosen layer's rows are kept on ``state.features`` (from
        the cache's end)."""
        if self.runs_target:
            return self.drafter.extend_target(state, ids, **extra)[0]
        lm = self.target
        if self.hidden_layer is None or state.plain_throughout:
            return lm.adapter.extend(lm, ids, state.target_cache, **extra)[0]
        start = cache_length(state.target_cache)
        logits, hidden = lm.adapter.extend_hidden(lm, ids, state.target_cache, self.hidden_layer,
                                                  **extra)
        f = state.features
        if state.draft_deferred and f is not None and f.ids is not None:
            # the drafter waits for its prefill (auto length): the prompt's rows and every
            # plain round's since then are what that prefill reads
            f.keep_for_late_prefill(hidden[0], start)
        else:
            state.features = TargetFeatures(hidden[0], start)
        return logits[0]

    def finish(self, state: DecodeState) -> None:
        """After the last round (or a prefill timed alone): the drafter's record, and the
        target cache's buffers back to its pool, for the next request to decode in."""
        if not state.draft_deferred:   # (never prefilled: no record)
            self.drafter.finish(state)
        self.policy.finish(state)
        if isinstance(state.target_cache, (StaticKVCache, SegmentedCache)):
            state.target_cache.recycle()

    def generate(self, request: Request, progress: ProgressFn | None = None) -> Result:
        t0 = time.perf_counter()
        state = self.start(request)
        while not state.done:
            self.step(state)
            if progress is not None:
                progress(state)
        self.finish(state)
        return self._result(state, t0)

    # -- many requests, batch_size rows at a time ---------------------------------------
    def run(self, items: Iterable[T], make_request: Callable[[T], Request],
            progress: Callable[[T, DecodeState], None] | None = None,
            ) -> Iterator[tuple[T, Result | Exception]]:
        """Decode every item, ``batch_size`` rows together, each at its own pace: every
        round is ``step_rows`` over the rows (a chain's draft: one forward per drafted
        position for every row; the hidden-state heads and trees: row by row; one target
        forward, a tree row's nodes after its own prefix with its own ancestor mask),
        each row keeping its own accepted length, positions and cache length in a shared
        ragged cache; per row the round is exactly a request's decoded alone, so each
        emits the same tokens at temperature 0. A row that finishes leaves
        at once and the next request is prefilled alone and joins. Yields (item, Result) as
        rows finish, or (item, exception) when building or prefilling its request failed,
        or when a round failed (then every row of that batch fails; the next requests
        start a fresh batch)."""
        queue = iter(items)
        rows: list[_Row] = []
        self._new_batch()
        exhausted = False
        try:
            while True:
                while len(rows) < self.batch_size and not exhausted:
                    item = next(queue, _END)
                    if item is _END:
                        exhausted = True
                        break
                    try:
                        rows.append(self._admit(item, make_request(item)))
                    except Exception as exc:  # this request only; the batch goes on
                        self._drop_partial(len(rows))
                        yield item, exc
                if not rows:
                    return
                try:
                    self.step_rows([r.state for r in rows])
                except Exception as exc:  # a failed batched forward fails its rows
                    for row in rows:
                        yield row.item, exc
                    rows = []
                    self._new_batch()
                    continue
                if progress is not None:
                    for row in rows:
                        progress(row.item, row.state)
                if any(row.state.done for row in rows):
                    keep = [i for i, row in enumerate(rows) if not row.state.done]
                    for row in rows:
                        if row.state.done:    # the drafter's and policy's record, as alone
                            self.drafter.finish(row.state)
                            self.policy.finish(row.state)
                            yield row.item, self._result(row.state, row.started)
                    rows = [rows[i] for i in keep]
                    self.rows.keep_rows(keep)
                    self.drafter.keep_rows(keep)
        finally:
            self.rows = None

    def _new_batch(self) -> None:
        """A fresh batch: empty caches."""
        self.rows = RaggedCache(self.target)
        self.drafter.start_batch(self.sampling, self.eos_ids)

    def _drop_partial(self, n_rows: int) -> None:
        """A request failed halfway through admission: keep the caches at n_rows rows."""
        if self.rows.rows > n_rows:
            self.rows.keep_rows(list(range(n_rows)))
        self.drafter.discard_partial(n_rows)

    def _admit(self, item, request: Request) -> "_Row":
        """Prefill the request alone and add it as a new row of both caches."""
        self.threads.enter("prefill")
        try:
            t0 = time.perf_counter()
            state = self._new_state(request)
            # prefilled as a request alone (on the fast path: straight into a static
            # cache, whose buffers go back to the pool for the next row to join)
            self._prefill_target(state)
            single = state.target_cache
            self.rows.add_row(single, cache_length(single))
            self.drafter.admit(state)
            self.policy.admit(state)      # (auto length: the row's own length model)
            state.target_cache = None     # the row lives on in the batch's cache
            if isinstance(single, StaticKVCache):
                single.recycle()
            state.stats.prefill_s = time.perf_counter() - t0
            return _Row(item, state, t0)
        finally:
            self.threads.enter("decode")


@dataclass
class _Row:
    item: object
    state: DecodeState
    started: float


_END = object()
T = TypeVar("T")


def eos_token_ids(lm: LoadedModel) -> set[int]:
    """The tokens that end a generation (the family decides: EOS for text, none for an
    image grid)."""
    return lm.adapter.stop_token_ids(lm)


def decode_text(lm: LoadedModel, tokens: list[int], eos_ids: set[int]) -> str:
    return lm.tokenizer.decode([t for t in tokens if t not in eos_ids],
                               skip_special_tokens=True).strip()
