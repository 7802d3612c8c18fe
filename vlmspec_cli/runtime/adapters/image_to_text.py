"""Any Hugging Face image-to-text model (BLIP, GIT, Florence-2, a small Llava, ...) used
only as the captioner of caption drafting (TABED §6.2); never as a target or draft."""

from __future__ import annotations

from transformers import AutoModelForImageTextToText

from vlmspec_cli.runtime.adapters.base import ModelAdapter


class ImageToTextAdapter(ModelAdapter):
    model_types: tuple[str, ...] = ()
    model_class = AutoModelForImageTextToText
    takes_images = True

    def supports(self, config) -> bool:
        return False  # chosen explicitly for the captioner role, as the fallback

    def encode(self, lm, prompt: str, images: list | None) -> dict:
        enc = lm.processor(images=list(images or []), text=prompt or None, return_tensors="pt")
        return {k: (v.to(lm.device, dtype=lm.dtype) if v.is_floating_point() else v.to(lm.device))
                for k, v in enc.items()}
