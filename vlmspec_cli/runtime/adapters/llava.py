"""LLaVA family (LlavaForConditionalGeneration): one image placeholder per image in the
prompt, expanded by the processor to the vision tower's patch count."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import LlavaForConditionalGeneration

from vlmspec_cli.runtime.adapters.base import ModelAdapter


class LlavaAdapter(ModelAdapter):
    model_types = ("llava",)
    model_class = LlavaForConditionalGeneration
    takes_images = True
    # bitsandbytes keeps these in the model's dtype (the vision tower is small and its
    # widths need not fit 4-bit blocks); ".*x" matches x at any depth of the module path
    quant_skip_modules = ("vision_tower", ".*vision_tower", "multi_modal_projector",
                          ".*multi_modal_projector", "lm_head")

    def image_token_id(self, lm) -> int | None:
        return int(lm.model.config.image_token_id)

    def _processor(self, lm):
        if lm.processor is None:
            raise ValueError(f"model '{lm.name}' has no processor to turn images into inputs")
        return lm.processor

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        if not images:
            return super().encode(lm, prompt, None)
        enc = self._processor(lm)(images=list(images), text=[prompt], return_tensors="pt")
        out = {"input_ids": enc["input_ids"].to(lm.device)}
        out["pixel_values"] = enc["pixel_values"].to(lm.device, dtype=lm.dtype)
        return out

    def fast_prompt_embeds(self, lm, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Token embeddings with each image's projected features in its placeholder rows,
        as LlavaModel.forward builds them (inputs from this class's own ``encode``;
        families that encode more, such as image sizes, keep the model's forward)."""
        if set(inputs) != {"input_ids", "pixel_values"} or type(self).encode is not LlavaAdapter.encode:
            return super().fast_prompt_embeds(lm, inputs)
        ids = inputs["input_ids"]
        embeds = lm.model.get_input_embeddings()(ids)
        features = lm.model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
        features = torch.cat(list(features), dim=0).to(embeds.dtype)
        slots = (ids == self.image_token_id(lm))[..., None].expand_as(embeds)
        if int(slots[..., 0].sum()) != features.shape[0]:
            return None   # let the model's forward report the mismatch
        return embeds.masked_scatter(slots, features)

    @torch.inference_mode()
    def image_features(self, lm, images: list, pool: int = 1) -> torch.Tensor:
        """Projected image features (n_images, tokens, H). ``pool`` > 1 average-pools the
        vision tower's patch grid (pool x pool windows, 2-D, before the projector: TABED
        §6.1 pooled drafting, 24x24 -> 12x12 patches for LLaVA-1.5 at pool=2)."""
        pix = self._processor(lm).image_processor(list(images), return_tensors="pt")["pixel_values"]
        pix = pix.to(lm.device, dtype=lm.dtype)
        model = lm.model.model
        if pool == 1:
            return torch.stack(list(model.get_image_features(pixel_values=pix).pooler_output))
        config = lm.model.config
        layer = config.vision_feature_layer
        if not isinstance(layer, int):
            raise ValueError(f"pooled drafting needs one vision feature layer, '{lm.name}' "
                             f"concatenates {layer}")
        hidden = model.vision_tower(pix, output_hidden_states=True, return_dict=True).hidden_states[layer]
        if config.vision_feature_select_strategy == "default":
            hidden = hidden[:, 1:]  # drop CLS
        n, side = hidden.shape[1], math.isqrt(hidden.shape[1])
        if side * side != n:
            raise ValueError(f"pooled drafting needs a square patch grid, '{lm.name}' has {n} patches")
        grid = hidden.transpose(1, 2).reshape(hidden.shape[0], hidden.shape[2], side, side)
        # ceil_mode: an odd grid keeps its last row/column; edge windows average only the
        # patches they cover (3x3 -> 2x2)
        pooled = F.avg_pool2d(grid, pool, ceil_mode=True)
        return model.multi_modal_projector(pooled.flatten(2).transpose(1, 2))

    @torch.inference_mode()
    def prompt_embeds(self, lm, prompt: str, images: list | None,
                      pool: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        if not images:
            return super().prompt_embeds(lm, prompt, None)
        image_id = self.image_token_id(lm)
        ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"][0]
        slots = (ids == image_id).nonzero().flatten().tolist()
        if len(slots) != len(images):
            raise ValueError(f"prompt has {len(slots)} image placeholders for {len(images)} images")
        features = self.image_features(lm, images, pool)       # (n_images, k, H)
        k = features.shape[1]
        # each placeholder becomes k image tokens, as the processor expands it
        reps = torch.ones_like(ids)
        reps[slots] = k
        ids = ids.repeat_interleave(reps)[None].to(lm.device)
        embeds = lm.model.get_input_embeddings()(ids)
        mask = ids[0] == image_id
        embeds[0, mask] = features.reshape(-1, features.shape[-1]).to(embeds.dtype)
        return embeds, mask
