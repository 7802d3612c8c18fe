"""tinyworld: a deterministic synthetic world of coloured shapes on a 3x3 grid.

Used to train and evaluate tiny LLaVA-style models on CPU.  Every function that
makes a choice takes an explicit ``random.Random``; the global RNG is never used.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

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


# ----------------------------------------------------------------------------- multi-image

def make_variant(scene: Scene, rng: random.Random) -> Scene:
    """Copy of ``scene`` with exactly one change (one attribute, or one shape added/removed)."""
    shapes = list(scene.shapes)
    used = {s.colour for s in shapes}
    free_cells = [p for p in POSITIONS if p not in {s.position for s in shapes}]
    free_colours = [c for c in COLOURS if c not in used and c != scene.background]
    options = ["kind", "size"]
    if free_colours:
        options.append("colour")
    if free_cells:
        options.append("position")
    if [b for b in BACKGROUNDS if b != scene.background and b not in used]:
        options.append("background")
    if free_cells and free_colours and len(shapes) < MAX_VARIANT_SHAPES:
        options.append("add")
    if len(shapes) > 1:
        options.append("remove")
    change = rng.choice(options)
    if change == "background":
        new_bg = rng.choice([b for b in BACKGROUNDS if b != scene.background and b not in used])
        return Scene(new_bg, scene.shapes)
    if change == "add":
        shapes.append(Shape(rng.choice(SHAPES), rng.choice(free_colours), rng.choice(SIZES),
                            rng.choice(free_cells)))
        return Scene(scene.background, _sorted(shapes))
    i = rng.randrange(len(shapes))
    old = shapes[i]
    if change == "remove":
        del shapes[i]
    elif change == "kind":
        shapes[i] = replace(old, kind=rng.choice([k for k in SHAPES if k != old.kind]))
    elif change == "size":
        shapes[i] = replace(old, size="small" if old.size == "large" else "large")
    elif change == "colour":
        shapes[i] = replace(old, colour=rng.choice(free_colours))
    else:
        shapes[i] = replace(old, position=rng.choice(free_cells))
    return Scene(scene.background, _sorted(shapes))


def _changes(a: Scene, b: Scene) -> list[tuple]:
    """Structured differences: (attribute, old_shape_or_value, new_value) / added / removed."""
    out: list[tuple] = []
    if a.background != b.background:
        out.append(("background", a.background, b.background))
    only_a = [s for s in a.shapes if s not in b.shapes]
    only_b = [s for s in b.shapes if s not in a.shapes]
    fields = ("kind", "colour", "size", "position")
    for old in list(only_a):
        for new in only_b:
            diff = [f for f in fields if getattr(old, f) != getattr(new, f)]
            if len(diff) == 1:
                out.append((diff[0], old, getattr(new, diff[0])))
                only_a.remove(old)
                only_b.remove(new)
                break
    out += [("removed", s, None) for s in only_a] + [("added", s, None) for s in only_b]
    return out


def _the_pos(position: str) -> str:
    return f"the {position}"


def _change_clause(change: tuple, style: int) -> str:
    """One change in words; style 0 = 'instead of', 1 = 'changed from', 2 = story verbs."""
    what, old, new = change
    if what == "background":
        return [f"the background is {new} instead of {old}",
                f"the background changed from {old} to {new}",
                f"the background turns {new}"][style]
    where = POSITION_PHRASES[old.position]
    if what == "colour":
        return [f"the {old.kind} {where} is {new} instead of {old.colour}",
                f"the {old.kind} {where} changed from {old.colour} to {new}",
                f"the {old.kind} {where} turns {new}"][style]
    if what == "kind":
        return [f"the {old.colour} shape is a {new} instead of a {old.kind}",
                f"the {old.colour} shape changed from a {old.kind} to a {new}",
                f"the {old.colour} {old.kind} turns into a {new}"][style]
    if what == "size":
        return [f"{_name(old)} is {new} instead of {old.size}",
                f"{_name(old)} changed from {old.size} to {new}",
                f"{_name(old)} becomes {new}"][style]
    if what == "position":
        return [f"{_name(old)} is {POSITION_PHRASES[new]} instead of {where}",
                f"{_name(old)} moved from {_the_pos(old.position)} to {_the_pos(new)}",
                f"{_name(old)} moves to {_the_pos(new)}"][style]
    if what == "added":
        return [f"there is also {_phrase(old)}",
                f"{_phrase(old)} was added",
                f"a {old.size} {old.colour} {old.kind} appears {where}"][style]
    return [f"there is no {old.colour} {old.kind} anymore",
            f"{_name(old)} {where} was removed",
            f"{_name(old)} disappears"][style]


def difference(scene_a: Scene, scene_b: Scene, rng: random.Random) -> str:
    """Describe what changed from ``scene_a`` to ``scene_b``."""
    changes = _changes(scene_a, scene_b)
    if not changes:
        return "the two images are the same."
    style = rng.randrange(2)
    body = " and ".join(_change_clause(c, style) for c in changes)
    return f"in the second image {body}." if style == 0 else f"{body}."


def story(scenes: list[Scene], rng: random.Random) -> str:
    """A short story over consecutive scenes: 'first there is ..., then ..., finally ...'."""
    first = scenes[0]
    opening = (f"{rng.choice(['first', 'at first', 'in the beginning'])} there is "
               f"{_join([_phrase(s) for s in first.shapes])} on a {first.background} background")
    parts = [opening]
    for i in range(1, len(scenes)):
        changes = _changes(scenes[i - 1], scenes[i])
        body = (" and ".join(_change_clause(c, 2) for c in changes)
                if changes else "nothing changes")
        last = i == len(scenes) - 1
        parts.append(("finally " if last else rng.choice(["then ", "next ", "after that "])) + body)
    if rng.random() < 0.5:
        return ". ".join(parts) + "."
    return ", ".join(parts) + "."


# ----------------------------------------------------------------------------- text-only turns

_COLOUR_WORDS = tuple(dict.fromkeys(list(COLOURS) + list(BACKGROUNDS)))
_MIXES = {("blue", "yellow"): "green", ("red", "yellow"): "orange", ("red", "blue"): "purple",
          ("black", "white"): "gray"}
_SIDES = {"triangle": 3, "square": 4, "diamond": 4}
_OPPOSITES = {"large": "small", "small": "large", "top": "bottom", "bottom": "top",
              "left": "right", "right": "left", "black": "white", "white": "black"}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text)


def followup(scene: Scene, first_answer: str, rng: random.Random) -> tuple[str, str]:
    """A text-only follow-up question about the previous answer, with its answer."""
    words = _words(first_answer)
    options: list[tuple[str, str]] = [("repeat your answer.", first_answer),
                                      ("what was the last word of your answer?",
                                       f"the last word was {words[-1]}."),
                                      ("what colour was the background?",
                                       f"the background was {scene.background}.")]
    colours = [c for c in _COLOUR_WORDS if c in words]
    if colours:
        options.append(("how many colours did you mention?",
                        f"i mentioned {_count(len(colours), 'colour')}."))
    kinds = [w for w in words if w in SHAPES]
    if kinds:
        options.append(("which shape did you mention first?", f"i mentioned the {kinds[0]} first."))
        options.append(("how many shapes did you mention?",
                        f"i mentioned {_count(len(kinds), 'shape')}."))
    spans = [_mention(s, first_answer) for s in scene.shapes]
    if all(i >= 0 for i in spans):
        order = sorted(zip(spans, scene.shapes), key=lambda t: t[0])
        options.append((rng.choice(["say it in fewer words.", "make it shorter."]),
                        ", ".join(f"{s.colour} {s.kind}" for _, s in order) + "."))
    return rng.choice(options)


def text_task(rng: random.Random) -> tuple[str, str]:
    """An unrelated text-only task (arithmetic, counting, colour mixing, ...)."""
    task = rng.randrange(6)
    if task == 0:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        x, y = NUMBER_WORDS[a], NUMBER_WORDS[b]
        return f"what is {x} plus {y}?", f"{x} plus {y} is {NUMBER_WORDS[a + b]}."
    if task == 1:
        a = rng.randint(1, 9)
        b = rng.randint(0, a)
        x, y = NUMBER_WORDS[a], NUMBER_WORDS[b]
        return f"what is {x} minus {y}?", f"{x} minus {y} is {NUMBER_WORDS[a - b]}."
    if task == 2:
        lo = rng.randint(1, 6)
        hi = rng.randint(lo + 2, min(lo + 5, 10))
        return (f"count from {NUMBER_WORDS[lo]} to {NUMBER_WORDS[hi]}.",
                ", ".join(NUMBER_WORDS[lo:hi + 1]) + ".")
    if task == 3:
        pair = rng.choice(list(_MIXES))
        a, b = pair if rng.random() < 0.5 else pair[::-1]
        return f"what colour do you get by mixing {a} and {b}?", f"{_MIXES[pair]}."
    if task == 4:
        kind = rng.choice(list(_SIDES))
        return (f"how many sides does a {kind} have?",
                f"a {kind} has {NUMBER_WORDS[_SIDES[kind]]} sides.")
    word = rng.choice(list(_OPPOSITES))
    return f"what is the opposite of {word}?", f"the opposite of {word} is {_OPPOSITES[word]}."


# ----------------------------------------------------------------------------- conversations

@dataclass(frozen=True)
class Turn:
    role: str  # "user" or "assistant"
    text: str
    images: tuple = ()  # PIL images shown before the text (user turns only)
    scenes: tuple = ()  # the scene graph of each image (for captions, labels)


def _user(text: str, scenes: tuple, image_size: int, with_images: bool) -> Turn:
    if not with_images:
        return Turn("user", text)
    return Turn("user", text, tuple(render(s, image_size) for s in scenes), tuple(scenes))


def _first_exchange(rng, image_size, with_images) -> tuple[Scene, list[Turn]]:
    scene = sample_scene(rng)
    if rng.random() < 0.5:
        question, answer = rng.choice(CAPTION_PROMPTS), caption(scene, rng)
    else:
        question, answer = rng.choice(qa_pairs(scene, rng))
    return scene, [_user(question, (scene,), image_size, with_images), Turn("assistant", answer)]


def _conversation(rng: random.Random, kind: str, image_size: int, with_images: bool) -> list[Turn]:
    def user(text: str, *scenes: Scene) -> Turn:
        return _user(text, scenes, image_size, with_images)

    if kind == "caption":
        scene = sample_scene(rng)
        return [user(rng.choice(CAPTION_PROMPTS), scene),
                Turn("assistant", caption(scene, rng))]
    if kind == "qa":
        scene = sample_scene(rng)
        question, answer = rng.choice(qa_pairs(scene, rng))
        return [user(question, scene), Turn("assistant", answer)]
    if kind == "difference":
        scene = sample_scene(rng)
        variant = make_variant(scene, rng)
        return [user(rng.choice(DIFFERENCE_PROMPTS), scene, variant),
                Turn("assistant", difference(scene, variant, rng))]
    if kind == "story":
        scenes = [sample_scene(rng)]
        for _ in range(4):
            scenes.append(make_variant(scenes[-1], rng))
        return [user(rng.choice(STORY_PROMPTS), *scenes),
                Turn("assistant", story(scenes, rng))]
    if kind == "followup":
        scene, turns = _first_exchange(rng, image_size, with_images)
        question, answer = followup(scene, turns[-1].text, rng)
        return turns + [Turn("user", question), Turn("assistant", answer)]
    if kind == "text_task":
        turns = [] if rng.random() < 0.3 else _first_exchange(rng, image_size, with_images)[1]
        question, answer = text_task(rng)
        return turns + [Turn("user", question), Turn("assistant", answer)]
    raise ValueError(f"unknown conversation kind {kind!r}; expected one of {KINDS}")


def sample_conversation(rng: random.Random, kind: str, image_size: int = 64) -> list[Turn]:
    """One conversation of the given kind (see ``KINDS``)."""
    return _conversation(rng, kind, image_size, with_images=True)


def _pick_kind(rng: random.Random, weights: dict[str, float] | None) -> str:
    weights = DEFAULT_WEIGHTS if weights is None else weights
    kinds = [k for k in KINDS if weights.get(k, 0) > 0]
    if not kinds:
        raise ValueError("weights select no conversation kind")
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


def sample_mix(rng: random.Random, weights: dict[str, float] | None = None,
               image_size: int = 64) -> tuple[str, list[Turn]]:
    """Pick a kind by ``weights`` (default ``DEFAULT_WEIGHTS``); return (kind, conversation)."""
    kind = _pick_kind(rng, weights)
    return kind, sample_conversation(rng, kind, image_size)


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


def corpus_lines(n: int, seed: int) -> list[str]:
    """``n`` lines of user/assistant text from the default mix (no images rendered)."""
    rng = random.Random(seed)
    lines: list[str] = []
    while len(lines) < n:
        kind = _pick_kind(rng, None)
        lines += [t.text for t in _conversation(rng, kind, 64, with_images=False)]
    return lines[:n]
