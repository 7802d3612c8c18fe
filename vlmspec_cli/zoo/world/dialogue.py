"""tinyworld conversations: multi-image turns (what changed, a story), text-only
follow-ups and tasks, and the mix of conversation kinds the models train on.

Every function that makes a choice takes an explicit ``random.Random``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

from vlmspec_cli.zoo.world.scene import (
    BACKGROUNDS, CAPTION_PROMPTS, COLOURS, DEFAULT_WEIGHTS, DIFFERENCE_PROMPTS, KINDS,
    MAX_VARIANT_SHAPES, NUMBER_WORDS, POSITION_PHRASES, POSITIONS, SHAPES, SIZES, STORY_PROMPTS,
    Scene, Shape, _count, _join, _mention, _name, _phrase, _sorted, caption, qa_pairs, render,
    sample_scene,
)

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



def corpus_lines(n: int, seed: int) -> list[str]:
    """``n`` lines of user/assistant text from the default mix (no images rendered)."""
    rng = random.Random(seed)
    lines: list[str] = []
    while len(lines) < n:
        kind = _pick_kind(rng, None)
        lines += [t.text for t in _conversation(rng, kind, 64, with_images=False)]
    return lines[:n]
