"""The tinyworld scenes: coloured shapes on a 3x3 grid, their rendering, captions and
question/answer pairs, and the checks that score a model's caption or answer.

Every function that makes a choice takes an explicit ``random.Random``; the global RNG
is never used.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 220, 40),
    "purple": (150, 60, 190),
    "orange": (245, 140, 30),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "gray": (128, 128, 128),
    "white": (215, 215, 205),
    "black": (45, 45, 50),
    "blue": (70, 90, 150),
    "green": (80, 130, 85),
}
SHAPES = ("circle", "square", "triangle", "diamond")
SIZES = ("small", "large")
POSITIONS = ("top left", "top", "top right", "left", "center", "right",
             "bottom left", "bottom", "bottom right")
POSITION_PHRASES = {
    "top left": "at the top left", "top": "at the top", "top right": "at the top right",
    "left": "on the left", "center": "in the center", "right": "on the right",
    "bottom left": "at the bottom left", "bottom": "at the bottom",
    "bottom right": "at the bottom right",
}
SIZE_FRACTION = {"small": 0.45, "large": 0.85}
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
                "sixteen", "seventeen", "eighteen")
KINDS = ("caption", "qa", "difference", "story", "followup", "text_task")
DEFAULT_WEIGHTS = {"caption": 0.3, "qa": 0.3, "difference": 0.1, "story": 0.05,
                   "followup": 0.15, "text_task": 0.1}
MAX_VARIANT_SHAPES = 5

CAPTION_PROMPTS = ("describe the image.", "what is in this picture?", "write a short caption.",
                   "what do you see?", "describe what you see.", "caption this image.")
DIFFERENCE_PROMPTS = ("what is different between the two images?", "spot the difference.",
                      "what changed in the second image?",
                      "how is the second image different from the first?")
STORY_PROMPTS = ("what happens in these images?", "tell a short story about these images.",
                 "describe what happens from the first image to the last.",
                 "these images tell a story. what happens?")


# ----------------------------------------------------------------------------- scene graph

@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    size: str
    position: str


@dataclass(frozen=True)
class Scene:
    background: str
    shapes: tuple[Shape, ...]


def _sorted(shapes) -> tuple[Shape, ...]:
    return tuple(sorted(shapes, key=lambda s: POSITIONS.index(s.position)))


def sample_scene(rng: random.Random, min_shapes: int = 1, max_shapes: int = 3) -> Scene:
    """Random scene: distinct cells, colours unique and different from the background."""
    n = rng.randint(min_shapes, max_shapes)
    background = rng.choice(list(BACKGROUNDS))
    colours = rng.sample([c for c in COLOURS if c != background], n)
    cells = rng.sample(POSITIONS, n)
    shapes = [Shape(rng.choice(SHAPES), colour, rng.choice(SIZES), cell)
              for colour, cell in zip(colours, cells)]
    return Scene(background, _sorted(shapes))


# ----------------------------------------------------------------------------- rendering

def render(scene: Scene, size: int = 64) -> Image.Image:
    """Draw the scene as an RGB ``size`` x ``size`` image (no antialiasing)."""
    image = Image.new("RGB", (size, size), BACKGROUNDS[scene.background])
    draw = ImageDraw.Draw(image)
    for shape in scene.shapes:
        row, col = divmod(POSITIONS.index(shape.position), 3)
        x0, x1 = col * size // 3, (col + 1) * size // 3
        y0, y1 = row * size // 3, (row + 1) * size // 3
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        half = SIZE_FRACTION[shape.size] * min(x1 - x0, y1 - y0) / 2
        left, right = round(cx - half), round(cx + half) - 1
        top, bottom = round(cy - half), round(cy + half) - 1
        mx, my = round(cx), round(cy)
        fill = COLOURS[shape.colour]
        if shape.kind == "circle":
            draw.ellipse([left, top, right, bottom], fill=fill)
        elif shape.kind == "square":
            draw.rectangle([left, top, right, bottom], fill=fill)
        elif shape.kind == "triangle":
            draw.polygon([(mx, top), (right, bottom), (left, bottom)], fill=fill)
        elif shape.kind == "diamond":
            draw.polygon([(mx, top), (right, my), (mx, bottom), (left, my)], fill=fill)
        else:
            raise ValueError(f"unknown shape kind {shape.kind!r}")
    return image


# ----------------------------------------------------------------------------- text helpers

def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _count(n: int, noun: str) -> str:
    return f"{NUMBER_WORDS[n]} {noun}" + ("" if n == 1 else "s")


def _phrase(shape: Shape) -> str:
    return f"a {shape.size} {shape.colour} {shape.kind} {POSITION_PHRASES[shape.position]}"


def _name(shape: Shape) -> str:
    return f"the {shape.colour} {shape.kind}"


def caption(scene: Scene, rng: random.Random) -> str:
    """Describe every shape (size, colour, kind, position) and the background."""
    bg, phrases = scene.background, [_phrase(s) for s in scene.shapes]
    listed = _join(phrases)
    template = rng.randrange(7)
    if template == 0:
        return f"{listed}, on a {bg} background."
    if template == 1:
        return " ".join(f"there is {p}." for p in phrases) + f" the background is {bg}."
    if template == 2:
        return f"on a {bg} background, there is {listed}."
    if template == 3:
        return f"the image shows {listed}. the background is {bg}."
    if template == 4:
        return f"a {bg} background with {listed}."
    if template == 5:
        return " ".join(f"{POSITION_PHRASES[s.position]} there is a {s.size} {s.colour} {s.kind}."
                        for s in scene.shapes) + f" the background is {bg}."
    return f"{_count(len(phrases), 'shape')} on a {bg} background. {listed}."


def qa_pairs(scene: Scene, rng: random.Random) -> list[tuple[str, str]]:
    """Question/answer pairs about the scene, one or more per question type."""
    shapes, pairs = scene.shapes, []
    kinds = [s.kind for s in shapes]
    unique = [s for s in shapes if kinds.count(s.kind) == 1]
    if unique:
        s = rng.choice(unique)
        q = rng.choice(["what colour is the {k}?", "which colour does the {k} have?"])
        pairs.append((q.format(k=s.kind), f"the {s.kind} is {s.colour}."))
    s = rng.choice(shapes)
    q = rng.choice(["where is {n}?", "where is {n} located?", "where can you see {n}?"])
    pairs.append((q.format(n=_name(s)), f"{_name(s)} is {POSITION_PHRASES[s.position]}."))
    n = len(shapes)
    verb = "is" if n == 1 else "are"
    pairs.append((rng.choice(["how many shapes are there?", "how many shapes can you see?"]),
                  f"there {verb} {_count(n, 'shape')}."))
    kind = rng.choice(SHAPES)
    k = kinds.count(kind)
    pairs.append((f"how many {kind}s are there?",
                  f"there are no {kind}s." if k == 0 else
                  f"there {'is' if k == 1 else 'are'} {_count(k, kind)}."))
    if rng.random() < 0.5:
        s = rng.choice(shapes)
        pairs.append((f"is there a {s.colour} {s.kind}?", f"yes, there is a {s.colour} {s.kind}."))
    else:
        present = {(s.colour, s.kind) for s in shapes}
        absent = [(c, k) for c in COLOURS for k in SHAPES if (c, k) not in present]
        c, k = rng.choice(absent)
        pairs.append((f"is there a {c} {k}?", f"no, there is no {c} {k}."))
    pairs.append((rng.choice(["what colour is the background?", "what is the background colour?"]),
                  f"the background is {scene.background}."))
    s = rng.choice(shapes)
    pairs.append((f"is {_name(s)} large or small?", f"{_name(s)} is {s.size}."))
    position = rng.choice(POSITIONS)
    here = [s for s in shapes if s.position == position]
    where = POSITION_PHRASES[position]
    pairs.append((f"what is {where}?", f"there is a {here[0].size} {here[0].colour} "
                  f"{here[0].kind} {where}." if here else f"there is nothing {where}."))
    return pairs


# ----------------------------------------------------------------------------- evaluation

def _mention(shape: Shape, text: str) -> int:
    """Index of '<colour> [size] <kind>' in text, or -1."""
    m = re.search(rf"\b{shape.colour} (?:(?:small|large) )?{shape.kind}\b", text)
    return m.start() if m else -1


def _position_pattern(position: str) -> str:
    phrase = re.escape(POSITION_PHRASES[position])
    tail = r"(?! (?:left|right)\b)" if position in ("top", "bottom") else ""
    return rf"\b{phrase}\b{tail}"


def caption_is_correct(scene: Scene, text: str) -> bool:
    """Every shape's colour+kind and position phrase, and the background colour, are mentioned."""
    for shape in scene.shapes:
        if _mention(shape, text) < 0 or not re.search(_position_pattern(shape.position), text):
            return False
    return re.search(rf"\b{scene.background}\b", text) is not None


_ANY_SHAPE = re.compile(rf"\b({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})\b")


def caption_is_exact(scene: Scene, text: str) -> bool:
    """Strict: exactly the scene's shapes are described (no extra ones), each with its size,
    colour, kind and its own position phrase, and the background is right."""
    if len(_ANY_SHAPE.findall(text)) != len(scene.shapes):
        return False
    for s in scene.shapes:
        where, what = POSITION_PHRASES[s.position], f"{s.size} {s.colour} {s.kind}"
        # "a small red circle at the top" (not "... at the top left") or
        # "at the top there is a small red circle"
        after = rf"\b{what} {where}(?! (left|right))\b"
        before = rf"(^|[.,] ){where} there is a {what}\b"
        if not (re.search(after, text) or re.search(before, text)):
            return False
    bg = scene.background
    return re.search(rf"\b{bg} background\b|\bbackground is {bg}\b", text) is not None


def _normalize(text: str) -> str:
    return " ".join(text.split())


def answer_is_correct(expected: str, text: str) -> bool:
    """Exact match after stripping and collapsing whitespace."""
    return _normalize(expected) == _normalize(text)
