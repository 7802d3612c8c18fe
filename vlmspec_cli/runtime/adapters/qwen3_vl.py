"""Qwen3-VL (Qwen3VLForConditionalGeneration): images and videos in, text out.

The Qwen2-VL family's scheme (qwen2_vl.py) with Qwen3-VL's differences:

* Patches are 16 px (the vision config's ``patch_size``); images are built as there (Qwen's
  ``smart_resize``, a still image a one-frame video), normalised with the model's own
  preprocessor settings.
* A video is written into the prompt frame group by frame group, as HF's Qwen3VLProcessor
  writes it: each ``<|video_pad|>`` placeholder becomes, for every temporal group of
  ``temporal_patch_size`` frames, ``<{t:.1f} seconds><|vision_start|>`` + that group's
  h·w / merge² video tokens + ``<|vision_end|>``, t the mean time of the group's first and
  last frame (the clip's own frame times; the last frame repeated to fill the group).
  ``get_rope_index`` gives each group its own grid, so groups sit at consecutive temporal
  positions, the timestamps between them as text. Frames are resized by the video
  processor's rule (its pixel budget counts all frames).
* "Deepstack": features of some vision layers are added to the first decoder layers'
  hidden states at visual positions. Only the prompt forward holds visual positions, and it
  runs through the model's own forward (``prefill``); later tokens are text, whose
  forwards carry no deepstack features. The twig's split trunk, which runs the layers
  itself, adds them after the same layers (runtime/fast/trunk.py).
* Rotary positions are interleaved across (t, h, w); the model's own rotary module does
  that from the same (3, B, n) position ids, so every later forward gets explicit
  positions exactly as for Qwen2.5-VL (the offset on ``cache.rope_delta``).

Decoding steps take the fast path (runtime/fast/fast_decoder.py) as for Qwen2.5-VL; its layers
run Qwen3's per-head query and key norms (``q_norm``, ``k_norm``) before the rotary.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
from transformers import Qwen3VLForConditionalGeneration

from vlmspec_cli.runtime.adapters.qwen2_vl import Qwen25VLAdapter
from vlmspec_cli.runtime.adapters.video_patches import patchify, resize_frames, video_token_count

# Qwen3-VL image and video processor defaults, for a model that ships no processor files
_IMAGE_DEFAULTS = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "min_pixels": 65536, "max_pixels": 16777216}
_VIDEO_DEFAULTS = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
                   "cap_pixels_per_frame": None, "max_video_tokens": 768}


def video_resize(frames: int, height: int, width: int, temporal: int, factor: int,
                 min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's video resize rule: sides multiples of ``factor``, the pixels of all
    ``frames`` (rounded to whole temporal groups) within [min_pixels, max_pixels].
    Returns (height, width)."""
    if frames < temporal:
        raise ValueError(f"a Qwen3-VL video needs at least {temporal} frames, got {frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got "
                         f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def group_times(times: list[float], temporal: int) -> list[float]:
    """The time written before each temporal group: the mean of its first and last frame's
    time, the last frame repeated to fill the final group (as the processor does)."""
    times = list(times) + [times[-1]] * (-len(times) % temporal)
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


class Qwen3VLAdapter(Qwen25VLAdapter):
    model_types = ("qwen3_vl",)
    model_class = Qwen3VLForConditionalGeneration
    family = "Qwen3-VL"
    rope_grid_keys = ("image_grid_thw", "video_grid_thw")   # no second_per_grid_ts
    vision_defaults = _IMAGE_DEFAULTS

    # -- videos ---------------------------------------------------------------------------
    def _video_settings(self, lm) -> dict:
        cached = lm.memo.get("qwen3_video")
        if cached is not None:
            return cached
        settings = json.loads(json.dumps(_VIDEO_DEFAULTS))
        try:
            from transformers.utils import cached_file

            found = cached_file(str(getattr(lm.model, "name_or_path", "") or lm.name),
                                "video_preprocessor_config.json", local_files_only=True,
                                _raise_exceptions_for_missing_entries=False)
            if found:
                with open(found, encoding="utf-8") as fh:
                    settings.update({k: v for k, v in json.load(fh).items() if k in settings})
        except (OSError, ValueError):
            pass
        image = self._vision_settings(lm)
        settings.update(patch=image["patch"], temporal=image["temporal"], merge=image["merge"])
        lm.memo["qwen3_video"] = settings
        return settings

    def _video_size(self, lm, clip) -> tuple[int, int]:
        """The (height, width) the clip's frames are resized to."""
        s = self._video_settings(lm)
        width, height = clip.frames[0].size
        frames, factor = len(clip.frames), s["patch"] * s["merge"]
        low, high = int(s["size"]["shortest_edge"]), int(s["size"]["longest_edge"])
        if s.get("cap_pixels_per_frame"):
            per_frame = max(min(int(s["max_video_tokens"]) * factor * factor, high // frames),
                            int(low * 1.05))
            high = per_frame * frames
        return video_resize(frames, height, width, s["temporal"], factor, low, high)

    def _video_grid(self, lm, clip) -> tuple[int, int, int]:
        s = self._video_settings(lm)
        h, w = self._video_size(lm, clip)
        return -(-len(clip.frames) // s["temporal"]), h // s["patch"], w // s["patch"]

    def video_tokens(self, lm, clip) -> int:
        return video_token_count(self._video_grid(lm, clip), self._video_settings(lm)["merge"])

    def video_patches(self, lm, clip) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values_videos, grid_thw (3,)) for one clip."""
        s = self._video_settings(lm)
        frames = np.stack([np.asarray(f.convert("RGB")) for f in clip.frames])
        frames = resize_frames(frames, *self._video_size(lm, clip))
        return patchify(frames, s["patch"], s["temporal"], s["merge"], s["image_mean"], s["image_std"])

    def _frame_times(self, clip) -> list[float]:
        times = list(getattr(clip, "timestamps", None) or [])
        if len(times) != len(clip.frames):
            times = [i / float(clip.sample_fps) for i in range(len(clip.frames))]
        return times

    # -- the prompt -------------------------------------------------------------------------
    def _layout(self, lm, prompt: str, image_grids: list, videos: list):
        """Token ids with one placeholder per image and per video frame group (timestamps
        written in), and how many visual tokens each of them stands for."""
        image_tok, video_tok = self.image_token(lm)
        parts = prompt.split(video_tok)
        if len(parts) - 1 != len(videos):
            raise ValueError(f"prompt has {len(parts) - 1} video placeholders for {len(videos)} videos")
        s = self._vision_settings(lm)
        start = getattr(lm.tokenizer, "vision_start_token", None) or "<|vision_start|>"
        end = getattr(lm.tokenizer, "vision_end_token", None) or "<|vision_end|>"
        counts: list[int] = []
        text = parts[0]
        for clip, rest in zip(videos, parts[1:]):
            t, h, w = self._video_grid(lm, clip)
            stamps = group_times(self._frame_times(clip), s["temporal"])
            text += "".join(f"<{x:.1f} seconds>{start}{video_tok}{end}" for x in stamps) + rest
            counts += [h * w // s["merge"] ** 2] * t
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"][0]
        image_id, video_id = self.image_token_id(lm), self.video_token_id(lm)
        if int((ids == image_id).sum()) != len(image_grids):
            raise ValueError(f"prompt has {int((ids == image_id).sum())} image placeholders for "
                             f"{len(image_grids)} images")
        reps = torch.ones_like(ids)
        if image_grids:
            reps[ids == image_id] = torch.tensor([video_token_count(g, s["merge"]) for g in image_grids])
        if counts:
            reps[ids == video_id] = torch.tensor(counts)
        return ids, reps

    def prompt_length(self, lm, prompt: str, images: list | None, videos: list | None = None) -> int:
        grids = [self.image_patches(lm, im)[1] for im in images or []]
        return int(self._layout(lm, prompt, grids, list(videos or []))[1].sum())

    def encode(self, lm, prompt: str, images: list | None, videos: list | None = None
               ) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        images, videos = list(images or []), list(videos or [])
        grids = []
        if images:
            parts = [self.image_patches(lm, im) for im in images]
            grids = [g for _, g in parts]
            out["pixel_values"] = torch.cat([p for p, _ in parts]).to(lm.device, lm.dtype)
            out["image_grid_thw"] = torch.stack(grids).to(lm.device)
        if videos:
            parts = [self.video_patches(lm, v) for v in videos]
            out["pixel_values_videos"] = torch.cat([p for p, _ in parts]).to(lm.device, lm.dtype)
            out["video_grid_thw"] = torch.stack([g for _, g in parts]).to(lm.device)
        ids, reps = self._layout(lm, prompt, grids, videos)
        types = (ids == self.image_token_id(lm)).int() + 2 * (ids == self.video_token_id(lm)).int()
        ids = ids.repeat_interleave(reps)[None].to(lm.device)
        types = types.repeat_interleave(reps)[None].to(lm.device)
        out.update(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types)
        return self._with_positions(lm, out)
