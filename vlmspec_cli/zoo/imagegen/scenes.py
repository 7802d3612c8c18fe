"""The tinyworld image-generation world: one shape on a background at 32 px, the prompts
that describe it (``sample_prompt_scene``), the pixel check of a generated image against
its prompt (``image_matches``), and the image/VQ geometry (8x8 codes of 4x4 patches).

Prompts always name the shape colour, kind and background, each half the time the size
and position; what a prompt leaves out is sampled at random.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

from vlmspec_cli.zoo import world

IMAGE_PX, PATCH = 32, 4
GRID = IMAGE_PX // PATCH  # 8x8 codes
NUM_IMAGE_TOKENS = GRID * GRID
CODEBOOK, CODE_DIM = 256, 8
FLAT_CODES = len(world.BACKGROUNDS) + len(world.COLOURS)  # 13 flat-colour codes, then
MASK_CLUSTERS = (CODEBOOK - FLAT_CODES) // len(world.COLOURS)  # 30 edge masks per colour


def all_scenes() -> list[world.Scene]:
    """Every one-shape scene (shape colour named differently from the background)."""
    return [world.Scene(bg, (world.Shape(kind, colour, size, pos),))
            for bg in world.BACKGROUNDS for colour in world.COLOURS if colour != bg
            for kind in world.SHAPES for size in world.SIZES for pos in world.POSITIONS]


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


TEMPLATES = ("{thing}{where} on {a_bg} background", "{bg} background with {thing}{where}",
             "draw {thing}{where} on {a_bg} background", "on {a_bg} background, {thing}{where}",
             "{thing}{where}, {bg} background", "a picture of {thing}{where} on {a_bg} background")


def sample_prompt_scene(rng: random.Random) -> tuple[str, world.Scene]:
    """A random one-shape scene and a prompt naming its colour, kind and background, and
    (each half the time) its size and position."""
    bg = rng.choice(list(world.BACKGROUNDS))
    shape = world.Shape(rng.choice(world.SHAPES), rng.choice([c for c in world.COLOURS if c != bg]),
                        rng.choice(world.SIZES), rng.choice(world.POSITIONS))
    size = f"{shape.size} " if rng.random() < 0.5 else ""
    where = f" {world.POSITION_PHRASES[shape.position]}" if rng.random() < 0.5 else ""
    prompt = rng.choice(TEMPLATES).format(thing=_a(f"{size}{shape.colour} {shape.kind}"), where=where,
                                          bg=bg, a_bg=_a(bg))
    return prompt, world.Scene(bg, (shape,))


_PALETTE = np.array(list(world.BACKGROUNDS.values()) + list(world.COLOURS.values()), dtype=np.float32)
_NAMES = list(world.BACKGROUNDS) + list(world.COLOURS)


def palette_labels(image: Image.Image) -> np.ndarray:
    """Per pixel, the nearest palette entry (backgrounds first, then shape colours)."""
    if image.size != (IMAGE_PX, IMAGE_PX):
        image = image.resize((IMAGE_PX, IMAGE_PX), Image.NEAREST)
    px = np.asarray(image.convert("RGB"), dtype=np.float32)
    return ((px[:, :, None, :] - _PALETTE) ** 2).sum(-1).argmin(-1)


def _largest_blob(mask: np.ndarray) -> int:
    """Pixels in the largest 4-connected component of ``mask``."""
    ids = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:  # spread the largest id through each component
        p = np.pad(ids, 1)
        new = np.maximum.reduce([ids, p[:-2, 1:-1], p[2:, 1:-1], p[1:-1, :-2], p[1:-1, 2:]]) * mask
        if (new == ids).all():
            return int(np.bincount(ids[mask]).max()) if mask.any() else 0
        ids = new


def image_matches(image: Image.Image, colour: str, background: str, min_blob: int = 4) -> bool:
    """Pixel check of a (32 px) image against "a <colour> shape on a <background> background".

    Every pixel is classified to its nearest palette colour (world.BACKGROUNDS and
    world.COLOURS; a name in both, e.g. "green", counts as one colour for the shape).
    True when >= 60% of the border pixels are the background, a 4-connected blob of
    >= ``min_blob`` pixels has the shape colour, and the shape colour is the most common
    colour name among the non-background pixels."""
    lab = palette_labels(image)
    bg = list(world.BACKGROUNDS).index(background)
    border = np.concatenate([lab[0], lab[-1], lab[1:-1, 0], lab[1:-1, -1]])
    if (border == bg).mean() < 0.6:
        return False
    name = np.array(_NAMES)[lab]
    if _largest_blob((name == colour) & (lab != bg)) < min_blob:
        return False
    names, counts = np.unique(name[lab != bg], return_counts=True)
    return str(names[counts.argmax()]) == colour


def to_pixels(images: list[Image.Image]) -> torch.Tensor:
    """PIL images -> (B, 3, H, W) in [-1, 1]."""
    arr = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2) / 127.5 - 1


def to_images(pixels: torch.Tensor) -> list[Image.Image]:
    """(B, H, W, 3) in [-1, 1] (``decode_image_tokens`` output) -> PIL images."""
    arr = ((pixels.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    return [Image.fromarray(a, "RGB") for a in arr]
