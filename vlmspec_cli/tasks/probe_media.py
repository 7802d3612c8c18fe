"""The probe inputs ``vlmspec profile`` times its models on: a small picture (a coloured
shape on a plain background) and a short video of one shape crossing the frame, drawn
here with PIL from a seed. They only need to look like what the models read (the zoo's
tinyworld scenes are of this kind); what the models answer is not kept, only how long
they take. The zoo (training code) is not imported: a command never depends on it.
"""

from __future__ import annotations

import random

import numpy as np
from PIL import Image, ImageDraw

SIZE = 64            # pixels a side, as tinyworld's images and video frames
VIDEO_SECONDS = 3.0  # the probe video's duration

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
           "yellow": (235, 210, 40), "purple": (140, 60, 180), "orange": (240, 140, 30)}
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15), "gray": (128, 128, 128)}


def _colours(rng: random.Random) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (BACKGROUNDS[rng.choice(sorted(BACKGROUNDS))], COLOURS[rng.choice(sorted(COLOURS))])


def _shape(draw: ImageDraw.ImageDraw, kind: str, box: tuple[float, float, float, float],
           fill: tuple[int, int, int]) -> None:
    if kind == "circle":
        draw.ellipse(box, fill=fill)
    elif kind == "square":
        draw.rectangle(box, fill=fill)
    else:   # triangle
        x0, y0, x1, y1 = box
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)


def probe_image(rng: random.Random, size: int = SIZE) -> Image.Image:
    """One or two shapes of random colour, kind, size and place on a plain background."""
    background, _ = _colours(rng)
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(1, 2)):
        side = size * rng.uniform(0.25, 0.5)
        x, y = rng.uniform(0, size - side), rng.uniform(0, size - side)
        _shape(draw, rng.choice(("circle", "square", "triangle")), (x, y, x + side, y + side),
               COLOURS[rng.choice(sorted(COLOURS))])
    return image


def probe_frames(rng: random.Random, frames: int, size: int = SIZE) -> list[np.ndarray]:
    """``frames`` RGB frames (uint8 arrays) of one shape moving in a straight line across a
    plain background, evenly spaced over VIDEO_SECONDS."""
    background, colour = _colours(rng)
    kind = rng.choice(("circle", "square", "triangle"))
    side = size * 0.3
    start = (rng.uniform(0, size - side), rng.uniform(0, size - side))
    end = (rng.uniform(0, size - side), rng.uniform(0, size - side))
    out = []
    for i in range(frames):
        t = i / (frames - 1) if frames > 1 else 0.0
        x, y = (a + (b - a) * t for a, b in zip(start, end))
        image = Image.new("RGB", (size, size), background)
        _shape(ImageDraw.Draw(image), kind, (x, y, x + side, y + side), colour)
        out.append(np.asarray(image))
    return out
