"""Qwen2-VL / Qwen2.5-VL video patch layout without torchvision.

HF's ``Qwen2VLVideoProcessor`` needs torchvision, which has no CPU build here, so the
runtime builds video inputs itself. These pure functions reproduce the processor's
layout exactly: frames are rescaled by 1/255 and normalised, the frame count is padded
up to a multiple of ``temporal_patch_size`` by repeating the last frame, and patches are
emitted group by group in time, and within a group block by block
(``merge_size x merge_size`` patches of one merged token stay together), each patch
flattened as (channel, time, row, column).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """The Qwen2-VL resize rule: both sides multiples of ``factor``
    (= patch_size * merge_size), the area within [min_pixels, max_pixels], the aspect
    ratio kept as closely as possible. Returns (height, width)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got "
                         f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(frames: np.ndarray, patch_size: int, temporal_patch_size: int, merge_size: int,
             mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten ``frames`` (T, H, W, 3) uint8 into Qwen2-VL vision patches.

    H and W must already be multiples of ``patch_size * merge_size`` (resize first, e.g.
    to :func:`smart_resize`'s size). Returns ``pixel_values`` of shape
    (grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size**2), float32, and
    ``grid_thw`` = (grid_t, grid_h, grid_w) as a LongTensor of shape (3,). A single image
    is a video of one frame (it is repeated to ``temporal_patch_size`` frames).
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be (T, H, W, 3), got {frames.shape}")
    t, h, w, c = frames.shape
    factor = patch_size * merge_size
    if h % factor or w % factor:
        raise ValueError(f"frame size {h}x{w} is not a multiple of patch_size*merge_size={factor}")
    x = frames.astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    x = x.transpose(0, 3, 1, 2)  # (T, C, H, W)
    if t % temporal_patch_size:
        pad = temporal_patch_size - t % temporal_patch_size
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)
    grid_t = x.shape[0] // temporal_patch_size
    grid_h, grid_w = h // patch_size, w // patch_size
    x = x.reshape(grid_t, temporal_patch_size, c, grid_h // merge_size, merge_size, patch_size,
                  grid_w // merge_size, merge_size, patch_size)
    # -> (grid_t, block row, block col, row in block, col in block, C, time, py, px)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = x.reshape(grid_t * grid_h * grid_w, c * temporal_patch_size * patch_size * patch_size)
    return (torch.from_numpy(np.ascontiguousarray(flat)),
            torch.tensor([grid_t, grid_h, grid_w], dtype=torch.long))


def video_token_count(grid_thw, merge_size: int) -> int:
    """Number of ``<|video_pad|>`` (or image pad) tokens for one grid: t*h*w // merge**2."""
    t, h, w = (int(v) for v in grid_thw)
    return t * h * w // merge_size ** 2


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize (T, H, W, 3) uint8 frames to (T, height, width, 3) with PIL bicubic (the
    image processor's default resample); frames already that size are returned as is."""
    frames = np.asarray(frames)
    if frames.shape[1:3] == (height, width):
        return frames
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.BICUBIC))
                     for f in frames])
