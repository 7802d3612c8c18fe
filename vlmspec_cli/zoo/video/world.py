"""The tinyworld video world: 3 s scripts of moving shapes, their frames and descriptions.

A script (8 fps, 24 raw frames) has one or two shapes (circle, square, triangle; red,
green, blue, yellow, purple) on a plain background. Each shape moves across the frame
(left->right, right->left, top->bottom, bottom->top) or stays. ``render_script(script,
n)`` draws n frames evenly spaced over the 3 s at 64x64 px; ``describe(script)`` names
the shapes in colour order, e.g. "a red circle moves from left to right while a blue
square stays.", "a red circle and a blue square stay."; ``parse_description`` reads such
a sentence back. The example videos (``examples/videos``) are scripts of this world
written as mp4 (``write_examples``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "videos"

FRAME_PX = 64
FPS = 8
DURATION = 3.0  # seconds
RAW_FRAMES = int(FPS * DURATION)  # 24
SHAPE_RADIUS = 9  # shapes are ~18 px across
MARGIN = SHAPE_RADIUS + 1  # centres stay in [MARGIN, FRAME_PX - MARGIN]
MIN_GAP = 20  # two shapes' centres never come closer (Chebyshev) than this
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 90, 230),
    "yellow": (240, 220, 40),
    "purple": (160, 60, 200),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "gray": (128, 128, 128),
    "black": (25, 25, 30),
    "white": (225, 225, 215),
}
SHAPES = ("circle", "square", "triangle")
MOTIONS = ("left to right", "right to left", "top to bottom", "bottom to top", "stays")
QUESTIONS = ("Describe the video.", "What happens in the video?", "Describe the motion.")


@dataclass(frozen=True)
class Actor:
    colour: str
    kind: str
    motion: str  # one of MOTIONS
    start: tuple[float, float]  # (x, y) centre at t = 0
    end: tuple[float, float]  # (x, y) centre at t = DURATION


@dataclass(frozen=True)
class Script:
    background: str
    actors: tuple[Actor, ...]  # in colour order (the order describe() names them)


def _path(motion: str, rng: random.Random) -> tuple[tuple[float, float], tuple[float, float]]:
    lo, hi = MARGIN, FRAME_PX - MARGIN
    across = rng.randint(lo, hi)
    if motion == "stays":
        x, y = rng.randint(lo, hi), rng.randint(lo, hi)
        return (x, y), (x, y)
    a, b = (lo, hi) if motion in ("left to right", "top to bottom") else (hi, lo)
    if motion in ("left to right", "right to left"):
        return (a, across), (b, across)
    return (across, a), (across, b)


def _centres(actor: Actor, n_frames: int) -> np.ndarray:
    """(n_frames, 2) centres, frames evenly spaced from t = 0 to t = DURATION."""
    u = np.linspace(0.0, 1.0, n_frames) if n_frames > 1 else np.zeros(1)
    start, end = np.asarray(actor.start, float), np.asarray(actor.end, float)
    return start[None] + u[:, None] * (end - start)[None]


def make_script(background: str, shapes: list[tuple[str, str, str]], rng: random.Random,
                tries: int = 500) -> Script:
    """A script with the given (colour, kind, motion) shapes, paths drawn from ``rng`` so
    that no two shapes ever overlap."""
    shapes = sorted(shapes, key=lambda s: list(COLOURS).index(s[0]))
    for _ in range(tries):
        actors = tuple(Actor(c, k, m, *_path(m, rng)) for c, k, m in shapes)
        paths = [_centres(a, RAW_FRAMES) for a in actors]
        if all(np.abs(p - q).max(axis=1).min() >= MIN_GAP
               for i, p in enumerate(paths) for q in paths[i + 1:]):
            return Script(background, actors)
    raise ValueError(f"could not place {shapes} without overlap")


def random_script(rng: random.Random) -> Script:
    """One or two shapes (distinct colours), each moving or staying (stays 1 in 3).
    Combinations that cannot be placed without overlap (rare) are drawn again."""
    while True:
        n = rng.choice((1, 2))
        colours = rng.sample(list(COLOURS), n)
        motions = [rng.choice(MOTIONS[:4]) if rng.random() < 2 / 3 else "stays" for _ in range(n)]
        shapes = [(c, rng.choice(SHAPES), m) for c, m in zip(colours, motions)]
        try:
            return make_script(rng.choice(list(BACKGROUNDS)), shapes, rng, tries=100)
        except ValueError:
            continue


_YY, _XX = np.mgrid[0:FRAME_PX, 0:FRAME_PX] + 0.5


def _mask(kind: str, cx: float, cy: float) -> np.ndarray:
    dx, dy = _XX - cx, _YY - cy
    r = SHAPE_RADIUS
    if kind == "circle":
        return dx * dx + dy * dy <= r * r
    if kind == "square":
        return (np.abs(dx) <= 0.8 * r) & (np.abs(dy) <= 0.8 * r)
    if kind == "triangle":  # apex up, base at the bottom
        return (dy <= 0.8 * r) & (dy >= -r) & (np.abs(dx) <= (dy + r) * (0.9 * r) / (1.8 * r))
    raise ValueError(kind)


def _render(script: Script, n_frames: int) -> tuple[np.ndarray, np.ndarray]:
    frames = np.empty((n_frames, FRAME_PX, FRAME_PX, 3), np.uint8)
    ids = np.zeros((n_frames, FRAME_PX, FRAME_PX), np.int8)  # 0 background, i+1 actor i
    frames[:] = BACKGROUNDS[script.background]
    centres = [_centres(a, n_frames) for a in script.actors]
    for t in range(n_frames):
        for i, actor in enumerate(script.actors):
            m = _mask(actor.kind, *centres[i][t])
            frames[t][m] = COLOURS[actor.colour]
            ids[t][m] = i + 1
    return frames, ids


def render_script(script: Script, n_frames: int = RAW_FRAMES) -> np.ndarray:
    """(n_frames, 64, 64, 3) uint8 frames evenly spaced over the script's 3 s (the first at
    t = 0, the last at t = 3 s); ``n_frames = RAW_FRAMES`` is the 8 fps video."""
    return _render(script, n_frames)[0]


def _clause(actor: Actor) -> str:
    verb = "stays" if actor.motion == "stays" else f"moves from {actor.motion}"
    return f"a {actor.colour} {actor.kind} {verb}"


def describe(script: Script) -> str:
    """The script's description; shapes are named in colour order."""
    actors = script.actors
    if len(actors) == 1:
        return _clause(actors[0]) + "."
    a, b = actors
    if a.motion == "stays" and b.motion == "stays":
        return f"a {a.colour} {a.kind} and a {b.colour} {b.kind} stay."
    joint = "and" if "stays" not in (a.motion, b.motion) else "while"
    return f"{_clause(a)} {joint} {_clause(b)}."


_NOUN = rf"a ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})"
_CLAUSE = re.compile(rf"^{_NOUN} (?:moves from ({'|'.join(MOTIONS[:4])})|(stays))$")
_BOTH_STAY = re.compile(rf"^{_NOUN} and {_NOUN} stay$")


def parse_description(text: str) -> list[tuple[str, str, str]] | None:
    """(colour, kind, motion) per shape named in a description, or None if it does not
    follow the grammar."""
    text = text.strip().rstrip(".").strip()
    m = _BOTH_STAY.match(text)
    if m:
        return [(m[1], m[2], "stays"), (m[3], m[4], "stays")]
    out = []
    for part in re.split(r" (?:while|and) (?=a )", text):
        m = _CLAUSE.match(part)
        if not m:
            return None
        out.append((m[1], m[2], m[3] or "stays"))
    return out


def corpus_lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [describe(random_script(rng)) for _ in range(n)] + list(QUESTIONS) * 50


# ----------------------------------------------------------------------------- example videos

EXAMPLE_SCRIPTS = [  # (file stem, background, shapes)
    ("red-circle-left-to-right", "gray", [("red", "circle", "left to right")]),
    ("blue-square-top-to-bottom-yellow-triangle-stays", "black",
     [("blue", "square", "top to bottom"), ("yellow", "triangle", "stays")]),
    ("green-triangle-right-to-left-purple-circle-bottom-to-top", "white",
     [("green", "triangle", "right to left"), ("purple", "circle", "bottom to top")]),
]


def write_video(path: Path, frames: np.ndarray, fps: int = FPS, codec: str = "mpeg4") -> None:
    import av

    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 400_000
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_examples(out: Path, seed: int) -> list[tuple[str, Script]]:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    made = []
    for stem, bg, shapes in EXAMPLE_SCRIPTS:
        script = make_script(bg, shapes, rng)
        write_video(out / f"{stem}.mp4", render_script(script, RAW_FRAMES))
        made.append((f"{stem}.mp4", script))
    lines = ["# Example videos (tinyworld video world)", "",
             f"Written by `python -m vlmspec_cli.zoo.video` (`write_examples`, seed {seed}, not a",
             f"training seed): {RAW_FRAMES} frames at {FPS} fps ({DURATION:g} s), {FRAME_PX}x{FRAME_PX} px,"
             " MPEG-4 part 2 (`mpeg4`, yuv420p) via PyAV. The `qwen-video-target` / `qwen-video-draft`",
             "models (`zoo:tinyworld/qwen-video-*`) describe them.", "",
             "| file | true description |", "|---|---|"]
    lines += [f"| `{name}` | {describe(s)} |" for name, s in made]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return made


