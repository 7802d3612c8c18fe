"""The draft → verify → accept loop. Acceptance itself is decided in ``verify.py``.

One round, for a request whose target cache holds the prompt and the committed tokens
except ``pending`` (the token the target added last round, not yet run through it):

1. the drafter proposes up to γ tokens x_1..x_n (never past max_new_tokens; a chain is cut
   at EOS), as a chain or a tree (draft.py);
2. one target forward over pending + x_1..x_n gives p_1..p_{n+1} (``Proposal.verify``);
3. ``verify_chain`` / ``verify_tree`` accept x_1..x_k and add one token of the target's;
4. ``commit`` rolls the target cache back to the accepted prefix, and the drafter its own.

Each round emits accepted + 1 tokens, so new_tokens = num_accepted_tokens + num_drafts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.draft import Draft, Drafter, commit
from vlmspec_cli.runtime.draft_length import AutoGamma
from vlmspec_cli.runtime.models import LoadedModel
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.request import DecodeState, Request, TargetFeatures, make_generators
from vlmspec_cli.runtime.threads import ThreadPlan
from vlmspec_cli.runtime.trunk import SegmentedCache
from vlmspec_cli.runtime.verify import Relaxation, SamplingParams


@dataclass
class Result:
    tokens: list[int]
    text: str
    state: DecodeState


ProgressFn = Callable[[DecodeState], None]


class SpeculativeEngine:
    def __init__(self, target: LoadedModel, drafter: Drafter, gamma: int,
                 sampling: SamplingParams) -> None:
        if gamma < 1:
            raise ValueError("gamma must be >= 1")
        self.target = target
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
        # drafting.length: auto (draft_length.py): γ chosen per round up to ``gamma``, and
        # plain target steps while drafting does not pay; None: every round drafts γ
        self.length: AutoGamma | None = None

    # -- one request -----------------------------------------------------------------
    def start(self, request: Request) -> DecodeState:
        """Prefill target and drafter; the target's prefill logits give the first token's
        distribution (kept as ``target_next_logits``, consumed by the first round)."""
        self.threads.enter("prefill")
        state = self._prefill(request)
        # the rounds that follow (a long prompt's at the prefill's count)
        self.threads.enter("decode", cache_length(state.target_cache))
        return state

    def _prefill(self, request: Request) -> DecodeState:
        lm = self.target
        state = DecodeState(request=request, prompt=lm.adapter.prompt_text(lm, request.messages))
        state.target_generator, state.draft_generator = make_generators(request.seed)
        if self.length is not None:
            self.length.start(state)
            # drafting is off (it did not pay in this process's last rounds): a drafter that
            # can is prefilled at this request's first drafted round, if any
            state.length.deferred = self.length.off and self.drafter.late_prefill
        t0 = time.perf_counter()
        if self.runs_target:
            # a self-speculative drafter shares layers with the target and runs its
            # prefill itself (setting target_cache and target_next_logits)
            self.drafter.prefill(state)
            state.stats.prefill_s = time.perf_counter() - t0
            return state
        videos = {"videos": request.videos} if request.videos else {}
        inputs = lm.adapter.encode(lm, state.prompt, request.images or None, **videos)
        deferred = state.length is not None and state.length.deferred
        if not deferred:
            self.drafter.prepare(state)   # e.g. start the captioner alongside the prefill
        state.target_cache = lm.adapter.new_cache(lm)
        if self.hidden_layer is None:
            state.target_next_logits = lm.adapter.prefill(lm, inputs, state.target_cache)[0]
        else:
            logits, hidden = lm.adapter.prefill_hidden(lm, inputs, state.target_cache,
                                                       self.hidden_layer)
            ids = inputs["input_ids"][0]
            state.target_next_logits = logits[0]
            pos = inputs.get("position_ids")     # (3, 1, L): M-RoPE families
            state.features = TargetFeatures(hidden[0], 0, ids, lm.adapter.visual_mask(lm, ids),
                                            None if pos is None or pos.dim() != 3 else pos[:, 0])
        if not deferred:
            self.drafter.prefill(state)
        state.stats.prefill_s = time.perf_counter() - t0
        return state

    def step(self, state: DecodeState) -> None:
        """One draft → verify → accept round."""
        remaining = state.request.max_new_tokens - len(state.tokens)
        # at most remaining - 1 proposals: the target always adds one token of its own
        budget = min(self.gamma, remaining - 1)
        if self.length is not None:
            self._auto_step(state, budget)
            return
        proposal = self.drafter.propose(state, budget) if budget > 0 else Draft([])
        commit(state, proposal.verify(self, state), self.drafter, self.eos_ids)

    def _auto_step(self, state: DecodeState, budget: int) -> None:
        """A round whose length ``self.length`` chooses (0: a plain target step), timed for
        its cost model: the drafting, then verification and commit (no device sync: each
        ends reading its tokens back to the host). A drafter whose prefill was deferred
        is prefilled at the first round that drafts, and catches up there on the tokens
        decoded so far; until then the rounds commit without it."""
        k = self.length.choose(state, budget) if budget > 0 else 0
        pending = len(state.target_pending)   # fed with the proposals (none in round one)
        t0 = time.perf_counter()
        if k > 0 and state.length.deferred:
            self.drafter.prefill(state)
            state.length.deferred = False
        proposal = self.drafter.propose(state, k) if k > 0 else Draft([])
        t1 = time.perf_counter()
        verdict = proposal.verify(self, state)
        commit(state, verdict, _NO_DRAFTER if state.length.deferred else self.drafter,
               self.eos_ids)
        t2 = time.perf_counter()
        self.length.observe(state, k, levels=proposal.levels, fed=pending + verdict.drafted,
                            drafted=verdict.drafted, accepted=len(verdict.accepted),
                            draft_s=t1 - t0, verify_s=t2 - t1)

    def extend(self, state: DecodeState, ids: torch.Tensor, **extra) -> torch.Tensor:
        """Target logits (n, V) for ``ids`` (1, n) after the target cache (``extra``: a tree's
        4-D mask and positions). A self-speculative drafter runs the forward itself; for a
        hidden-state drafter the chosen layer's rows are kept on ``state.features`` (from
        the cache's end)."""
        if self.runs_target:
            return self.drafter.extend_target(state, ids, **extra)[0]
        lm = self.target
        if self.hidden_layer is None:
            return lm.adapter.extend(lm, ids, state.target_cache, **extra)[0]
        start = cache_length(state.target_cache)
        logits, hidden = lm.adapter.extend_hidden(lm, ids, state.target_cache, self.hidden_layer,
                                                  **extra)
        state.features = TargetFeatures(hidden[0], start)
        return logits[0]

    def finish(self, state: DecodeState) -> None:
        """After the last round (or a prefill timed alone): the drafter's record, and the
        target cache's buffers back to its pool, for the next request to decode in."""
        if state.length is None or not state.length.deferred:   # (never prefilled: no record)
            self.drafter.finish(state)
        if self.length is not None:
            self.length.finish(state)
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
        state.stats.wall_s = time.perf_counter() - t0
        return Result(list(state.tokens), decode_text(self.target, state.tokens, self.eos_ids), state)


# what a round commits to while the drafter's prefill is deferred (it drafts nothing)
_NO_DRAFTER = Drafter()


def eos_token_ids(lm: LoadedModel) -> set[int]:
    """The tokens that end a generation (the family decides: EOS for text, none for an
    image grid)."""
    return lm.adapter.stop_token_ids(lm)


def decode_text(lm: LoadedModel, tokens: list[int], eos_ids: set[int]) -> str:
    return lm.tokenizer.decode([t for t in tokens if t not in eos_ids],
                               skip_special_tokens=True).strip()
