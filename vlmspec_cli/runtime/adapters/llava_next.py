"""LLaVA-NeXT family (LlavaNextForConditionalGeneration, "anyres"): an image is seen as a
base view plus tiles cut at the best of ``image_grid_pinpoints`` for its size, and the
tiles' features are packed as a grid whose rows each end with the learned
``image_newline`` token. So an image's token count depends on its size: the processor
expands each placeholder to it and returns ``image_sizes``, which the model's forward
needs to unpack the tiles again.

Everything else (the Llama/Mistral/Vicuna decoder under ``language_model``, caches, the
fast path, hidden states, the twig's layer stack) is the LLaVA adapter's.
"""

from __future__ import annotations

import torch
from transformers import LlavaNextForConditionalGeneration

from vlmspec_cli.runtime.adapters.base import ModelAdapter
from vlmspec_cli.runtime.adapters.llava import LlavaAdapter


class LlavaNextAdapter(LlavaAdapter):
    model_types = ("llava_next",)
    model_class = LlavaNextForConditionalGeneration
    quant_skip_modules = LlavaAdapter.quant_skip_modules + ("image_newline", ".*image_newline")

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        if not images:
            return ModelAdapter.encode(self, lm, prompt, None)
        enc = self._processor(lm)(images=list(images), text=[prompt], return_tensors="pt")
        return {"input_ids": enc["input_ids"].to(lm.device),
                "pixel_values": enc["pixel_values"].to(lm.device, dtype=lm.dtype),
                "image_sizes": enc["image_sizes"].to(lm.device)}

    # why pooled drafting (input P) cannot serve the family
    pool_refusal = "LLaVA-NeXT, whose anyres tiles and row-end tokens it cannot pool"

    def image_inputs(self, lm, images: list) -> dict[str, torch.Tensor]:
        """pixel_values and image_sizes of one request's images (the image processor's)."""
        enc = self._processor(lm).image_processor(list(images), return_tensors="pt")
        return {"pixel_values": enc["pixel_values"].to(lm.device, dtype=lm.dtype),
                "image_sizes": enc["image_sizes"].to(lm.device)}

    @torch.inference_mode()
    def image_features(self, lm, images: list, pool: int = 1) -> list[torch.Tensor]:
        """Each image's packed features (tokens_i, H), newline tokens included: what the
        model's own forward puts at that image's placeholders."""
        if pool != 1:
            raise ValueError(f"pooled drafting (input P) averages a square patch grid; '{lm.name}' "
                             f"is {self.pool_refusal} (use inputs multimodal, text or caption)")
        config = lm.model.config
        out = lm.model.model.get_image_features(
            **self.image_inputs(lm, images),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy)
        return list(out.pooler_output)

    @torch.inference_mode()
    def prompt_embeds(self, lm, prompt: str, images: list | None,
                      pool: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        if not images:
            return ModelAdapter.prompt_embeds(self, lm, prompt, None)
        ids = self.encode(lm, prompt, images)["input_ids"]     # placeholders expanded
        features = torch.cat(self.image_features(lm, images, pool))
        embeds = lm.model.get_input_embeddings()(ids)
        mask = ids[0] == self.image_token_id(lm)
        if int(mask.sum()) != features.shape[0]:
            raise ValueError(f"'{lm.name}': the processor expanded {int(mask.sum())} image tokens "
                             f"where the model gives {features.shape[0]} features (processor and "
                             "model configs disagree: patch_size, num_additional_image_tokens?)")
        embeds[0, mask] = features.to(embeds.dtype)
        return embeds, mask
