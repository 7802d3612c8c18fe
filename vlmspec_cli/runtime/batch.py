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

Methods: ``none`` (target-only, batched) and ``chain`` (a separate draft model, any one
drafting input). Ensembles and self-speculation decode one request at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from vlmspec_cli.drafters.base import Draft
from vlmspec_cli.drafters.members import prefill_member
from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.engine import Result, decode_text, eos_token_ids
from vlmspec_cli.runtime.models import LoadedModel
from vlmspec_cli.runtime.ragged import RaggedCache
from vlmspec_cli.runtime.request import DecodeState, Request, make_generators
from vlmspec_cli.runtime.verify import SamplingParams, probabilities, verify_chain

T = TypeVar("T")


@dataclass
class BatchDrafter:
    """What the batch drafts with: a draft model reading each request through one input."""

    draft: LoadedModel
    variant: str = "multimodal"
    image_token: str | None = None
    captioner: object = None


@dataclass
class _Row:
    item: object
    state: DecodeState
    started: float
    draft_logits: torch.Tensor | None = None   # the draft's next-token logits after prefill
    draft_covered: int = 0                     # committed tokens the draft cache holds
    draft_fed: int = 0                         # proposals fed to the draft this round


class BatchedEngine:
    def __init__(self, target: LoadedModel, drafter: BatchDrafter | None, gamma: int,
                 sampling: SamplingParams, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError("batch size must be >= 1")
        self.target = target
        self.drafter = drafter
        self.gamma = gamma if drafter is not None else 0
        self.sampling = sampling
        self.batch_size = batch_size
        self.eos_ids = eos_token_ids(target)

    # -- the scheduler ---------------------------------------------------------------
    def run(self, items: Iterable[T], make_request: Callable[[T], Request],
            progress: Callable[[T, DecodeState], None] | None = None,
            ) -> Iterator[tuple[T, Result | Exception]]:
        """Decode every item; yields (item, Result) as rows finish, or (item, exception)
        when building or prefilling its request failed, or when a batched round failed
        (then every row of that batch fails; the next requests start a fresh batch)."""
        queue = iter(items)
        rows: list[_Row] = []
        self._tcache = RaggedCache(self.target)
        self._dcache = RaggedCache(self.drafter.draft) if self.drafter else None
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
                self._tcache = RaggedCache(self.target)
                self._dcache = RaggedCache(self.drafter.draft) if self.drafter else None
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
                if self._dcache is not None:
                    self._dcache.keep_rows(keep)

    def _drop_partial(self, n_rows: int) -> None:
        """A request failed halfway through admission: keep the caches at n_rows rows."""
        for cache in (self._tcache, self._dcache):
            if cache is not None and cache.rows > n_rows:
                cache.keep_rows(list(range(n_rows)))

    # -- joining the batch -----------------------------------------------------------
    def _admit(self, item, request: Request) -> _Row:
        """Prefill the request alone and add it as a new row of both caches."""
        t0 = time.perf_counter()
        lm = self.target
        state = DecodeState(request=request, prompt=lm.adapter.prompt_text(lm, request.messages))
        state.target_generator, state.draft_generator = make_generators(request.seed)
        images = request.images or None
        single = lm.adapter.new_cache(lm)
        state.target_next_logits = lm.adapter.prefill(lm, lm.adapter.encode(lm, state.prompt, images),
                                                      single)[0]
        self._tcache.add_row(single, cache_length(single))
        row = _Row(item, state, t0)
        if self.drafter is not None:
            d = self.drafter
            single, row.draft_logits = prefill_member(d.draft, state, d.variant, d.image_token,
                                                      d.captioner)
            self._dcache.add_row(single, cache_length(single))
        state.stats.prefill_s = time.perf_counter() - t0
        return row

    # -- one round for every row -----------------------------------------------------
    def _round(self, rows: list[_Row]) -> None:
        budgets = [min(self.gamma, r.state.request.max_new_tokens - len(r.state.tokens) - 1)
                   for r in rows]
        drafts = self._propose(rows, budgets) if self.drafter else [Draft([]) for _ in rows]

        # p_1..p_{n+1} of every row from one target forward over pending + proposals
        outs = self._tcache.feed([r.state.target_pending + d.tokens for r, d in zip(rows, drafts)])
        target_drop, draft_drop = [], []
        for row, draft, out in zip(rows, drafts, outs):
            st = row.state
            parts = [] if st.target_next_logits is None else [st.target_next_logits[None]]
            if len(out):
                parts.append(out)
            target_logits = torch.cat(parts)[: len(draft) + 1]
            n_acc, tok = verify_chain(draft.tokens, draft.probs, target_logits, self.sampling,
                                      st.target_generator)
            target_drop.append(len(draft) - n_acc)       # cache keeps pending + x_1..x_k
            keep = min(n_acc, row.draft_fed)             # the draft fed x_1..x_fed
            draft_drop.append(row.draft_fed - keep)
            row.draft_covered += keep
            row.draft_fed = 0
            st.target_pending = [tok]
            st.target_next_logits = None
            st.tokens.extend(draft.tokens[:n_acc])
            st.tokens.append(tok)
            st.stats.record_round(len(draft), n_acc, n_acc + 1)
            if tok in self.eos_ids or len(st.tokens) >= st.request.max_new_tokens:
                st.done = True
        self._tcache.rollback(target_drop)
        if self._dcache is not None:
            self._dcache.rollback(draft_drop)

    def _propose(self, rows: list[_Row], budgets: list[int]) -> list[Draft]:
        """Up to budgets[b] draft tokens per row, one batched draft forward per position."""
        greedy = self.sampling.greedy
        # catch up on committed tokens the draft has not read (last round's target token,
        # and x_n after a fully accepted chain)
        lag = [r.state.tokens[r.draft_covered:] if budgets[b] > 0 else [] for b, r in enumerate(rows)]
        outs = self._dcache.feed(lag) if any(lag) else [None] * len(rows)
        logits = []
        for b, row in enumerate(rows):
            if lag[b]:
                logits.append(outs[b][-1])
                row.draft_covered = len(row.state.tokens)
            else:
                logits.append(row.draft_logits)
            if budgets[b] > 0:
                row.draft_logits = None
        tokens: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        active = [budgets[b] > 0 for b in range(len(rows))]
        while any(active):
            feed: list[list[int]] = []
            for b, row in enumerate(rows):
                if not active[b]:
                    feed.append([])
                    continue
                if greedy:
                    tok = int(logits[b].argmax())
                else:
                    q = probabilities(logits[b].float(), self.sampling)
                    tok = int(torch.multinomial(q.cpu(), 1, generator=row.state.draft_generator))
                if tok in self.eos_ids:  # never proposed: nothing can follow it
                    active[b] = False
                    feed.append([])
                    continue
                tokens[b].append(tok)
                if not greedy:
                    probs[b].append(q)
                if len(tokens[b]) == budgets[b]:
                    active[b] = False   # its last proposal need not be fed
                    feed.append([])
                else:
                    feed.append([tok])
                    row.draft_fed += 1
            if any(feed):
                outs = self._dcache.feed(feed)
                logits = [outs[b][-1] if feed[b] else logits[b] for b in range(len(rows))]
        return [Draft(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs)]

    def _result(self, row: _Row) -> Result:
        st = row.state
        st.stats.wall_s = time.perf_counter() - row.started
        return Result(list(st.tokens), decode_text(self.target, st.tokens, self.eos_ids), st)


_END = object()
