"""Mistral 3 family (Mistral3ForConditionalGeneration: Mistral-Small-3.1/3.2 and kin):
a Pixtral vision tower, a patch merger and an MLP projector over a Mistral decoder.

An image keeps its aspect ratio: the image processor scales it to fit ``longest_edge`` and
rounds each side up to a multiple of patch_size x spatial_merge_size. The tower sees the
(rows x cols) patch grid, the merger folds 2x2 patches into one feature, and the prompt
holds one ``[IMG]`` per merged feature, each row followed by ``[IMG_BREAK]`` and the last
one's break replaced by ``[IMG_END]`` (the break and end tokens are plain text embeddings).
``image_sizes`` (the processed heights and widths) tells the model's forward the grids.

The inputs are built here, not by transformers' PixtralProcessor: that class needs
torchvision, which this runtime does not depend on. The image processor's PIL backend
gives the pixels; the placeholders are expanded by the processor's rule above, and
``encode`` / ``prompt_embeds`` give what the model's own forward builds from them.

Everything else (the Llama-style Mistral decoder under ``language_model``, caches, the
fast path, hidden states, the twig's layer stack) is the LLaVA adapter's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Mistral3ForConditionalGeneration

from vlmspec_cli.runtime.adapters.base import ModelAdapter
from vlmspec_cli.runtime.adapters.llava import LlavaAdapter

_TOKENS = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}


def _model_file(source: str, name: str) -> str | None:
    """The path of ``name`` in a model directory or in the local hub cache (None if absent)."""
    path = Path(source)
    if path.is_dir():
        return str(path / name) if (path / name).is_file() else None
    from transformers.utils import cached_file

    try:
        return cached_file(source, name, local_files_only=True,
                           _raise_exceptions_for_missing_entries=False)
    except (OSError, ValueError):
        return None


class Mistral3Adapter(LlavaAdapter):
    model_types = ("mistral3",)
    model_class = Mistral3ForConditionalGeneration

    # -- settings: processor_config.json + preprocessor_config.json ----------------------
    def _settings(self, lm) -> dict:
        """Tokens, merged-patch size and the PIL image processor, read once per model.
        The processor's patch and merge sizes must be the model's (else the prompt would
        hold a different number of image tokens than the tower gives features)."""
        cached = lm.memo.get("mistral3")
        if cached is not None:
            return cached
        from transformers import PixtralImageProcessorPil

        config = lm.model.config
        source = str(getattr(lm.model, "name_or_path", "") or lm.name)
        settings = dict(_TOKENS, patch_size=int(config.vision_config.patch_size),
                        spatial_merge_size=int(config.spatial_merge_size))
        found = _model_file(source, "processor_config.json")
        if found:
            saved = json.loads(Path(found).read_text())
            for key in ("patch_size", "spatial_merge_size"):
                if key in saved and int(saved[key]) != settings[key]:
                    raise ValueError(f"model '{lm.name}': processor {key} {saved[key]} is not the "
                                     f"model's {settings[key]}")
            settings.update({k: saved[k] for k in _TOKENS if isinstance(saved.get(k), str)})
        pre = _model_file(source, "preprocessor_config.json")
        settings["images"] = (PixtralImageProcessorPil.from_pretrained(str(Path(pre).parent))
                              if pre else PixtralImageProcessorPil())
        settings["merged"] = settings["patch_size"] * settings["spatial_merge_size"]
        ids = lm.tokenizer.convert_tokens_to_ids([settings[k] for k in _TOKENS])
        missing = [settings[k] for k, i in zip(_TOKENS, ids) if i is None or i == lm.tokenizer.unk_token_id]
        if missing:
            raise ValueError(f"model '{lm.name}': its tokenizer has no {missing[0]} token")
        settings["ids"] = dict(zip(_TOKENS, ids))
        lm.memo["mistral3"] = settings
        return settings

    def image_token(self, lm) -> str:
        return self._settings(lm)["image_token"]

    def visual_mask(self, lm, ids: torch.Tensor) -> torch.Tensor:
        """An image's whole block: its features and its row-break / end tokens."""
        marks = self._settings(lm)["ids"].values()
        return torch.isin(ids, torch.tensor(list(marks), device=ids.device))

    # -- inputs ------------------------------------------------------------------------
    def _pixels(self, lm, images: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values (N, 3, H, W) zero-padded to the largest, image_sizes (N, 2))."""
        s = self._settings(lm)
        merged = s["merged"]
        enc = s["images"](list(images), patch_size={"height": merged, "width": merged},
                          return_tensors="pt")
        return (enc["pixel_values"].to(lm.device, dtype=lm.dtype),
                torch.as_tensor(enc["image_sizes"]).to(lm.device))

    def _expand(self, lm, prompt: str, grids: list[tuple[int, int]]) -> torch.Tensor:
        """The prompt's ids (1, L) with the i-th ``[IMG]`` replaced by the i-th image's
        (rows, cols) block: cols ``[IMG]`` then ``[IMG_BREAK]`` per row, the last break
        ``[IMG_END]`` (special tokens are split off before tokenizing, so replacing ids
        gives the ids of the processor's expanded text)."""
        marks = self._settings(lm)["ids"]
        ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"][0].tolist()
        slots = [i for i, t in enumerate(ids) if t == marks["image_token"]]
        if len(slots) != len(grids):
            raise ValueError(f"prompt has {len(slots)} image placeholders for {len(grids)} images")
        out: list[int] = []
        start = 0
        for slot, (rows, cols) in zip(slots, grids):
            block = ([marks["image_token"]] * cols + [marks["image_break_token"]]) * rows
            block[-1] = marks["image_end_token"]
            out += ids[start:slot] + block
            start = slot + 1
        out += ids[start:]
        return torch.tensor([out], device=lm.device)

    def _grids(self, lm, image_sizes: torch.Tensor, pool: int = 1) -> list[tuple[int, int]]:
        merged = self._settings(lm)["merged"]
        return [(-(-(int(h) // merged) // pool), -(-(int(w) // merged) // pool))
                for h, w in image_sizes.tolist()]

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        if not images:
            return ModelAdapter.encode(self, lm, prompt, None)
        pixels, sizes = self._pixels(lm, images)
        return {"input_ids": self._expand(lm, prompt, self._grids(lm, sizes)),
                "pixel_values": pixels, "image_sizes": sizes}

    @torch.inference_mode()
    def image_features(self, lm, images: list, pool: int = 1) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each image's features (rows·cols, H) in row order, and image_sizes. ``pool`` > 1
        average-pools each image's grid of merged features (pool x pool windows; an odd
        side keeps its last row/column, edge windows average what they cover) before the
        projector's MLP: the merger is linear, so this is the patch grid pooled and then
        merged. Pooled grids get their own [IMG_BREAK] rows (``prompt_embeds``)."""
        pixels, sizes = self._pixels(lm, images)
        model, config = lm.model.model, lm.model.config
        if pool == 1:
            out = model.get_image_features(pixel_values=pixels, image_sizes=sizes,
                                           vision_feature_layer=config.vision_feature_layer)
            return list(out.pooler_output), sizes
        layer = config.vision_feature_layer
        if not isinstance(layer, int):
            raise ValueError(f"pooled drafting needs one vision feature layer, '{lm.name}' "
                             f"concatenates {layer}")
        hidden = model.vision_tower(pixels, image_sizes=sizes, output_hidden_states=True,
                                    return_dict=True).hidden_states[layer][0]
        proj = model.multi_modal_projector
        merged = proj.patch_merger(proj.norm(hidden), sizes)
        features = []
        for part, (rows, cols) in zip(merged.split([r * c for r, c in self._grids(lm, sizes)]),
                                      self._grids(lm, sizes)):
            grid = part.T.reshape(1, part.shape[1], rows, cols)
            pooled = F.avg_pool2d(grid, pool, ceil_mode=True)[0].flatten(1).T
            features.append(proj.linear_2(proj.act(proj.linear_1(pooled))))
        return features, sizes

    @torch.inference_mode()
    def prompt_embeds(self, lm, prompt: str, images: list | None,
                      pool: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        if not images:
            return ModelAdapter.prompt_embeds(self, lm, prompt, None)
        features, sizes = self.image_features(lm, images, pool)
        ids = self._expand(lm, prompt, self._grids(lm, sizes, pool))
        features = torch.cat(features)
        embeds = lm.model.get_input_embeddings()(ids)
        mask = ids[0] == self.image_token_id(lm)
        if int(mask.sum()) != features.shape[0]:
            raise ValueError(f"'{lm.name}': {int(mask.sum())} image tokens in the prompt where the "
                             f"model gives {features.shape[0]} features")
        embeds[0, mask] = features.to(embeds.dtype)
        return embeds, mask
