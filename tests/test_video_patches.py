"""vlmspec_cli.runtime.adapters.video_patches reproduces the Qwen2-VL processor layout."""

import numpy as np
import pytest
import torch

from vlmspec_cli.runtime.adapters.video_patches import patchify, smart_resize, video_token_count

MEAN, STD = [0.48, 0.46, 0.41], [0.27, 0.26, 0.28]


def _image_processor(patch, temporal, merge):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=patch, temporal_patch_size=temporal, merge_size=merge,
                                    image_mean=MEAN, image_std=STD, do_resize=False)


@pytest.mark.parametrize("patch,merge,size", [(8, 2, (64, 64)), (4, 2, (16, 40)), (14, 2, (56, 84))])
def test_still_image_matches_image_processor(patch, merge, size):
    from PIL import Image

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    ref = _image_processor(patch, 2, merge)(images=[Image.fromarray(image)], return_tensors="pt")
    for frames in (image[None], np.stack([image, image])):  # one frame is padded by repetition
        pix, grid = patchify(frames, patch, 2, merge, MEAN, STD)
        assert torch.equal(grid, ref["image_grid_thw"][0])
        assert pix.shape == ref["pixel_values"].shape
        torch.testing.assert_close(pix, ref["pixel_values"].float(), atol=1e-5, rtol=1e-5)
    assert video_token_count(grid, merge) == ref["pixel_values"].shape[0] // merge ** 2


def test_temporal_order_and_padding():
    t, h, w, p, merge, tp = 5, 32, 48, 8, 2, 2
    frames = np.zeros((t, h, w, 3), np.uint8)
    for i in range(t):
        frames[i] = 10 * (i + 1)  # frame i has constant value 10*(i+1)
    pix, grid = patchify(frames, p, tp, merge, [0, 0, 0], [1, 1, 1])
    assert grid.tolist() == [3, h // p, w // p]  # 5 frames padded to 6
    per_group = (h // p) * (w // p)
    vals = pix.view(3, per_group, 3, tp, p * p)  # (group, patch, C, time, pixels)
    for g in range(3):
        for k in range(tp):
            frame = min(g * tp + k, t - 1)  # the last frame repeats into the padding
            assert torch.allclose(vals[g, :, :, k], torch.tensor(10 * (frame + 1) / 255))
    assert video_token_count(grid, merge) == 3 * per_group // 4


def test_block_order():
    # a frame whose pixel encodes its patch row/col: patches must come in 2x2 blocks
    h, w, p = 32, 32, 8
    frame = np.zeros((h, w, 3), np.uint8)
    for r in range(h // p):
        for c in range(w // p):
            frame[r * p:(r + 1) * p, c * p:(c + 1) * p, 0] = r
            frame[r * p:(r + 1) * p, c * p:(c + 1) * p, 1] = c
    pix, _ = patchify(frame[None], p, 2, 2, [0, 0, 0], [1 / 255] * 3)
    rc = [(int(v[0].item()), int(v[2 * p * p].item())) for v in pix]  # first pixel of R and G
    assert rc[:8] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]


def test_smart_resize():
    assert smart_resize(64, 64, 16, 16 * 16, 128 * 128) == (64, 64)
    assert smart_resize(60, 70, 16, 16 * 16, 128 * 128) == (64, 64)
    h, w = smart_resize(480, 640, 16, 16 * 16, 64 * 64)
    assert h % 16 == 0 and w % 16 == 0 and h * w <= 64 * 64
    h, w = smart_resize(8, 8, 16, 32 * 32, 128 * 128)
    assert h * w >= 32 * 32
    with pytest.raises(ValueError):
        patchify(np.zeros((2, 30, 32, 3), np.uint8), 8, 2, 2, MEAN, STD)
