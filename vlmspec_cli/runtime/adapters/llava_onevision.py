"""LLaVA-OneVision family (LlavaOnevisionForConditionalGeneration): images and videos in,
text out, on a Qwen2 decoder under ``language_model``.

Images are LLaVA-NeXT's "anyres" with two differences in the model's own packing: a
request with one image is tiled at the best of ``image_grid_pinpoints`` and its tile grid
is shrunk by bilinear interpolation when it has more than ``anyres_max_N`` tiles' worth of
patches (``vision_aspect_ratio``); a request with several images (``batch_num_images`` =
[n], as transformers' processor gives for one conversation) sees each image as one
square-padded view plus a newline token. A video (``<video>``) is its frames through the
vision tower, each frame's patch grid halved by bilinear pooling, plus one newline token.

Inputs are built here, not by ``LlavaOnevisionProcessor``: it cannot be constructed without
torchvision (its video processor needs it), which has no CPU build. Pixels of images come
from the family's PIL image processor; video frames are resized to the image processor's
tile size (bicubic, PIL), rescaled and normalized with its mean and std, as the family's
video processor does (its torchvision resize can differ from PIL's in the last bits of a
pixel). Placeholder counts are derived from the model config by the same geometry the
model's ``pack_image_features`` / ``get_video_features`` apply; ``prompt_embeds`` checks
them against the features the model actually gives.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import LlavaOnevisionForConditionalGeneration
from transformers.image_processing_utils import select_best_resolution

from vlmspec_cli.runtime.adapters.base import ModelAdapter
from vlmspec_cli.runtime.adapters.llava_next import LlavaNextAdapter


class LlavaOnevisionAdapter(LlavaNextAdapter):
    model_types = ("llava_onevision",)
    model_class = LlavaOnevisionForConditionalGeneration
    takes_videos = True
    pool_refusal = ("LLaVA-OneVision, whose anyres tiles, anyres_max shrinking and row-end "
                    "tokens it cannot pool")

    # -- tokens ----------------------------------------------------------------------
    def image_token(self, lm) -> tuple[str, str]:
        """Both placeholders, image and video: the text drafting inputs replace whichever
        a request's prompt holds (drafters/inputs.py replace_images)."""
        config = lm.model.config
        return (lm.tokenizer.convert_ids_to_tokens(int(config.image_token_id)),
                lm.tokenizer.convert_ids_to_tokens(int(config.video_token_id)))

    def video_token_id(self, lm) -> int:
        return int(lm.model.config.video_token_id)

    def visual_mask(self, lm, ids: torch.Tensor) -> torch.Tensor:
        return (ids == self.image_token_id(lm)) | (ids == self.video_token_id(lm))

    def prompt_text(self, lm, messages, add_generation_prompt: bool = True) -> str:
        """The chat template's rendering; without the processor (no torchvision) the
        template is read from the checkout's chat_template.json / .jinja when the
        tokenizer has none."""
        if not (getattr(lm.processor, "chat_template", None) or lm.tokenizer.chat_template):
            template = self._checkout_chat_template(lm)
            if template:
                lm.tokenizer.chat_template = template
        return super().prompt_text(lm, messages, add_generation_prompt)

    def _checkout_chat_template(self, lm) -> str | None:
        from transformers.utils import cached_file

        source = str(getattr(lm.model, "name_or_path", "") or lm.name)
        for name in ("chat_template.jinja", "chat_template.json"):
            path = cached_file(source, name, _raise_exceptions_for_missing_entries=False)
            if path:
                text = Path(path).read_text(encoding="utf-8")
                return json.loads(text)["chat_template"] if name.endswith(".json") else text
        return None

    # -- placeholder counts ----------------------------------------------------------
    def _grid(self, lm) -> int:
        """Patches per side of one tile (or one video frame) of the vision tower."""
        vision = lm.model.config.vision_config
        return int(vision.image_size) // int(vision.patch_size)

    def image_token_counts(self, lm, images: list) -> list[int]:
        """The image tokens the model packs for each of one request's ``images``."""
        side = self._grid(lm)
        if len(images) > 1:   # multi-image: the square-padded view plus one newline
            return [side * side + 1] * len(images)
        return [side * side + self._tiled_tokens(lm, images[0].height, images[0].width)]

    def _tiled_tokens(self, lm, height: int, width: int) -> int:
        """Tokens of a single image's tile grid: unpadded to the image's aspect ratio,
        shrunk past ``anyres_max_N``, one newline per row."""
        config = lm.model.config
        tile, side = int(config.vision_config.image_size), self._grid(lm)
        best_h, best_w = select_best_resolution((height, width), config.image_grid_pinpoints)
        rows, cols = best_h // tile * side, best_w // tile * side
        if width / height > cols / rows:
            kept = int(round(height * (cols / width), 7))
            rows -= (rows - kept) // 2 * 2
        else:
            kept = int(round(width * (rows / height), 7))
            cols -= (cols - kept) // 2 * 2
        max_tiles = int(str(config.vision_aspect_ratio).strip("anyres_max_"))
        ratio = math.sqrt(rows * cols / (max_tiles * side * side))
        if ratio > 1.1:
            rows, cols = int(rows // ratio), int(cols // ratio)
        return rows * (cols + 1)

    def video_token_count(self, lm, clip) -> int:
        """Each frame's patch grid pooled to ceil(side / 2) squared, plus one newline."""
        pooled = math.ceil(self._grid(lm) / 2)
        return len(clip.frames) * pooled * pooled + 1

    def _expanded_ids(self, lm, prompt: str, images: list, videos: list) -> torch.Tensor:
        """The prompt's ids (1, L) with every placeholder repeated to its token count."""
        ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"][0]
        reps = torch.ones_like(ids)
        kinds = (("image", self.image_token_id(lm), images,
                  lambda: self.image_token_counts(lm, images)),
                 ("video", self.video_token_id(lm), videos,
                  lambda: [self.video_token_count(lm, v) for v in videos]))
        for kind, token, items, counts in kinds:
            slots = (ids == token).nonzero().flatten()
            if len(slots) != len(items):
                raise ValueError(f"prompt has {len(slots)} {kind} placeholders for "
                                 f"{len(items)} {kind}s")
            if items:
                reps[slots] = torch.tensor(counts())
        return ids.repeat_interleave(reps)[None].to(lm.device)

    def prompt_length(self, lm, prompt: str, images: list | None, videos: list | None = None) -> int:
        return int(self._expanded_ids(lm, prompt, list(images or []), list(videos or [])).shape[1])

    # -- pixels ----------------------------------------------------------------------
    def _image_processor(self, lm):
        """The family's image processor: the loaded processor's, else its PIL backend
        read from the model's own preprocessor_config.json."""
        proc = getattr(lm.processor, "image_processor", None)
        if proc is not None and type(proc).__name__.startswith("LlavaOnevision"):
            return proc
        cached = lm.memo.get("onevision_images")
        if cached is None:
            from transformers import LlavaOnevisionImageProcessorPil

            path = Path(str(getattr(lm.model, "name_or_path", "")))
            try:
                cached = LlavaOnevisionImageProcessorPil.from_pretrained(
                    str(path) if path.is_dir() else lm.name)
            except OSError as exc:
                raise ValueError(f"model '{lm.name}' has no image processor config "
                                 f"(preprocessor_config.json) to turn images into inputs: {exc}") from None
            lm.memo["onevision_images"] = cached
        return cached

    def image_inputs(self, lm, images: list) -> dict[str, torch.Tensor]:
        """pixel_values, image_sizes and batch_num_images of one request's images (one
        sample: tiled when it is alone, one view each when there are several)."""
        enc = self._image_processor(lm)([list(images)], return_tensors="pt")
        return {"pixel_values": enc["pixel_values"].to(lm.device, dtype=lm.dtype),
                "image_sizes": enc["image_sizes"].to(lm.device),
                "batch_num_images": enc["batch_num_images"].to(lm.device)}

    def video_pixels(self, lm, clips: list) -> torch.Tensor:
        """pixel_values_videos (n_videos, frames, 3, H, W): every frame resized to one tile,
        rescaled to [0, 1] and normalized with the image processor's mean and std."""
        if len({len(c.frames) for c in clips}) > 1:
            raise ValueError(f"model '{lm.name}' (LLaVA-OneVision) reads several videos of one "
                             "request as one stacked tensor: they need the same frame count")
        proc = self._image_processor(lm)
        size = proc.size
        height, width = (size["height"], size["width"]) if "height" in size else (
            size["shortest_edge"], size["shortest_edge"])
        mean = np.asarray(proc.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(proc.image_std, dtype=np.float32)[:, None, None]
        videos = []
        for clip in clips:
            frames = [np.asarray(f.convert("RGB").resize((width, height), Image.Resampling.BICUBIC),
                                 dtype=np.float32).transpose(2, 0, 1) for f in clip.frames]
            videos.append((np.stack(frames) * np.float32(proc.rescale_factor) - mean) / std)
        return torch.from_numpy(np.stack(videos)).to(lm.device, dtype=lm.dtype)

    def encode(self, lm, prompt: str, images: list | None, videos: list | None = None
               ) -> dict[str, torch.Tensor]:
        images, videos = list(images or []), list(videos or [])
        if not images and not videos:
            return ModelAdapter.encode(self, lm, prompt, None)
        ids = self._expanded_ids(lm, prompt, images, videos)
        out = {"input_ids": ids}
        if images:
            out.update(self.image_inputs(lm, images))
        if videos:
            out["pixel_values_videos"] = self.video_pixels(lm, videos)
            out["attention_mask"] = torch.ones_like(ids)   # the draft's encoded prefill reads it
        return out

