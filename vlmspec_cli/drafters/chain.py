"""``chain``: a separate small draft model proposes γ tokens one by one, reading the request
through one drafting input (inputs.py: multimodal, text, caption or pooled).

One implementation for any number of rows. ``propose_rows`` drafts for every row the
engine hands it, one draft forward per drafted position over all of them: a request
decoded alone keeps its draft cache to itself (the fast path's static cache, and with
compiled steps a greedy chain drafted in one call); the rows of a batch
(generation.batch_size > 1) share one ragged cache (runtime/fast/ragged.py), each row at its
own length. Either way a row drafts its budget of tokens (an EOS among them is cut by the
engine before verification: nothing after it is verified), and after verification its
draft cache keeps the accepted proposals it fed (``DraftCursor``). A request alone with
``drafting.length: auto`` may end its chain sooner, by the draft's confidence in each
proposal (``state.draft_stop``, runtime/length/draft_stop.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vlmspec_cli.drafters.base import (DraftingMethod, draft_line, first_input, one_input,
                                      register)
from vlmspec_cli.drafters.draft_model import draft_model_names, load_draft
from vlmspec_cli.drafters.inputs import check_inputs, prefill_input
from vlmspec_cli.drafters.retokenized import RetokenizedDrafter
from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS, VIDEO_INPUTS
from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache
from vlmspec_cli.runtime.round.draft import Draft, DraftCursor, Verdict
from vlmspec_cli.runtime.fast.ragged import RaggedCache
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities


@dataclass
class ChainRow:
    """One request's drafting state (``state.drafter_state``)."""

    next_logits: torch.Tensor | None   # (V,) the draft's next-token logits after prefill
    cache: Any = None                  # its own draft cache; None: a row of the batch's
    prompt: int = 0                    # prompt positions in its own cache
    cursor: DraftCursor = field(default_factory=DraftCursor)   # what the draft cache read
    drop: int = 0                      # fed proposals to forget after this round


@register("chain")
class ChainDrafter(DraftingMethod):
    tasks = ("caption", "video")
    batches = True
    help = "a draft model, one drafting input"
    searched_first = ("caption", "video")
    search_rank = 2
    late_prefill = True   # prefill: the request only; propose catches up on the tokens
    reads_confidence = True   # a request alone: ``state.draft_stop`` (draft_stop.py)

    def __init__(self, draft, sampling: SamplingParams, drafting_input: str = "multimodal",
                 image_token: str | None = None, captioner=None, trace=None) -> None:
        if drafting_input not in DRAFTING_INPUTS:
            raise ValueError(f"chain drafting supports inputs {DRAFTING_INPUTS}, not "
                             f"'{drafting_input}'")
        check_inputs([drafting_input], draft, captioner)
        self.draft = draft
        self.sampling = sampling
        self.drafting_input = drafting_input
        self.image_token = image_token          # the target's placeholder in the prompt
        self.captioner = captioner
        self.batch: RaggedCache | None = None   # the rows of the current batch

    # -- from a profile --------------------------------------------------------------
    @classmethod
    def check(cls, profile) -> None:
        drafting_input = one_input(profile)
        if drafting_input == "caption" and not profile.captioner.model:
            raise ValueError("drafting input 'caption' needs a captioner: set captioner.model")
        if profile.task == "video" and drafting_input not in VIDEO_INPUTS:
            raise ValueError(f"describe-video drafts with --inputs {' or '.join(VIDEO_INPUTS)} "
                             f"(the draft reads the video, or the prompt without it), not "
                             f"'{drafting_input}'")

    @classmethod
    def models(cls, profile) -> list[tuple[str, str | None]]:
        return draft_model_names(profile)

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> DraftingMethod:
        m = load_draft(profile, target)
        if m.retokenized:     # a draft of another tokenizer proposes through text
            return RetokenizedDrafter(m.draft, target, sampling, one_input(profile),
                                      image_token=m.image_token, captioner=m.captioner)
        return cls(m.draft, sampling, one_input(profile), image_token=m.image_token,
                   captioner=m.captioner)

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        return first_input(profile)   # not the ensemble's pairing: a chain reads one input

    @classmethod
    def describe(cls, profile) -> str:
        return draft_line(profile, cls)

    @classmethod
    def plain_draft_steps(cls, profile) -> bool:
        return True

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        return True, 1, None

    # -- a request's drafting state ------------------------------------------------------
    def prepare(self, state: DecodeState) -> None:
        """Before the target's prefill: start captioning so the two overlap."""
        if self.drafting_input == "caption" and state.request.images:
            state.drafter_state = self.captioner.submit(state.request.images)

    def prefill(self, state: DecodeState) -> None:
        """A request decoded alone: its own draft cache (static on the fast path)."""
        cache, logits = prefill_input(self.draft, state, self.drafting_input, self.image_token,
                                      self.captioner, pending=state.drafter_state)
        state.drafter_state = ChainRow(logits, cache, prompt=cache_length(cache))

    def start_batch(self, sampling: SamplingParams, eos_ids: set[int]) -> None:
        self.sampling = sampling
        self.batch = RaggedCache(self.draft)

    def admit(self, state: DecodeState) -> None:
        single, logits = prefill_input(self.draft, state, self.drafting_input, self.image_token,
                                       self.captioner, static=False)   # joins a ragged cache
        self.batch.add_row(single, cache_length(single))
        state.drafter_state = ChainRow(logits)

    def discard_partial(self, n_rows: int) -> None:
        if self.batch.rows > n_rows:
            self.batch.keep_rows(list(range(n_rows)))

    def keep_rows(self, rows: list[int]) -> None:
        self.batch.keep_rows(rows)

    # -- drafting --------------------------------------------------------------------
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        return self.propose_rows([state], [max_tokens])[0]

    def propose_rows(self, states: list[DecodeState], budgets: list[int]) -> list[Draft]:
        """Up to budgets[b] draft tokens for row b, one draft forward per drafted position
        for every drafting row (sampled: each row's token drawn on the host from its q,
        with its own draft generator)."""
        rows: list[ChainRow] = [st.drafter_state for st in states]
        logits = self._catch_up(states, rows, budgets)
        stop = states[0].draft_stop if len(states) == 1 and budgets[0] > 0 else None
        if stop is not None:
            return [self._propose_stopping(states[0], rows[0], logits[0], budgets[0], stop)]
        if self.sampling.greedy:
            return self._propose_greedy(rows, logits, budgets)
        tokens: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        for step in range(max(budgets, default=0)):
            feed: list[list[int]] = []
            for b, row in enumerate(rows):
                if step >= budgets[b]:
                    feed.append([])
                    continue
                q = probabilities(logits[b].float(), self.sampling)
                tok = int(torch.multinomial(q.cpu(), 1, generator=states[b].draft_generator))
                tokens[b].append(tok)
                probs[b].append(q)
                if step + 1 == budgets[b]:        # its last proposal need not be fed
                    feed.append([])
                else:
                    feed.append([tok])
                    row.cursor.fed += 1
            if any(feed):
                outs = self._feed(rows, feed)
                logits = [outs[b][-1] if feed[b] else logits[b] for b in range(len(rows))]
        return [Draft(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs)]

    def _propose_stopping(self, state: DecodeState, row: ChainRow, logits: torch.Tensor,
                          budget: int, stop) -> Draft:
        """A request alone: up to ``budget`` proposals, one draft forward each, ending where
        ``stop`` (a draft_stop.ChainStop) says the next position does not pay; of those, at
        T = 0 the prefix it says to verify, at T > 0 all of them. The confidence c_j in
        proposal j: its probability under the draft (T = 0: the most probable token's,
        which it proposes; T > 0: q_j(x_j), the token drawn as in any chain); S_j = c_1 ⋯
        c_j. (At T = 0 the token is read per position, where the chain without a stop reads
        its proposals back once.)"""
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        confidence: list[float] = []
        survivals: list[float] = []
        while True:
            if self.sampling.greedy:   # the most probable token and its probability
                top, index = torch.softmax(logits.float(), -1).max(-1)
                c, token, feed = float(top), int(index), index.view(1, 1)
            else:
                q = probabilities(logits.float(), self.sampling)
                on_host = q.cpu()
                token = int(torch.multinomial(on_host, 1, generator=state.draft_generator))
                c, feed = float(on_host[token]), None
                probs.append(q)
            tokens.append(token)
            confidence.append(c)
            survivals.append(c * (survivals[-1] if survivals else 1.0))
            if len(tokens) == budget or not stop.more(len(tokens), survivals[-1]):
                break
            if feed is None:
                feed = torch.tensor([[token]], device=self.draft.device)
            logits = self._extend(row, feed)[0, -1]
            row.cursor.fed += 1
        # the prefix verified: at T = 0 the one the rule says pays (greedy verification emits
        # the target's argmax whatever is verified); at T > 0 every proposal drawn. There a
        # proposal left out for its own q_j(x_j) would make the law of the verified x_j q_j
        # restricted to the tokens the rule keeps, while min(1, p/q) and the residual
        # norm(max(0, p - q)) assume q_j itself: q = (0.9, 0.1), p = (0.5, 0.5), x verified
        # only when q(x) > 0.5 (else the target's own token, drawn from p) emits token 0
        # with probability 0.9 · 5/9 + 0.1 · 0.5 = 0.55, not 0.5. Ending the chain (``more``)
        # decides whether x_{j+1} is drawn from x_1..x_j alone: a stopping time, exact (each
        # x_j verified is a draw from q_j, whatever it turned out to be).
        keep = stop.keep(survivals) if self.sampling.greedy else len(tokens)
        return Draft(tokens[:keep], torch.stack(probs[:keep]) if probs[:keep] else None,
                     steps=len(tokens), dropped=confidence[keep] if keep < len(tokens) else None,
                     stopped=keep < budget)

    def _feed(self, rows: list[ChainRow], feeds: list[list[int]]) -> list[torch.Tensor]:
        """Each row's tokens through the draft, one forward; per row its logits (n, V)."""
        if rows[0].cache is None:           # rows of a batch
            return self.batch.feed(feeds)
        (row,), (ids,) = rows, feeds
        return [self._extend(row, torch.tensor([ids], device=self.draft.device))[0]]

    def _extend(self, row: ChainRow, ids: torch.Tensor) -> torch.Tensor:
        """A request alone: ``ids`` (1, n) after its own cache; logits (1, n, V). Off the
        fast path, with the padding mask and positions transformers is given for rows."""
        lm = self.draft
        if lm.fast is not None:
            return lm.adapter.extend(lm, ids, row.cache)
        past, n = cache_length(row.cache), ids.shape[1]
        mask = torch.ones((1, past + n), dtype=torch.long, device=lm.device)
        positions = torch.arange(past, past + n, device=lm.device)[None]
        return lm.adapter.extend(lm, ids, row.cache, attention_mask=mask, position_ids=positions)

    def _catch_up(self, states: list[DecodeState], rows: list[ChainRow],
                  budgets: list[int]) -> list[torch.Tensor]:
        """Feed the committed tokens the draft has not read (last round's target token, and
        x_n after a fully accepted chain) of the rows that draft; each row's next logits."""
        lag = [row.cursor.unseen(st.tokens) if budgets[b] > 0 else []
               for b, (st, row) in enumerate(zip(states, rows))]
        outs = self._feed(rows, lag) if any(lag) else [None] * len(rows)
        logits = []
        for b, (st, row) in enumerate(zip(states, rows)):
            if lag[b]:
                logits.append(outs[b][-1])
                row.cursor.read(st.tokens)
            else:
                logits.append(row.next_logits)
            if budgets[b] > 0:
                row.next_logits = None
        return logits

    def _propose_greedy(self, rows: list[ChainRow], logits: list[torch.Tensor | None],
                        budgets: list[int]) -> list[Draft]:
        """T = 0: the rows' argmax chains stay on the device and are read back once, for
        verification (no host sync per drafted position). Every drafting row is fed for the
        longest budget: the forward runs over every row anyway, and ``accept`` drops what
        was fed beyond the accepted proposals. A request alone on compiled steps drafts
        its whole chain in one call."""
        drafting = [n > 0 for n in budgets]
        steps = max(budgets, default=0)
        if steps == 0:
            return [Draft([]) for _ in rows]
        live = next(x for x, d in zip(logits, drafting) if d)
        last = torch.stack([x if d else torch.zeros_like(live) for x, d in zip(logits, drafting)])
        first = last.argmax(-1, keepdim=True)                             # (B, 1), on device
        alone = rows[0].cache is not None
        fused = (self.draft.adapter.greedy_chain(self.draft, first, rows[0].cache, steps)
                 if alone else None)
        if fused is not None:
            proposals = fused.tolist()
        else:
            fed_rows = None if alone else torch.tensor(drafting, device=last.device)[:, None]
            chain = [first]
            for _ in range(steps - 1):
                last = (self._extend(rows[0], chain[-1]) if alone
                        else self.batch.feed_tensor(chain[-1], fed_rows))[:, -1]
                chain.append(last.argmax(-1, keepdim=True))
            proposals = torch.cat(chain, 1).tolist()                      # the one read-back
        drafts = []
        for b, row in enumerate(rows):
            if drafting[b]:
                row.cursor.fed += steps - 1
            drafts.append(Draft(proposals[b][:budgets[b]] if drafting[b] else []))
        return drafts

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        row: ChainRow = state.drafter_state
        row.drop = row.cursor.settle(len(verdict.accepted))   # the draft fed x_1..x_fed
        if row.cache is not None:
            truncate_cache(row.cache, row.prompt + row.cursor.covered)

    def end_round(self, states: list[DecodeState]) -> None:
        row = states[0].drafter_state if states else None   # None: not prefilled (deferred)
        if isinstance(row, ChainRow) and row.cache is None:  # rows of a batch
            self.batch.rollback([st.drafter_state.drop for st in states])
