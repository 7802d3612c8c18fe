"""Drafting across tokenizers: a draft whose token ids are not the target's (a text-only
Llama or Qwen2 draft with a VLM target, as TABED's LLaMA-68M with LLaVA-1.5 where the
vocabularies differ) proposes through text, the way transformers' universal assisted
decoding does. It is method ``chain`` with input T or C; ``load_draft`` picks it when the
two tokenizers differ.

One round, for a request whose committed tokens decode (target tokenizer) to text S:

1. the draft's context is its own encoding of the prompt (read through T or C) followed by
   its encoding of S; its cache keeps the longest prefix it shares with that context and
   is fed the rest;
2. the draft continues for up to γ of its own tokens (argmax, or sampled from its q with
   the request's draft generator), stopping before its end-of-sequence token;
3. the continuation is decoded to text D and S + D encoded with the target's tokenizer:
   the proposals are the target tokens after the committed ones (D alone, encoded, where
   S + D does not re-encode to the committed tokens first).

The proposals are a function of the draft's own samples only, so at T > 0 they are
verified as draws from a point mass (verify.point_mass: exact whatever the draft's law);
at T = 0 as any greedy chain. Proposals whose text does not survive the round trip cost
acceptance, never exactness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vlmspec_cli.drafters.base import DraftingMethod
from vlmspec_cli.drafters.inputs import input_prompt, visuals
from vlmspec_cli.runtime.adapters.base import truncate_cache
from vlmspec_cli.runtime.round.draft import Draft
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.round.verify import SamplingParams, point_mass, probabilities

TEXT_INPUTS = ("text", "caption")   # the draft reads no image: its ids are not the target's


class TextCodec:
    """A tokenizer's text <-> ids without special tokens, through its Rust backend where it
    has one (several times faster per call than transformers' wrapper, which matters at a
    few calls per round), else through the wrapper."""

    def __init__(self, tokenizer) -> None:
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        if self.backend is not None:
            return self.backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids)


@dataclass
class RetokenizedState:
    cache: Any
    prompt_ids: list[int]       # the draft's encoding of the prompt (read through T or C)
    fed: list[int]              # the draft ids its cache holds, in order
    logits: torch.Tensor        # the draft's next-token logits after ``fed``


class RetokenizedDrafter(DraftingMethod):
    """Chain drafting with a draft of another tokenizer (built by ChainDrafter.from_profile)."""

    name = "chain"
    late_prefill = True   # prefill: the request only; propose catches up on the tokens

    def __init__(self, draft, target, sampling: SamplingParams, drafting_input: str = "text",
                 image_token=None, captioner=None) -> None:
        if drafting_input not in TEXT_INPUTS:
            raise ValueError(f"draft '{draft.name}' has another tokenizer than the target: it "
                             f"reads requests as text (drafting.inputs [text] or [caption]), not "
                             f"'{drafting_input}'")
        self.draft = draft
        self.target_text = TextCodec(target.tokenizer)
        self.draft_text = TextCodec(draft.tokenizer)
        self.target_vocab = target.vocab_size
        self.sampling = sampling
        self.drafting_input = drafting_input
        self.image_token = image_token
        self.captioner = captioner
        self.draft_eos = draft.adapter.stop_token_ids(draft)
        self.draft_vocab = len(draft.tokenizer)   # ids past it are padding rows of the head

    def check_batch(self) -> None:
        raise ValueError(f"draft '{self.draft.name}' has another tokenizer than the target: it "
                         "drafts one request at a time (use --batch-size 1)")

    # -- request setup ---------------------------------------------------------------
    def prepare(self, state: DecodeState) -> None:
        if self.drafting_input == "caption" and state.request.images:
            state.drafter_state = self.captioner.submit(state.request.images)

    def prefill(self, state: DecodeState) -> None:
        captions: list[str] = []
        if self.drafting_input == "caption" and state.request.images:
            future = state.drafter_state or self.captioner.submit(state.request.images)
            captions, seconds = future.result()
            state.stats.caption_s += seconds
        text = input_prompt(state.prompt, visuals(state.request), self.drafting_input,
                            self.image_token, captions)
        ids = self.draft.tokenizer(text)["input_ids"]
        lm = self.draft
        cache = lm.adapter.new_cache(lm)
        logits = lm.adapter.prefill(lm, {"input_ids": torch.tensor([ids], device=lm.device)}, cache)
        state.drafter_state = RetokenizedState(cache, list(ids), list(ids), logits[0])

    # -- one round -------------------------------------------------------------------
    def _sync(self, st: RetokenizedState, context: list[int]) -> None:
        """Bring the draft cache to ``context``: keep the prefix it shares with what the
        cache holds (at least one id is fed, for the next logits), feed the rest."""
        common = 0
        for a, b in zip(st.fed, context):
            if a != b:
                break
            common += 1
        if common == len(context) == len(st.fed):
            return
        keep = min(common, len(context) - 1)
        truncate_cache(st.cache, keep)
        lm = self.draft
        ids = torch.tensor([context[keep:]], device=lm.device)
        st.logits = lm.adapter.extend(lm, ids, st.cache)[0, -1]
        st.fed = list(context)

    def _continue(self, st: RetokenizedState, steps: int,
                  generator: torch.Generator | None) -> list[int]:
        """Up to ``steps`` draft ids after ``st.fed``, stopped before the draft's EOS."""
        lm, new = self.draft, []
        for i in range(steps):
            logits = st.logits[: self.draft_vocab].float()
            if self.sampling.greedy:
                tok = int(logits.argmax())
            else:
                q = probabilities(logits, self.sampling).cpu()
                tok = int(torch.multinomial(q, 1, generator=generator))
            if tok in self.draft_eos:
                break
            new.append(tok)
            if i + 1 < steps:
                st.logits = lm.adapter.extend(lm, torch.tensor([[tok]], device=lm.device), st.cache)[0, -1]
                st.fed.append(tok)
        return new

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        st: RetokenizedState = state.drafter_state
        d_tok, t_tok = self.draft_text, self.target_text
        said = t_tok.decode(state.tokens)
        said_ids = d_tok.encode(said) if said else []
        self._sync(st, st.prompt_ids + said_ids)
        new = self._continue(st, max_tokens, state.draft_generator)
        if not new:
            return Draft([])
        base = d_tok.decode(said_ids)
        full = d_tok.decode(said_ids + new)
        text = full[len(base):] if full.startswith(base) else d_tok.decode(new)
        text = text.rstrip("\ufffd")      # a multi-byte character cut by the last draft id
        if not text:
            return Draft([])
        ids = t_tok.encode(said + text)
        if ids[: len(state.tokens)] == state.tokens:
            tokens = ids[len(state.tokens):]
        else:                             # the boundary re-encodes differently
            tokens = t_tok.encode(text)
        # ids past the target's head (a tokenizer larger than its table) are never proposed
        tokens = tokens[: next((i for i, t in enumerate(tokens) if t >= self.target_vocab),
                               len(tokens))][:max_tokens]
        if self.sampling.greedy or not tokens:
            return Draft(tokens)
        return Draft(tokens, point_mass(tokens, self.target_vocab))
