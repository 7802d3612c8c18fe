"""Batched speculative decoding: B requests decode together, each at its own pace.

Every round the rows of the batch draft together (one draft forward per drafted token for
all rows) and are verified together (one target forward), but each row keeps its own
accepted length, positions and cache length (``RaggedCache``). A row that finishes leaves
the batch at once and the next request is prefilled alone and joins, so the batch stays
full while there is work.

Per row, the round is exactly the single-request round of ``engine.py``: the draft
proposes up to γ tokens x_1..x_n (never past the row's token budget, stopped before an
EOS), the target's forward over pending + x_1..x_n gives p_1..p_{n+1}, and ``verify_chain``
(verify.py, the one place acceptance is decided) accepts x_1..x_k and adds one target
token. Each row therefore emits the same tokens at temperature 0 as when decoded alone.

What the rows draft with is the method's ``BatchDrafter`` (draft.py; ``Drafter.batched``):
none for target-only batches, or the chain method's batched drafting (drafters/chain.py).
Ensembles and self-speculation decode one request at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.draft import BatchDrafter, commit
from vlmspec_cli.runtime.engine import Result, decode_text, eos_token_ids
from vlmspec_cli.runtime.models import LoadedModel
from vlmspec_cli.runtime.ragged import RaggedCache
from vlmspec_cli.runtime.request import DecodeState, Request, make_generators
from vlmspec_cli.runtime.threads import ThreadPlan
from vlmspec_cli.runtime.verify import SamplingParams

T = TypeVar("T")


@dataclass
class _Row:
    item: object
    state: DecodeState
    started: float


class BatchedEngine:
    def __init__(self, target: LoadedModel, drafter: BatchDrafter | None, gamma: int,
                 sampling: SamplingParams, batch_size: int) -> None:
        """``drafter``: None (or a plain ``BatchDrafter``) decodes with the target alone."""
        if batch_size < 1:
            raise ValueError("batch size must be >= 1")
        self.target = target
        self.drafter = drafter if drafter is not None else BatchDrafter()
        self.gamma = gamma
        self.sampling = sampling
        self.batch_size = batch_size
        self.eos_ids = eos_token_ids(target)
        self.threads = ThreadPlan()     # CPU threads per phase (runtime/threads.py)

    # -- the scheduler ---------------------------------------------------------------
    def run(self, items: Iterable[T], make_request: Callable[[T], Request],
            progress: Callable[[T, DecodeState], None] | None = None,
            ) -> Iterator[tuple[T, Result | Exception]]:
        """Decode every item; yields (item, Result) as rows finish, or (item, exception)
        when building or prefilling its request failed, or when a batched round failed
        (then every row of that batch fails; the next requests start a fresh batch)."""
        queue = iter(items)
        rows: list[_Row] = []
        self._reset()
        exhausted = False
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
                self._round(rows)
            except Exception as exc:  # a failed batched forward fails its rows
                for row in rows:
                    yield row.item, exc
                rows = []
                self._reset()
                continue
            if progress is not None:
                for row in rows:
                    progress(row.item, row.state)
            finished = [i for i, row in enumerate(rows) if row.state.done]
            if finished:
                keep = [i for i in range(len(rows)) if not rows[i].state.done]
                for i in finished:
                    yield rows[i].item, self._result(rows[i])
                rows = [rows[i] for i in keep]
                self._tcache.keep_rows(keep)
                self.drafter.keep_rows(keep)

    def _reset(self) -> None:
        """A fresh batch: empty caches."""
        self._tcache = RaggedCache(self.target)
        self.drafter.reset(self.sampling, self.eos_ids)

    def _drop_partial(self, n_rows: int) -> None:
        """A request failed halfway through admission: keep the caches at n_rows rows."""
        if self._tcache.rows > n_rows:
            self._tcache.keep_rows(list(range(n_rows)))
        self.drafter.discard_partial(n_rows)

    # -- joining the batch -----------------------------------------------------------
    def _admit(self, item, request: Request) -> _Row:
        """Prefill the request alone and add it as a new row of both caches."""
        self.threads.enter("prefill")
        try:
            return self._prefill_row(item, request)
        finally:
            self.threads.enter("decode")

    def _prefill_row(self, item, request: Request) -> _Row:
        t0 = time.perf_counter()
        lm = self.target
        state = DecodeState(request=request, prompt=lm.adapter.prompt_text(lm, request.messages))
        state.target_generator, state.draft_generator = make_generators(request.seed)
        images = request.images or None
        single = lm.adapter.new_cache(lm, static=False)
        state.target_next_logits = lm.adapter.prefill(lm, lm.adapter.encode(lm, state.prompt, images),
                                                      single)[0]
        self._tcache.add_row(single, cache_length(single))
        self.drafter.admit(state)
        state.stats.prefill_s = time.perf_counter() - t0
        return _Row(item, state, t0)

    # -- one round for every row -----------------------------------------------------
    def _round(self, rows: list[_Row]) -> None:
        states = [r.state for r in rows]
        budgets = [min(self.gamma, st.request.max_new_tokens - len(st.tokens) - 1)
                   for st in states]
        drafts = self.drafter.propose(states, budgets)
        # p_1..p_{n+1} of every row from one target forward over pending + proposals
        outs = self._tcache.feed([st.target_pending + d.tokens for st, d in zip(states, drafts)])
        target_drops: list[int] = []     # the cache keeps pending + x_1..x_k of each row
        for st, draft, out in zip(states, drafts, outs):
            commit(st, draft.judge(st, out, self.sampling), self.drafter, self.eos_ids,
                   target_drops)
        self._tcache.rollback(target_drops)
        self.drafter.end_round(states)

    def _result(self, row: _Row) -> Result:
        st = row.state
        st.stats.wall_s = time.perf_counter() - row.started
        return Result(list(st.tokens), decode_text(self.target, st.tokens, self.eos_ids), st)


_END = object()
