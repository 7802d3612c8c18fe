"""The draft → verify → accept loop. Acceptance itself is decided in ``verify.py``.

One round, for a request whose target cache holds the prompt and the committed tokens
except ``pending`` (the token the target added last round, not yet run through it):

1. the drafter proposes up to γ tokens x_1..x_n (never past max_new_tokens, cut at EOS);
2. one target forward over pending + x_1..x_n gives p_1..p_{n+1};
3. ``verify_chain`` accepts x_1..x_k and adds one token of the target's;
4. the target cache is rolled back to the accepted prefix, the drafter rolls back its own.

Each round emits accepted + 1 tokens, so new_tokens = num_accepted_tokens + num_drafts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from vlmspec_cli.drafters.base import Draft, Drafter
from vlmspec_cli.runtime.adapters.base import cache_length, select_cache_positions, truncate_cache
from vlmspec_cli.runtime.models import LoadedModel
from vlmspec_cli.runtime.request import DecodeState, Request, TargetFeatures, make_generators
from vlmspec_cli.runtime.tree import DraftTree, tree_mask
from vlmspec_cli.runtime.verify import SamplingParams, next_token, verify_chain, verify_tree


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
        self.runs_target = bool(getattr(drafter, "runs_target", False))
        self.eos_ids = eos_token_ids(target)
        # hidden-state drafters (HiViS/Sparrow) read this layer of the target's forwards
        self.hidden_layer = (drafter.hidden_layer if getattr(drafter, "needs_target_hidden", False)
                             and not self.runs_target else None)
        # LANTERN relaxed acceptance of tree nodes (verify.Relaxation; lossy, opt-in)
        self.relax = None

    # -- one request -----------------------------------------------------------------
    def start(self, request: Request) -> DecodeState:
        """Prefill target and drafter; the target's prefill logits give the first token's
        distribution (kept as ``target_next_logits``, consumed by the first round)."""
        lm = self.target
        state = DecodeState(request=request, prompt=lm.adapter.prompt_text(lm, request.messages))
        state.target_generator, state.draft_generator = make_generators(request.seed)
        t0 = time.perf_counter()
        if self.runs_target:
            # a self-speculative drafter shares layers with the target and runs its
            # prefill itself (setting target_cache and target_next_logits)
            self.drafter.prefill(state)
            state.stats.prefill_s = time.perf_counter() - t0
            return state
        videos = {"videos": request.videos} if request.videos else {}
        inputs = lm.adapter.encode(lm, state.prompt, request.images or None, **videos)
        if hasattr(self.drafter, "prepare"):  # e.g. start the captioner alongside the prefill
            self.drafter.prepare(state)
        state.target_cache = lm.adapter.new_cache(lm)
        if self.hidden_layer is None:
            state.target_next_logits = lm.adapter.prefill(lm, inputs, state.target_cache)[0]
        else:
            logits, hidden = lm.adapter.prefill_hidden(lm, inputs, state.target_cache,
                                                       self.hidden_layer)
            ids = inputs["input_ids"][0]
            state.target_next_logits = logits[0]
            state.features = TargetFeatures(hidden[0], 0, ids, lm.adapter.visual_mask(lm, ids))
        self.drafter.prefill(state)
        state.stats.prefill_s = time.perf_counter() - t0
        return state

    def step(self, state: DecodeState) -> None:
        """One draft → verify → accept round."""
        lm = self.target
        remaining = state.request.max_new_tokens - len(state.tokens)
        # at most remaining - 1 proposals: the target always adds one token of its own
        budget = min(self.gamma, remaining - 1)
        draft = self.drafter.propose(state, budget) if budget > 0 else Draft([])
        if isinstance(draft, DraftTree):
            self._step_tree(state, draft)
            return
        draft = self._cut_at_eos(draft)

        # p_1..p_{n+1}: one target forward over the pending token and the proposals
        feed = state.target_pending + draft.tokens
        rows = []
        if state.target_next_logits is not None:
            rows.append(state.target_next_logits[None])
        if feed:
            ids = torch.tensor([feed], device=lm.device)
            if self.runs_target:
                logits = self.drafter.extend_target(state, ids)[0]
            else:
                logits = self._extend(state, ids)
            rows.append(logits[len(state.target_pending) - 1 if state.target_pending else 0:])
        target_logits = torch.cat(rows, dim=0)[: len(draft) + 1]

        n_acc, tok = verify_chain(draft.tokens, draft.probs, target_logits, self.sampling,
                                  state.target_generator)

        # keep the cache up to the last accepted proposal; `tok` becomes pending
        base = cache_length(state.target_cache) - len(draft)
        truncate_cache(state.target_cache, base + n_acc)
        state.target_pending = [tok]
        state.target_next_logits = None
        state.tokens.extend(draft.tokens[:n_acc])
        state.tokens.append(tok)
        self.drafter.accept(state, n_acc, target_logits)
        state.stats.record_round(len(draft), n_acc, n_acc + 1)
        if tok in self.eos_ids or len(state.tokens) >= state.request.max_new_tokens:
            state.done = True

    def _step_tree(self, state: DecodeState, tree: DraftTree) -> None:
        """A tree round: one target forward over the pending token and every node (4-D
        mask: a node sees the cache, the pending token, its ancestors and itself; node i at
        position base + depth_i), ``verify_tree`` picks the accepted path, and the target
        cache keeps only that path (index_select)."""
        lm = self.target
        past = cache_length(state.target_cache)
        lead = len(state.target_pending)
        if len(tree):
            ids = torch.tensor([state.target_pending + tree.tokens], device=lm.device)
            positions = torch.tensor([list(range(past, past + lead)) +
                                      [past + lead + d for d in tree.depth]], device=lm.device)
            mask = tree_mask(tree, past, lead, lm.dtype, lm.device)
            logits = self._extend(state, ids, attention_mask=mask, position_ids=positions)
            root = logits[lead - 1] if lead else state.target_next_logits
            node_logits = logits[lead:]
        else:  # nothing drafted: an ordinary step of the pending token
            root = (self._extend(state, torch.tensor([state.target_pending], device=lm.device))[-1]
                    if lead else state.target_next_logits)
            node_logits = None
        path, tok = verify_tree(tree, root, node_logits, self.sampling, state.target_generator,
                                self.relax)
        select_cache_positions(state.target_cache,
                               list(range(past + lead)) + [past + lead + n for n in path])
        if state.features is not None and len(tree):  # the kept rows: pending, then the path
            rows = state.features.hidden
            state.features = TargetFeatures(torch.cat([rows[:lead], rows[lead:][path]]), past)
        tree.accepted = path
        accepted = [tree.tokens[n] for n in path]
        state.target_pending = [tok]
        state.target_next_logits = None
        state.tokens.extend(accepted)
        state.tokens.append(tok)
        verified = torch.cat([root[None]] + ([node_logits[path]] if path else []))
        self.drafter.accept(state, len(path), verified)
        state.stats.record_round(len(tree), len(path), len(path) + 1, positions=tree.max_depth)
        if tok in self.eos_ids or len(state.tokens) >= state.request.max_new_tokens:
            state.done = True

    def _extend(self, state: DecodeState, ids: torch.Tensor, **extra) -> torch.Tensor:
        """Target logits (n, V) for ``ids`` after the cache; for a hidden-state drafter
        also keeps the chosen layer's rows on ``state.features`` (from the cache's end)."""
        lm = self.target
        if self.hidden_layer is None:
            return lm.adapter.extend(lm, ids, state.target_cache, **extra)[0]
        start = cache_length(state.target_cache)
        logits, hidden = lm.adapter.extend_hidden(lm, ids, state.target_cache, self.hidden_layer,
                                                  **extra)
        state.features = TargetFeatures(hidden[0], start)
        return logits[0]

    def _cut_at_eos(self, draft: Draft) -> Draft:
        # An EOS proposal is never verified: nothing can follow it, and a chain that stops
        # early is still verified exactly (its length depends only on the draft's samples).
        for i, t in enumerate(draft.tokens):
            if t in self.eos_ids:
                return draft.truncated(i)
        return draft

    def generate(self, request: Request, progress: ProgressFn | None = None) -> Result:
        t0 = time.perf_counter()
        state = self.start(request)
        while not state.done:
            self.step(state)
            if progress is not None:
                progress(state)
        if hasattr(self.drafter, "finish"):
            self.drafter.finish(state)
        state.stats.wall_s = time.perf_counter() - t0
        return Result(list(state.tokens), decode_text(self.target, state.tokens, self.eos_ids), state)


def eos_token_ids(lm: LoadedModel) -> set[int]:
    """The tokens that end a generation (the family decides: EOS for text, none for an
    image grid)."""
    return lm.adapter.stop_token_ids(lm)


def decode_text(lm: LoadedModel, tokens: list[int], eos_ids: set[int]) -> str:
    return lm.tokenizer.decode([t for t in tokens if t not in eos_ids],
                               skip_special_tokens=True).strip()
