"""``chain``: a separate small draft model proposes γ tokens one by one, reading the request
through one drafting input (inputs.py: multimodal, text, caption or pooled).

One request at a time it is the ensemble drafter with a single member: the mixture is that
member's own distribution and there are no weights to adapt. In a batch
(generation.batch_size > 1, runtime/batch.py) ``ChainBatchDrafter`` drafts for every row
at once: one draft forward per drafted position over a ragged cache (runtime/ragged.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlmspec_cli.drafters.base import first_input, one_input, register
from vlmspec_cli.drafters.draft_model import load_draft
from vlmspec_cli.drafters.ensemble import EnsembleDrafter
from vlmspec_cli.drafters.inputs import prefill_input
from vlmspec_cli.drafters.retokenized import RetokenizedDrafter
from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS, VIDEO_INPUTS
from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.draft import BatchDrafter, Draft, DraftCursor, Verdict
from vlmspec_cli.runtime.ragged import RaggedCache
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.verify import SamplingParams, probabilities


@register("chain")
class ChainDrafter(EnsembleDrafter):
    tasks = ("caption", "video")
    batches = True
    help = "a draft model, one drafting input"
    searched_first = ("caption", "video")

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        return True, 1, None

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        return first_input(profile)   # not the ensemble's pairing: a chain reads one input

    def __init__(self, draft, sampling: SamplingParams, drafting_input: str = "multimodal",
                 image_token: str | None = None, captioner=None, trace=None) -> None:
        if drafting_input not in DRAFTING_INPUTS:
            raise ValueError(f"chain drafting supports inputs {DRAFTING_INPUTS}, not "
                             f"'{drafting_input}'")
        super().__init__(draft, sampling, [drafting_input], image_token=image_token,
                         captioner=captioner, policy="static", trace=trace)

    @classmethod
    def check(cls, profile) -> None:
        drafting_input = one_input(profile)
        if profile.task == "video" and drafting_input not in VIDEO_INPUTS:
            raise ValueError(f"describe-video drafts with --inputs {' or '.join(VIDEO_INPUTS)} "
                             f"(the draft reads the video, or the prompt without it), not "
                             f"'{drafting_input}'")
        super().check(profile)

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "ChainDrafter":
        m = load_draft(profile, target)
        if m.retokenized:     # a draft of another tokenizer proposes through text
            return RetokenizedDrafter(m.draft, target, sampling, one_input(profile),
                                      image_token=m.image_token, captioner=m.captioner)
        return cls(m.draft, sampling, one_input(profile), image_token=m.image_token,
                   captioner=m.captioner, trace=trace)

    def batched(self) -> "ChainBatchDrafter":
        return ChainBatchDrafter(self.draft, self.inputs[0], self.image_token, self.captioner)


@dataclass
class ChainRow:
    """One batch row's drafting state (``state.drafter_state``)."""

    next_logits: torch.Tensor | None   # the draft's next-token logits after prefill
    cursor: DraftCursor = field(default_factory=DraftCursor)   # what the draft cache read
    drop: int = 0                      # fed proposals to forget after this round


class ChainBatchDrafter(BatchDrafter):
    """Chain drafting for a batch: every row's draft continues in one forward per position.
    Per row the proposals are the chain's own: up to its budget, stopped before an EOS."""

    def __init__(self, draft, drafting_input: str = "multimodal", image_token: str | None = None,
                 captioner=None) -> None:
        self.draft = draft
        self.drafting_input = drafting_input
        self.image_token = image_token
        self.captioner = captioner

    def reset(self, sampling: SamplingParams, eos_ids: set[int]) -> None:
        self.sampling = sampling
        self.eos_ids = eos_ids
        self.cache = RaggedCache(self.draft)

    def admit(self, state: DecodeState) -> None:
        single, logits = prefill_input(self.draft, state, self.drafting_input, self.image_token,
                                       self.captioner, static=False)   # joins a ragged cache
        self.cache.add_row(single, cache_length(single))
        state.drafter_state = ChainRow(logits)

    def discard_partial(self, n_rows: int) -> None:
        if self.cache.rows > n_rows:
            self.cache.keep_rows(list(range(n_rows)))

    def keep_rows(self, rows: list[int]) -> None:
        self.cache.keep_rows(rows)

    def propose(self, states: list[DecodeState], budgets: list[int]) -> list[Draft]:
        """Up to budgets[b] draft tokens per row, one batched draft forward per position
        (sampled: each row's token is drawn on the host from its q, with its own draft
        generator)."""
        rows: list[ChainRow] = [st.drafter_state for st in states]
        logits = self._catch_up(states, rows, budgets)
        if self.sampling.greedy:
            return self._propose_greedy(rows, logits, budgets)
        tokens: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        active = [budgets[b] > 0 for b in range(len(rows))]
        while any(active):
            feed: list[list[int]] = []
            for b, row in enumerate(rows):
                tok, q = self._draw(logits[b], states[b]) if active[b] else (None, None)
                if tok is None or tok in self.eos_ids:  # EOS is never proposed
                    active[b] = False
                    feed.append([])
                    continue
                tokens[b].append(tok)
                probs[b].append(q)
                if len(tokens[b]) == budgets[b]:
                    active[b] = False   # its last proposal need not be fed
                    feed.append([])
                else:
                    feed.append([tok])
                    row.cursor.fed += 1
            if any(feed):
                outs = self.cache.feed(feed)
                logits = [outs[b][-1] if feed[b] else logits[b] for b in range(len(rows))]
        return [Draft(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs)]

    def _catch_up(self, states: list[DecodeState], rows: list[ChainRow],
                  budgets: list[int]) -> list[torch.Tensor]:
        """Feed the committed tokens the draft has not read (last round's target token, and
        x_n after a fully accepted chain) of the rows that draft; each row's next logits."""
        lag = [row.cursor.unseen(st.tokens) if budgets[b] > 0 else []
               for b, (st, row) in enumerate(zip(states, rows))]
        outs = self.cache.feed(lag) if any(lag) else [None] * len(rows)
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
        longest budget, past its own budget or an EOS: the batched forward runs over every
        row anyway, and ``accept`` drops what was fed beyond the accepted proposals."""
        drafting = [n > 0 for n in budgets]
        steps = max(budgets, default=0)
        if steps == 0:
            return [Draft([]) for _ in rows]
        live = next(x for x, d in zip(logits, drafting) if d)
        last = torch.stack([x if d else torch.zeros_like(live) for x, d in zip(logits, drafting)])
        fed_rows = torch.tensor(drafting, device=last.device)[:, None]   # (B, 1)
        chain = []
        for step in range(steps):
            chain.append(last.argmax(-1, keepdim=True))                   # (B, 1), on device
            if step + 1 < steps:
                last = self.cache.feed_tensor(chain[-1], fed_rows)[:, -1]
        proposals = torch.cat(chain, 1).tolist()                          # the one read-back
        drafts = []
        for b, row in enumerate(rows):
            if not drafting[b]:
                drafts.append(Draft([]))
                continue
            row.cursor.fed += steps - 1
            tokens = proposals[b][:budgets[b]]
            # EOS is never proposed: the chain stops before it
            stop = next((i for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
            drafts.append(Draft(tokens[:stop]))
        return drafts

    def _draw(self, logits: torch.Tensor, state: DecodeState):
        """The row's next draft token, sampled, and the q it was drawn from."""
        q = probabilities(logits.float(), self.sampling)
        return int(torch.multinomial(q.cpu(), 1, generator=state.draft_generator)), q

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        row: ChainRow = state.drafter_state
        row.drop = row.cursor.settle(len(verdict.accepted))   # the draft fed x_1..x_fed

    def end_round(self, states: list[DecodeState]) -> None:
        self.cache.rollback([st.drafter_state.drop for st in states])
