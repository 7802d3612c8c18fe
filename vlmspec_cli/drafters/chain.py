"""``chain``: a separate small draft model proposes γ tokens one by one.

Input variants (TABED §4, App. I.2): ``multimodal`` (M) gives the draft the images and the
full prompt, like the target; ``text`` (T) gives it the same prompt with every image
placeholder replaced by "\\n" and no images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vlmspec_cli.drafters.base import Draft, register
from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.verify import SamplingParams, probabilities

INPUT_VARIANTS = ("multimodal", "text")


@dataclass
class ChainState:
    cache: Any
    prompt_len: int          # positions of the draft's own prompt in its cache
    covered: int = 0         # generated tokens already in the cache
    next_logits: torch.Tensor | None = None  # after prefill: logits for the first token
    proposed: int = 0        # proposals fed into the cache during the last propose()


def encode_variant(lm, prompt: str, images: list, variant: str) -> dict[str, torch.Tensor]:
    """The draft's inputs for one request under an input variant."""
    adapter = lm.adapter
    if variant == "multimodal":
        return adapter.encode(lm, prompt, images or None)
    if variant == "text":
        return adapter.encode(lm, adapter.text_only_prompt(prompt, adapter.image_token(lm)), None)
    raise ValueError(f"unknown drafting input '{variant}' for chain (choose from {INPUT_VARIANTS})")


@register("chain")
class ChainDrafter:
    name = "chain"
    needs_target_hidden = False
    lossless = True

    def __init__(self, draft, sampling: SamplingParams, variant: str = "multimodal",
                 image_token: str | None = None, **_: object) -> None:
        if variant not in INPUT_VARIANTS:
            raise ValueError(f"chain drafting supports inputs {INPUT_VARIANTS}, not '{variant}'")
        self.draft = draft
        self.sampling = sampling
        self.variant = variant
        # the target's image placeholder: the prompt text is rendered by the target
        self.image_token = image_token

    def prefill(self, state: DecodeState) -> None:
        lm = self.draft
        prompt = state.prompt
        if self.variant == "text" and self.image_token:
            prompt = lm.adapter.text_only_prompt(prompt, self.image_token)
            inputs = lm.adapter.encode(lm, prompt, None)
        else:
            inputs = encode_variant(lm, prompt, state.request.images, self.variant)
        cache = lm.adapter.new_cache(lm)
        logits = lm.adapter.prefill(lm, inputs, cache)
        state.drafter_state = ChainState(cache, cache_length(cache), 0, logits[0])

    def _choose(self, logits: torch.Tensor, state: DecodeState) -> tuple[int, torch.Tensor | None]:
        if self.sampling.greedy:
            return int(logits.argmax(-1).item()), None
        q = probabilities(logits, self.sampling)
        return int(torch.multinomial(q, 1, generator=state.draft_generator).item()), q

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        st: ChainState = state.drafter_state
        lm = self.draft
        unseen = state.tokens[st.covered:]
        if unseen:  # committed tokens the draft has not read yet (bonus/correction tokens)
            ids = torch.tensor([unseen], device=lm.device)
            logits = lm.adapter.extend(lm, ids, st.cache)[0, -1]
            st.covered = len(state.tokens)
        else:
            logits = st.next_logits
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(max_tokens):
            tok, q = self._choose(logits, state)
            tokens.append(tok)
            if q is not None:
                probs.append(q)
            if i + 1 < max_tokens:
                ids = torch.tensor([[tok]], device=lm.device)
                logits = lm.adapter.extend(lm, ids, st.cache)[0, -1]
        st.proposed = max(0, len(tokens) - 1)
        st.next_logits = None
        return Draft(tokens, torch.stack(probs) if probs else None)

    def accept(self, state: DecodeState, n_accepted: int) -> None:
        st: ChainState = state.drafter_state
        # the cache holds the first `proposed` proposals; keep the accepted ones
        keep = min(n_accepted, st.proposed)
        truncate_cache(st.cache, st.prompt_len + st.covered + keep)
        st.covered += keep
        st.proposed = 0
