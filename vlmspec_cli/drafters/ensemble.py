"""``tabed``: one draft model, several drafting inputs, drafted as one batch (TABED §5).

Each *member* of the ensemble is the same draft model reading the request through a
different drafting input (``inputs.py``): M (images), T (images → "\\n"), C (images → their captions), P (2×2-pooled
images). The members are rows of one batch: prompts are left-padded to a common width
and each row gets its own positions, so a single draft forward per token serves all of
them. At every drafted position the members' distributions are mixed,

    q = sum_i w_i q^(i),   w = the block's weights (weights.py),

one token is drawn from q (argmax at temperature 0) and fed to every row, so the rows
stay aligned on the right and the shared KV cache rolls back with one crop. The mixture
q is what the draft hands to verification, so speculative sampling stays exact.

``chain`` (chain.py) is this drafter with one member and nothing to weigh.

In a batch (generation.batch_size > 1) every request is prefilled as it is alone (its m
left-padded rows, one forward) and its rows join the batch's one ragged draft cache
(runtime/fast/ragged.py ``add_rows``): B requests are B × m draft rows, and one draft
forward per drafted position serves all of them. Each request keeps its own state — its
weights, learned from its own verified target distributions, its block history and its
cursor — so a row drafts, weighs and rolls back exactly as the request alone does.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from vlmspec_cli.drafters.base import DraftingMethod, draft_line, register
from vlmspec_cli.drafters.draft_model import draft_model_names, load_draft
from vlmspec_cli.drafters.inputs import (check_inputs, input_embeds, prefill_encoded,
                                         reads_by_encode, visuals)
from vlmspec_cli.drafters.weights import EnsembleWeights
from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache
from vlmspec_cli.runtime.fast.ragged import RaggedCache
from vlmspec_cli.runtime.round.draft import Draft, DraftCursor, Verdict
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities


@dataclass
class EnsembleState:
    cache: Any                       # its own m rows; None: rows of the batch's ragged cache
    prompt_mask: torch.Tensor        # (m, width): 0 on each row's left padding
    offsets: torch.Tensor            # (m,): each row's prompt length (its first free position)
    weights: EnsembleWeights
    # committed tokens in the cache (after the prompts) and this round's proposals fed
    cursor: DraftCursor = field(default_factory=DraftCursor)
    next_logits: torch.Tensor | None = None   # (m, V) after prefill
    drafted: int = 0                 # proposals made by the last propose()
    block_q: list[torch.Tensor] = field(default_factory=list)  # (m, V) per proposal, if adaptive
    block_weights: list[list[float]] = field(default_factory=list)
    captions: list[str] | None = None
    # rows > 1: the padding mask and positions over the prompt and ``room`` positions after
    # it, built once and sliced by every step (not concatenated per draft token)
    step_mask: torch.Tensor | None = None
    step_positions: torch.Tensor | None = None
    drop: int = 0                    # a batch's row: fed proposals its m rows forget this round

    @property
    def width(self) -> int:
        return self.prompt_mask.shape[1]

    def mask_and_positions(self, done: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (m, width + done + n) padding mask and the (m, n) positions of n new tokens
        after ``done`` generated ones."""
        need = done + n
        if self.step_mask is None or self.step_positions.shape[1] < need:
            room = max(2 * need, 64)
            m = self.prompt_mask.shape[0]
            self.step_mask = torch.cat([self.prompt_mask, self.prompt_mask.new_ones((m, room))], 1)
            self.step_positions = self.offsets[:, None] + torch.arange(room, device=self.offsets.device)
        return self.step_mask[:, : self.width + need], self.step_positions[:, done:need]


@register("tabed")
class EnsembleDrafter(DraftingMethod):
    # rows of a batch: each request's m drafting inputs are m rows of the batch's one draft
    # cache (B × m rows, one draft forward per position), each request its own weights
    batches = True
    help = "adaptive ensemble of inputs"
    search_rank = 4
    traces = True         # --trace: each block's weights, drafted and accepted
    late_prefill = True   # prefill: the request only; propose catches up on the tokens

    def __init__(self, draft, sampling: SamplingParams, inputs: list[str] | None = None,
                 image_token: str | None = None, captioner=None, policy: str = "grid",
                 distance: str = "kl", window: int | str = "all", grid: int = 10,
                 temperature: float = 1.0, trace=None) -> None:
        inputs = list(inputs or ["multimodal", "text"])
        check_inputs(inputs, draft, captioner)
        self.draft = draft
        self.sampling = sampling
        self.inputs = list(inputs)
        self.image_token = image_token          # the target's placeholder in the prompt
        self.captioner = captioner
        self.weight_args = dict(policy=policy, distance_kind=distance, window=window,
                                grid=grid, temperature=temperature)
        self.trace = trace                      # callable(dict) per block, or None
        self.batch: RaggedCache | None = None   # the rows of the current batch (B × m)

    # -- from a profile --------------------------------------------------------------
    @classmethod
    def check(cls, profile) -> None:
        if "caption" in profile.drafting.inputs and not profile.captioner.model:
            raise ValueError("drafting input 'caption' needs a captioner: set captioner.model")

    @classmethod
    def models(cls, profile) -> list[tuple[str, str | None]]:
        return draft_model_names(profile)

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "EnsembleDrafter":
        m = load_draft(profile, target)
        e = profile.ensemble
        return cls(m.draft, sampling, m.inputs, image_token=m.image_token, captioner=m.captioner,
                   policy=e.policy, distance=e.distance, window=e.window, grid=e.grid,
                   temperature=e.temperature, trace=trace)

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        """A profile written for a one-input method: ensemble its input with the text-only
        view (TABED's MT pair; a text-only input stays alone, the draft may take no image)."""
        inputs = list(profile.drafting.inputs)
        if len(inputs) == 1 and inputs[0] != "text":
            return {"drafting.inputs": [*inputs, "text"]}
        return {}

    @classmethod
    def describe(cls, profile) -> str:
        return draft_line(profile, cls)

    @classmethod
    def draft_rows(cls, profile) -> int:
        return len(profile.drafting.inputs)   # every input one row of one batch

    @classmethod
    def plain_draft_steps(cls, profile) -> bool:
        return len(profile.drafting.inputs) == 1   # several: left-padded rows, masked

    @classmethod
    def compile_plan(cls, profile) -> list[tuple[str, int, str, int | None]]:
        rows = len(profile.drafting.inputs)
        draft = ("draft", 2, "padded", rows) if rows > 1 else ("draft", 2, "causal", None)
        return [("target", cls.round_width(profile), "causal", None), draft]

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        return True, (len(profile.drafting.inputs) if profile.task == "caption" else 0), None

    # -- request setup ---------------------------------------------------------------
    def prepare(self, state: DecodeState) -> None:
        """Called before the target's prefill: start captioning so the two overlap."""
        if "caption" in self.inputs and state.request.images:
            state.drafter_state = self.captioner.submit(state.request.images)

    def _captions(self, state: DecodeState) -> list[str]:
        if "caption" not in self.inputs or not state.request.images:
            return []
        future = state.drafter_state
        if not isinstance(future, Future):  # prefill without prepare()
            future = self.captioner.submit(state.request.images)
        captions, seconds = future.result()
        state.stats.caption_s += seconds
        return captions

    def prefill(self, state: DecodeState) -> None:
        lm = self.draft
        if "multimodal" in self.inputs and reads_by_encode(lm, state.request, "multimodal"):
            if len(self.inputs) > 1:
                what = "a video" if state.request.videos else f"an image for '{lm.name}'"
                raise ValueError(f"{what} is drafted from one input at a time (its positions are "
                                 "3-D): drafting.inputs [multimodal] (the draft reads it) or [text]")
            cache, logits, mask = prefill_encoded(lm, state)
            state.drafter_state = EnsembleState(
                cache, mask, torch.tensor([mask.shape[1]], device=lm.device),
                EnsembleWeights(1, **self.weight_args), next_logits=logits)
            return
        captions = self._captions(state)
        rows = [input_embeds(lm, state.prompt, visuals(state.request), name, self.image_token,
                             captions) for name in self.inputs]
        lengths = torch.tensor([r.shape[1] for r in rows])
        width = int(lengths.max())
        hidden = rows[0].shape[-1]
        embeds = rows[0].new_zeros((len(rows), width, hidden))
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=lm.device)
        for i, r in enumerate(rows):  # left padding: every row ends at the same column
            embeds[i, width - r.shape[1]:] = r[0]
            mask[i, width - r.shape[1]:] = 1
        inputs = {"inputs_embeds": embeds}
        if len(rows) > 1:   # one row has no padding: plain positions (and the fast prefill)
            inputs.update(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
        cache = lm.adapter.new_cache(lm)
        logits = lm.adapter.prefill(lm, inputs, cache)
        state.drafter_state = EnsembleState(
            cache, mask, lengths.to(lm.device), EnsembleWeights(len(rows), **self.weight_args),
            next_logits=logits, captions=captions or None)

    # -- drafting --------------------------------------------------------------------
    def _extend(self, st: EnsembleState, tokens: list[int] | torch.Tensor) -> torch.Tensor:
        """Feed the same new tokens (a list, or a 1-D tensor on the draft's device) to every
        row; logits (m, n, V)."""
        lm = self.draft
        if not isinstance(tokens, torch.Tensor):
            tokens = torch.tensor(tokens, device=lm.device)
        m, n = st.prompt_mask.shape[0], tokens.shape[0]
        ids = tokens[None].expand(m, n)
        if m == 1 and lm.fast is not None:
            # one row has no padding: on the fast path (1-D positions) that is plain causal
            # attention at the next positions, with no mask or positions to build per step
            return lm.adapter.extend(lm, ids, st.cache)
        done = cache_length(st.cache) - st.width          # tokens after the prompts
        mask, positions = st.mask_and_positions(done, n)
        return lm.adapter.extend(lm, ids, st.cache, attention_mask=mask, position_ids=positions)

    def _member_probs(self, logits: torch.Tensor) -> torch.Tensor:
        # distances between distributions are taken at the sampling temperature, or at
        # T = 1 when decoding greedily (the argmax ignores temperature; distances do not)
        return probabilities(logits.float(), self.sampling.scoring)

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        st: EnsembleState = state.drafter_state
        unseen = st.cursor.unseen(state.tokens)
        if unseen:  # committed tokens the draft has not read yet (bonus/correction tokens)
            logits = self._extend(st, unseen)[:, -1]
            st.cursor.read(state.tokens)
        else:
            logits = st.next_logits
        w = self._start_block(st, logits.device)
        tokens: list[int] = []
        mixtures: list[torch.Tensor] = []
        fused = None
        if not self._needs_q() and max_tokens > 1:
            # greedy with one member on compiled steps: the whole chain is one call
            fused = self.draft.adapter.greedy_chain(self.draft, logits[:1].argmax(-1, keepdim=True),
                                                    st.cache, max_tokens)
        if fused is not None:
            tokens = fused[0].tolist()
        elif not self._needs_q():
            # greedy with one member: each argmax is fed back as a device tensor, and the
            # chain is read back once, for verification (no host sync per draft token)
            chain = []
            for i in range(max_tokens):
                chain.append(logits[0].argmax(-1, keepdim=True))
                if i + 1 < max_tokens:
                    logits = self._extend(st, chain[-1])[:, -1]
            tokens = torch.cat(chain).tolist() if chain else []
        for i in range(max_tokens if self._needs_q() else 0):
            tokens.append(self._next_token(state, st, w, logits, mixtures))
            if i + 1 < max_tokens:
                logits = self._extend(st, [tokens[-1]])[:, -1]
        return self._end_block(st, tokens, mixtures)

    def _needs_q(self) -> bool:
        """Whether a drafted position needs the members' distributions: a single member at
        T = 0 does not (its argmax is the mixture's)."""
        return not self.sampling.greedy or len(self.inputs) > 1

    def _start_block(self, st: EnsembleState, device) -> torch.Tensor:
        """A request's drafting block begins: its weights w* (m,), chosen from its own
        verified history, hold for the whole block."""
        w = st.weights.current().to(device)
        st.block_weights.append([round(float(x), 4) for x in w])
        st.block_q = []
        return w

    def _next_token(self, state: DecodeState, st: EnsembleState, w: torch.Tensor,
                    logits: torch.Tensor, mixtures: list[torch.Tensor]) -> int:
        """One drafted position of a request from its members' logits (m, V): the mixture
        q = w @ q^(1..m), one token drawn from it with the request's draft generator (its
        argmax at T = 0; a single member's argmax at T = 0, no distributions needed)."""
        if not self._needs_q():
            return int(logits[0].argmax())
        member_q = self._member_probs(logits)              # (m, V)
        q = w @ member_q                                   # the mixture (V,)
        if not self.sampling.greedy:
            tok = int(torch.multinomial(q.cpu(), 1, generator=state.draft_generator))
            mixtures.append(q)
        else:
            tok = int(q.argmax())
        # one member has nothing to weigh (its weight is 1): no history to keep
        if st.weights.policy != "static" and len(self.inputs) > 1:
            st.block_q.append(member_q)   # kept for observe() once the target verified them
        return tok

    def _end_block(self, st: EnsembleState, tokens: list[int],
                   mixtures: list[torch.Tensor]) -> Draft:
        st.cursor.fed = max(0, len(tokens) - 1)   # its last proposal is never fed
        st.drafted = len(tokens)
        st.next_logits = None
        return Draft(tokens, torch.stack(mixtures) if mixtures else None)

    # -- the rows of a batch -----------------------------------------------------------
    def start_batch(self, sampling: SamplingParams, eos_ids: set[int]) -> None:
        self.sampling = sampling
        self.batch = RaggedCache(self.draft)

    def admit(self, state: DecodeState) -> None:
        """Prefill the request as alone (its m left-padded rows in one forward, the same
        logits and keys), then move its rows into the batch's draft cache, their padding
        invalid slots."""
        self.prefill(state)
        st: EnsembleState = state.drafter_state
        self.batch.add_rows(st.cache, st.prompt_mask.bool())
        if isinstance(st.cache, StaticKVCache):
            st.cache.recycle()      # its buffers back to the pool, for the next row's prefill
        st.cache = None

    def _members(self, rows: list[int]) -> list[int]:
        """The batch's draft rows of these requests' rows: each request's m, in order."""
        m = len(self.inputs)
        return [r * m + i for r in rows for i in range(m)]

    def discard_partial(self, n_rows: int) -> None:
        if self.batch.rows > n_rows * len(self.inputs):
            self.batch.keep_rows(self._members(list(range(n_rows))))

    def keep_rows(self, rows: list[int]) -> None:
        self.batch.keep_rows(self._members(rows))

    def propose_rows(self, states: list[DecodeState], budgets: list[int]) -> list[Draft]:
        """At most budgets[b] proposals for row b. A request alone drafts in its own cache
        (``propose``); the rows of a batch draft together, one draft forward per drafted
        position over every request's m rows, each request mixing its own members by its
        own weights and drawing with its own draft generator."""
        rows: list[EnsembleState] = [st.drafter_state for st in states]
        if rows[0].cache is not None:
            return [self.propose(s, n) if n > 0 else Draft([]) for s, n in zip(states, budgets)]
        m = len(self.inputs)
        # catch up: the committed tokens a drafting row's members have not read
        lag = [row.cursor.unseen(st.tokens) if n > 0 else []
               for st, row, n in zip(states, rows, budgets)]
        logits = [row.next_logits for row in rows]
        if any(lag):
            outs = self._feed_members(lag)
            for b, (st, row) in enumerate(zip(states, rows)):
                if lag[b]:
                    logits[b] = torch.stack([outs[b * m + i][-1] for i in range(m)])
                    row.cursor.read(st.tokens)
        weights = [self._start_block(row, self.draft.device) if n > 0 else None
                   for row, n in zip(rows, budgets)]
        tokens: list[list[int]] = [[] for _ in rows]
        mixtures: list[list[torch.Tensor]] = [[] for _ in rows]
        for step in range(max(budgets, default=0)):
            feed: list[list[int]] = []
            for b, (st, row) in enumerate(zip(states, rows)):
                if step < budgets[b]:
                    tokens[b].append(self._next_token(st, row, weights[b], logits[b], mixtures[b]))
                feed.append(tokens[b][-1:] if step + 1 < budgets[b] else [])
            if any(feed):
                outs = self._feed_members(feed)
                for b, f in enumerate(feed):
                    if f:
                        logits[b] = torch.stack([outs[b * m + i][-1] for i in range(m)])
        return [self._end_block(row, t, q) if n > 0 else Draft([])
                for row, t, q, n in zip(rows, tokens, mixtures, budgets)]

    def _feed_members(self, feeds: list[list[int]]) -> list[torch.Tensor]:
        """Each request's tokens to each of its m rows, one forward of the batch's draft
        cache; logits (n, V) per draft row."""
        return self.batch.feed([f for f in feeds for _ in self.inputs])

    def end_round(self, states: list[DecodeState]) -> None:
        row = states[0].drafter_state if states else None   # None: not prefilled (deferred)
        if isinstance(row, EnsembleState) and row.cache is None:   # rows of a batch
            self.batch.rollback([st.drafter_state.drop for st in states for _ in self.inputs])

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        st: EnsembleState = state.drafter_state
        n_accepted, target_logits = len(verdict.accepted), verdict.logits
        # verified positions with both p and the members' q: the accepted proposals and the
        # first rejected one (its prefix was accepted too); the bonus position has no q
        seen = min(n_accepted + 1, len(st.block_q))
        if target_logits is not None and seen:
            p = probabilities(target_logits[:seen].float(), self.sampling.scoring)
            st.weights.observe(p.to(st.block_q[0].device), torch.stack(st.block_q[:seen]))
        if self.trace is not None and len(self.inputs) > 1 and st.drafted:
            self.trace({"request": state.request.request_id, "block": len(st.block_weights) - 1,
                        "inputs": self.inputs, "weights": st.block_weights[-1] if st.block_weights else None,
                        # verified proposals (the engine cuts a draft at EOS)
                        "drafted": len(target_logits) - 1 if target_logits is not None else st.drafted,
                        "accepted": n_accepted})
        st.drop = st.cursor.settle(n_accepted)
        if st.cache is not None:   # a request alone (a batch's rows: end_round)
            truncate_cache(st.cache, st.width + st.cursor.covered)
        st.drafted = 0
        st.block_q = []

    def finish(self, state: DecodeState) -> None:
        """Copy what the request should report (per-block weights) to its stats."""
        st = state.drafter_state
        if isinstance(st, EnsembleState) and len(self.inputs) > 1:
            state.stats.ensemble = {"inputs": self.inputs, "policy": self.weight_args["policy"],
                                    "block_weights": st.block_weights}

