"""LLaVA family (LlavaForConditionalGeneration): one image placeholder per image in the
prompt, expanded by the processor to the vision tower's patch count."""

from __future__ import annotations

import torch
from transformers import LlavaForConditionalGeneration

from vlmspec_cli.runtime.adapters.base import ModelAdapter


class LlavaAdapter(ModelAdapter):
    model_types = ("llava",)
    model_class = LlavaForConditionalGeneration
    takes_images = True

    def image_token_id(self, lm) -> int | None:
        return int(lm.model.config.image_token_id)

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        if not images:
            return super().encode(lm, prompt, None)
        if lm.processor is None:
            raise ValueError(f"model '{lm.name}' has no processor to turn images into inputs")
        enc = lm.processor(images=list(images), text=[prompt], return_tensors="pt")
        out = {"input_ids": enc["input_ids"].to(lm.device)}
        out["pixel_values"] = enc["pixel_values"].to(lm.device, dtype=lm.dtype)
        return out
