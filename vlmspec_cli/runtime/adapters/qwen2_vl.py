"""Qwen2-VL family (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration):
images and videos in, text out.

Inputs are built here, not by HF's processors (the video one needs torchvision, which has
no CPU build): frames are resized by Qwen's ``smart_resize`` rule and patchified in the
processor's layout (runtime/adapters/video_patches.py); a still image is a one-frame video
repeated to ``temporal_patch_size``. Each ``<|image_pad|>`` / ``<|video_pad|>``
placeholder in the prompt becomes t·h·w / merge² visual tokens; ``mm_token_type_ids``
marks them (1 image, 2 video), and for videos ``second_per_grid_ts`` = temporal_patch_size
/ sampled fps spaces them in time. A draft of this family reads images and videos through
these inputs, not through embeddings (``embeds_images`` False): its positions are 3-D.

Positions are 3-D (M-RoPE). HF keeps the offset between text positions and cache length
(``rope_deltas``) on the model object between calls; here every forward gets explicit
positions instead: the prompt's come from ``get_rope_index``, and later tokens (decoding,
chains, trees) sit at their 1-D position + that offset, expanded to (3, B, n). The offset
travels with the request's cache (``cache.rope_delta``, a field of vlmspec's caches: the
fast path's StaticKVCache, or the ``MRopeCache`` below), so requests never share it. Rows
of a batch share one cache: it keeps each row's offset (runtime/fast/ragged.py ``deltas``)
and feeds them at (3, B, n) positions built here (``row_positions``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import (DynamicCache, Qwen2_5_VLForConditionalGeneration,
                          Qwen2VLForConditionalGeneration)

from vlmspec_cli.runtime.adapters.base import ModelAdapter, cache_length
from vlmspec_cli.runtime.adapters.video_patches import patchify, resize_frames, smart_resize, video_token_count

# Qwen2-VL processor defaults, used when a model ships no preprocessor_config.json
_DEFAULTS = {"image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711],
             "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}


class MRopeCache(DynamicCache):
    """A transformers cache of one request with 3-D positions, with the offset its prefill
    gave: a later token at 1-D position p sits at p + ``rope_delta``."""

    rope_delta: int = 0


class Qwen25VLAdapter(ModelAdapter):
    model_types = ("qwen2_5_vl",)
    model_class = Qwen2_5_VLForConditionalGeneration
    takes_images = True
    takes_videos = True
    embeds_images = False     # visual inputs go through encode (3-D positions), not embeddings
    splits_layers = True      # the twig's trunk runs at encode's 3-D positions (trunk.py)
    quant_skip_modules = ("visual", ".*visual", "lm_head")
    family = "Qwen2-VL family"            # how refusals name it
    vision_defaults = _DEFAULTS           # when a model ships no preprocessor_config.json

    def image_token(self, lm) -> tuple[str, str]:
        """Both placeholders, image and video: the text drafting inputs replace whichever
        a request's prompt holds (drafters/inputs.py replace_images)."""
        return (getattr(lm.tokenizer, "image_token", None) or "<|image_pad|>",
                getattr(lm.tokenizer, "video_token", None) or "<|video_pad|>")

    def image_token_id(self, lm) -> int | None:
        return int(lm.model.config.image_token_id)

    def video_token_id(self, lm) -> int:
        return int(lm.model.config.video_token_id)

    def visual_mask(self, lm, ids: torch.Tensor) -> torch.Tensor:
        config = lm.model.config
        visual = ids == self.video_token_id(lm)
        image = getattr(config, "image_token_id", None)
        return visual | (ids == image) if image is not None else visual

    def _vision_settings(self, lm) -> dict:
        cached = lm.memo.get("qwen_vision")
        if cached is not None:
            return cached
        settings = dict(self.vision_defaults)
        path = Path(str(getattr(lm.model, "name_or_path", "")))
        try:
            from transformers import AutoImageProcessor

            proc = AutoImageProcessor.from_pretrained(str(path) if path.is_dir() else lm.name,
                                                      local_files_only=True)
            settings.update(image_mean=list(proc.image_mean), image_std=list(proc.image_std))
            size = getattr(proc, "size", None) or {}
            settings["min_pixels"] = getattr(proc, "min_pixels", None) or size.get("shortest_edge", settings["min_pixels"])
            settings["max_pixels"] = getattr(proc, "max_pixels", None) or size.get("longest_edge", settings["max_pixels"])
        except (OSError, ValueError, TypeError, ImportError):
            pass
        vision = lm.model.config.vision_config
        settings.update(patch=int(vision.patch_size), temporal=int(vision.temporal_patch_size),
                        merge=int(vision.spatial_merge_size))
        lm.memo["qwen_vision"] = settings
        return settings

    def video_tokens(self, lm, clip) -> int:
        """The video tokens ``encode`` makes of ``clip``, from its frame count and size
        alone (the same smart_resize and temporal padding as ``video_patches``)."""
        s = self._vision_settings(lm)
        width, height = clip.frames[0].size
        h, w = smart_resize(height, width, s["patch"] * s["merge"], s["min_pixels"], s["max_pixels"])
        t = -(-len(clip.frames) // s["temporal"])
        return video_token_count((t, h // s["patch"], w // s["patch"]), s["merge"])

    def prompt_length(self, lm, prompt: str, images: list | None, videos: list | None = None) -> int:
        if images:   # an image's patches are cheap to build: count them as encode does
            return super().prompt_length(lm, prompt, images, videos)
        ids = lm.tokenizer(prompt)["input_ids"]
        placeholders = sum(1 for i in ids if i == self.video_token_id(lm))
        videos = list(videos or [])
        if placeholders != len(videos):
            return super().prompt_length(lm, prompt, images, videos)  # its error
        return len(ids) + sum(self.video_tokens(lm, v) - 1 for v in videos)

    def video_patches(self, lm, clip) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(pixel_values_videos, grid_thw (3,), seconds per temporal grid) for one clip."""
        s = self._vision_settings(lm)
        frames = np.stack([np.asarray(f.convert("RGB")) for f in clip.frames])
        h, w = smart_resize(frames.shape[1], frames.shape[2], s["patch"] * s["merge"],
                            s["min_pixels"], s["max_pixels"])
        frames = resize_frames(frames, h, w)
        pixels, grid = patchify(frames, s["patch"], s["temporal"], s["merge"],
                                s["image_mean"], s["image_std"])
        # the sampled frames' rate: T frames over the clip's span (each frame stands for
        # 1/fps seconds), as the processor's fps metadata describes a video
        fps = len(clip.frames) / clip.duration if clip.duration else float(clip.sample_fps)
        return pixels, grid, s["temporal"] / fps

    def image_patches(self, lm, image) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values, grid_thw (3,)) of one still image: a one-frame video."""
        s = self._vision_settings(lm)
        frame = np.asarray(image.convert("RGB"))[None]
        h, w = smart_resize(frame.shape[1], frame.shape[2], s["patch"] * s["merge"],
                            s["min_pixels"], s["max_pixels"])
        return patchify(resize_frames(frame, h, w), s["patch"], s["temporal"], s["merge"],
                        s["image_mean"], s["image_std"])

    def encode(self, lm, prompt: str, images: list | None, videos: list | None = None
               ) -> dict[str, torch.Tensor]:
        ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"][0]
        merge = self._vision_settings(lm)["merge"]
        reps = torch.ones_like(ids)
        out: dict[str, torch.Tensor] = {}
        kinds = (("image", self.image_token_id(lm), list(images or []), 1),
                 ("video", self.video_token_id(lm), list(videos or []), 2))
        for kind, token, items, _ in kinds:
            slots = (ids == token).nonzero().flatten().tolist()
            if len(slots) != len(items):
                raise ValueError(f"prompt has {len(slots)} {kind} placeholders for {len(items)} {kind}s")
            if not items:
                continue
            if kind == "image":
                parts = [(*self.image_patches(lm, im), None) for im in items]
                out["pixel_values"] = torch.cat([p for p, _, _ in parts]).to(lm.device, lm.dtype)
                out["image_grid_thw"] = torch.stack([g for _, g, _ in parts]).to(lm.device)
            else:
                parts = [self.video_patches(lm, v) for v in items]
                out["pixel_values_videos"] = torch.cat([p for p, _, _ in parts]).to(lm.device, lm.dtype)
                out["video_grid_thw"] = torch.stack([g for _, g, _ in parts]).to(lm.device)
                out["second_per_grid_ts"] = torch.tensor([t for _, _, t in parts], device=lm.device)
            reps[slots] = torch.tensor([video_token_count(g, merge) for _, g, _ in parts])
        plain = ids[None].to(lm.device)
        types = sum((plain == token).int() * code for _, token, _, code in kinds)
        ids = ids.repeat_interleave(reps)[None].to(lm.device)
        types = types[0].repeat_interleave(reps.to(lm.device))[None]
        out.update(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types)
        return self._with_positions(lm, out)

    rope_grid_keys = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")

    def _with_positions(self, lm, out: dict) -> dict:
        """``out`` (input_ids, mm_token_type_ids, the grids) plus the prompt's 3-D
        ``position_ids`` from ``get_rope_index`` and its ``rope_deltas`` (text-only: 1-D
        positions on all three axes, offset 0)."""
        ids, types = out["input_ids"], out["mm_token_type_ids"]
        if (types != 0).any():
            grids = {k: out[k] for k in self.rope_grid_keys if k in out}
            positions, delta = lm.model.model.get_rope_index(ids, mm_token_type_ids=types, **grids)
        else:
            positions = torch.arange(ids.shape[1], device=lm.device).view(1, 1, -1).expand(3, 1, -1)
            delta = torch.zeros((1, 1), dtype=torch.long, device=lm.device)
        out["position_ids"] = positions
        out["rope_deltas"] = delta
        return out

    def prompt_embeds(self, lm, prompt, images, pool: int = 1):
        """A prompt without visual tokens as embeddings: the text drafting input, whose
        placeholders are already replaced (a text prefill: 1-D positions, delta 0). Visual
        inputs go through ``encode`` (the multimodal input reads them there)."""
        if images:
            raise ValueError(f"model '{lm.name}' ({self.family}) reads images through its own "
                             "inputs, not embeddings (3-D positions): use drafting.inputs "
                             "[multimodal] or [text], not pooled or an ensemble of them")
        return super().prompt_embeds(lm, prompt, None, pool)

    # -- forwards: explicit 3-D positions ------------------------------------------------
    def new_cache(self, lm, static: bool = True):
        """As every family's, each with a place for the prompt's rope offset: the fast
        path's StaticKVCache has one, a transformers cache is an ``MRopeCache``."""
        if static and lm.fast is not None:
            return lm.fast.new_cache()
        return MRopeCache(config=lm.model.config)

    def _prefill_inputs(self, inputs: dict, cache) -> dict:
        inputs = dict(inputs)
        delta = inputs.pop("rope_deltas", None)    # None: a text-only embeds prefill
        cache.rope_delta = 0 if delta is None else int(delta.flatten()[0])
        return inputs

    def row_positions(self, positions: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        """A batch's rows (runtime/fast/ragged.py): each row's 1-D positions (B, t) + its own
        prompt's offset (B,), on all three axes: (3, B, t), taken by ``extend`` as they are."""
        positions = positions + deltas[:, None]
        return positions[None].expand(3, *positions.shape)

    def _extend_inputs(self, lm, input_ids: torch.Tensor, cache, extra: dict) -> dict:
        extra = dict(extra)
        positions = extra.pop("position_ids", None)
        if positions is not None and positions.dim() == 3:   # (3, B, n): rows of a batch
            extra["position_ids"] = positions
            return extra
        if positions is None:
            start = cache_length(cache)
            positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        positions = positions + cache.rope_delta
        extra["position_ids"] = positions[None].expand(3, *positions.shape)
        return extra

    @torch.inference_mode()
    def prefill(self, lm, inputs, cache) -> torch.Tensor:
        return super().prefill(lm, self._prefill_inputs(inputs, cache), cache)

    @torch.inference_mode()
    def prefill_hidden(self, lm, inputs, cache, layer):
        return super().prefill_hidden(lm, self._prefill_inputs(inputs, cache), cache, layer)

    @torch.inference_mode()
    def extend(self, lm, input_ids, cache, **extra) -> torch.Tensor:
        return super().extend(lm, input_ids, cache, **self._extend_inputs(lm, input_ids, cache, extra))

    @torch.inference_mode()
    def extend_hidden(self, lm, input_ids, cache, layer, **extra):
        return super().extend_hidden(lm, input_ids, cache, layer,
                                     **self._extend_inputs(lm, input_ids, cache, extra))


class Qwen2VLAdapter(Qwen25VLAdapter):
    """Qwen2-VL: the same inputs and 3-D positions (its videos' temporal positions do not
    scale with fps; ``get_rope_index`` ignores ``second_per_grid_ts``)."""

    model_types = ("qwen2_vl",)
    model_class = Qwen2VLForConditionalGeneration
