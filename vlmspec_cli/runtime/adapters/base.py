"""What the engine needs from a model family: inputs, image tokens, cached forwards."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache



class ModelAdapter:
    model_types: tuple[str, ...] = ()
    model_class: Any = None
    takes_images: bool = False

    def supports(self, config) -> bool:
        return config.model_type in self.model_types

    # -- prompts ---------------------------------------------------------------------
    def image_token(self, lm) -> str | None:
        for holder in (lm.processor, lm.tokenizer):
            token = getattr(holder, "image_token", None)
            if isinstance(token, str):
                return token
        return None

    def image_token_id(self, lm) -> int | None:
        return None

    def prompt_text(self, lm, messages, add_generation_prompt: bool = True) -> str:
        """Render a conversation (objects with role, text, images) with the chat template."""
        chat = []
        for m in messages:
            content = [{"type": "image"} for _ in m.images] + [{"type": "text", "text": m.text}]
            chat.append({"role": m.role, "content": content})
        holder = lm.processor if getattr(lm.processor, "chat_template", None) else lm.tokenizer
        if getattr(holder, "chat_template", None):
            return holder.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        # No chat template (a plain LM): a minimal USER/ASSISTANT transcript.
        image = self.image_token(lm) or "<image>"
        parts = []
        for m in messages:
            head = "USER: " if m.role == "user" else "ASSISTANT: "
            parts.append(head + "".join(f"{image}\n" for _ in m.images) + m.text)
        return " ".join(parts) + (" ASSISTANT:" if add_generation_prompt else "")

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        """Token ids (and pixel inputs) for one request, batch dimension 1, on lm.device."""
        # special tokens (BOS) as the model's processor would add them for the target
        enc = lm.tokenizer(prompt, return_tensors="pt")
        return {"input_ids": enc["input_ids"].to(lm.device)}

    def embed(self, lm, prompt: str, images: list | None, pool: int = 1) -> torch.Tensor:
        """The prompt as input embeddings (1, L, H): what ``encode`` feeds the model, with
        image features already in place (so rows of different kinds can share a batch)."""
        ids = self.encode(lm, prompt, None)["input_ids"]
        return lm.model.get_input_embeddings()(ids)

    # -- forwards --------------------------------------------------------------------
    def new_cache(self, lm) -> DynamicCache:
        return DynamicCache(config=lm.model.config)

    @torch.inference_mode()
    def prefill(self, lm, inputs: dict[str, torch.Tensor], cache) -> torch.Tensor:
        """Run the prompt; returns logits of the last position, shape (B, V)."""
        out = lm.model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    @torch.inference_mode()
    def extend(self, lm, input_ids: torch.Tensor, cache, **extra) -> torch.Tensor:
        """Feed new tokens (B, n) after the cached ones; returns logits (B, n, V).
        ``extra``: attention_mask / position_ids for left-padded batches."""
        out = lm.model(input_ids=input_ids, past_key_values=cache, use_cache=True, **extra)
        return out.logits


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def truncate_cache(cache, length: int) -> None:
    """Roll a KV cache back to its first ``length`` positions (transformers v5: crop takes
    the negative number of positions to drop)."""
    extra = cache_length(cache) - length
    if extra < 0:
        raise ValueError(f"cannot grow a cache by truncation ({cache_length(cache)} -> {length})")
    if extra:
        cache.crop(-extra)
