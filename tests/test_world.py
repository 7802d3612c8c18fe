"""Tests for the tinyworld synthetic data generator."""

import random
import re

import pytest

from vlmspec_cli.zoo import world as w

ALLOWED = re.compile(r"^[a-z .,?]+$")
EXPECTED_IMAGES = {"caption": {1}, "qa": {1}, "difference": {2}, "story": {5},
                   "followup": {1}, "text_task": {0, 1}}


def _scenes(seed, n, **kw):
    rng = random.Random(seed)
    return [w.sample_scene(rng, **kw) for _ in range(n)]


def _n_changes(a, b):
    """Independent count of single-step edits between two scenes."""
    n = int(a.background != b.background)
    only_a = set(a.shapes) - set(b.shapes)
    only_b = set(b.shapes) - set(a.shapes)
    if not only_a and not only_b:
        return n
    if len(only_a) + len(only_b) == 1:
        return n + 1
    if len(only_a) == len(only_b) == 1:
        x, y = only_a.pop(), only_b.pop()
        diff = sum(getattr(x, f) != getattr(y, f) for f in ("kind", "colour", "size", "position"))
        return n + diff
    return n + len(only_a) + len(only_b)


def test_determinism():
    assert _scenes(7, 20) == _scenes(7, 20)
    assert _scenes(7, 20) != _scenes(8, 20)
    scene = _scenes(3, 1)[0]
    assert w.render(scene).tobytes() == w.render(scene).tobytes()
    conv_a = [w.sample_mix(random.Random(5)) for _ in range(3)]
    conv_b = [w.sample_mix(random.Random(5)) for _ in range(3)]
    for (ka, ta), (kb, tb) in zip(conv_a, conv_b):
        assert ka == kb
        assert [t.text for t in ta] == [t.text for t in tb]
        assert [im.tobytes() for t in ta for im in t.images] == \
               [im.tobytes() for t in tb for im in t.images]
    assert w.corpus_lines(50, 1) == w.corpus_lines(50, 1)
    assert len(w.corpus_lines(50, 1)) == 50
    state = random.getstate()
    w.corpus_lines(30, 2)
    assert random.getstate() == state  # global RNG untouched


def test_scene_invariants():
    for scene in _scenes(0, 300, min_shapes=1, max_shapes=5):
        colours = [s.colour for s in scene.shapes]
        cells = [s.position for s in scene.shapes]
        assert scene.background not in colours
        assert len(set(colours)) == len(colours)
        assert len(set(cells)) == len(cells)
        assert cells == sorted(cells, key=w.POSITIONS.index)
        assert 1 <= len(scene.shapes) <= 5
        assert all(s.kind in w.SHAPES and s.size in w.SIZES and s.colour in w.COLOURS
                   for s in scene.shapes)
    assert len(w.COLOURS) == 8 and len(set(w.COLOURS.values())) == 8
    assert len(w.BACKGROUNDS) == 5


@pytest.mark.parametrize("size", [64, 96])
def test_render_pixels(size):
    checked = 0
    for scene in _scenes(1, 40):
        image = w.render(scene, size)
        assert image.mode == "RGB" and image.size == (size, size)
        for shape in scene.shapes:
            row, col = divmod(w.POSITIONS.index(shape.position), 3)
            cx = (col * size // 3 + (col + 1) * size // 3) // 2
            cy = (row * size // 3 + (row + 1) * size // 3) // 2
            assert image.getpixel((cx, cy)) == w.COLOURS[shape.colour]
            checked += 1
        corner = image.getpixel((0, 0))
        if not any(s.position == "top left" and s.size == "large" for s in scene.shapes):
            assert corner == w.BACKGROUNDS[scene.background]
    assert checked > 40


def test_captions_correct_and_swap_fails():
    rng = random.Random(2)
    for scene in _scenes(4, 200):
        text = w.caption(scene, rng)
        assert w.caption_is_correct(scene, text), text
        shape = scene.shapes[0]
        # swap one shape's colour for one absent from the scene
        other = next(c for c in w.COLOURS if c not in {s.colour for s in scene.shapes})
        swapped = re.sub(rf"\b{shape.colour}\b", other, text)
        assert not w.caption_is_correct(scene, swapped), swapped
        # drop the position phrase of one shape (replace with an unused cell)
        free = [p for p in w.POSITIONS if p not in {s.position for s in scene.shapes}]
        moved = text.replace(w.POSITION_PHRASES[shape.position], w.POSITION_PHRASES[free[0]])
        assert not w.caption_is_correct(scene, moved), moved


def test_caption_position_phrases_are_not_prefix_matched():
    scene = w.Scene("gray", (w.Shape("circle", "red", "large", "top"),))
    assert w.caption_is_correct(scene, "a large red circle at the top, on a gray background.")
    assert not w.caption_is_correct(scene, "a large red circle at the top left, on a gray background.")
    assert not w.caption_is_correct(scene, "a large red circle at the top.")


def test_caption_variety():
    rng = random.Random(9)
    words = list(w.COLOURS) + list(w.BACKGROUNDS) + list(w.SHAPES) + list(w.SIZES)
    skeletons = set()
    for scene in _scenes(9, 50, min_shapes=2, max_shapes=2):
        text = w.caption(scene, rng)
        for phrase in sorted(w.POSITION_PHRASES.values(), key=len, reverse=True):
            text = text.replace(phrase, "P")
        skeletons.add(re.sub(rf"\b({'|'.join(words)})\b", "X", text))
    assert len(skeletons) >= 3, skeletons


def test_qa_answers():
    scene = w.Scene("gray", (w.Shape("circle", "red", "large", "top left"),
                             w.Shape("square", "blue", "small", "center")))
    pairs = dict(w.qa_pairs(scene, random.Random(0)))
    assert pairs.get("how many shapes are there?", "there are two shapes.") == "there are two shapes."
    for seed in range(30):
        for q, a in w.qa_pairs(scene, random.Random(seed)):
            if q.startswith("what colour is the ") and q != "what colour is the background?":
                assert a in ("the circle is red.", "the square is blue.")
            if q.startswith("where is the red circle"):
                assert a == "the red circle is at the top left."
            if q == "is the blue square large or small?":
                assert a == "the blue square is small."
            if q.startswith("is there a "):
                assert a.startswith("yes") == (q in ("is there a red circle?", "is there a blue square?"))
    dup = w.Scene("gray", (w.Shape("circle", "red", "large", "top left"),
                           w.Shape("circle", "blue", "small", "center")))
    for seed in range(30):
        assert not any(q.endswith("the circle?") for q, _ in w.qa_pairs(dup, random.Random(seed)))


def test_make_variant_single_change_and_difference():
    rng = random.Random(11)
    for scene in _scenes(12, 200):
        variant = w.make_variant(scene, rng)
        assert _n_changes(scene, variant) == 1, (scene, variant)
        colours = [s.colour for s in variant.shapes]
        assert variant.background not in colours and len(set(colours)) == len(colours)
        assert len({s.position for s in variant.shapes}) == len(variant.shapes)
        text = w.difference(scene, variant, rng)
        assert text != "the two images are the same."
        assert ALLOWED.match(text)
    scene = w.Scene("gray", (w.Shape("circle", "red", "large", "top left"),))
    blue = w.Scene("gray", (w.Shape("circle", "blue", "large", "top left"),))
    texts = {w.difference(scene, blue, random.Random(s)) for s in range(10)}
    assert "in the second image the circle at the top left is blue instead of red." in texts
    assert w.difference(scene, scene, random.Random(0)) == "the two images are the same."


def test_conversations_structure_and_charset():
    rng = random.Random(13)
    for kind in w.KINDS:
        counts = set()
        for _ in range(8):
            turns = w.sample_conversation(rng, kind, image_size=32)
            assert turns and turns[-1].role == "assistant"
            assert [t.role for t in turns] == ["user", "assistant"] * (len(turns) // 2)
            assert all(not t.images for t in turns if t.role == "assistant")
            assert all(t.images == () for t in turns[2:])  # follow-ups are text-only
            n_images = sum(len(t.images) for t in turns)
            assert n_images in EXPECTED_IMAGES[kind], (kind, n_images)
            counts.add(n_images)
            assert all(im.size == (32, 32) for t in turns for im in t.images)
        if kind != "text_task":
            assert counts == EXPECTED_IMAGES[kind]
    with pytest.raises(ValueError):
        w.sample_conversation(rng, "nope")


def test_text_charset_and_format():
    lines = w.corpus_lines(600, 3)
    for line in lines:
        assert ALLOWED.match(line), line
        assert "  " not in line and line == line.strip()
        assert line[-1] in ".?"
    joined = " ".join(lines)
    for needle in ("plus", "count from", "mixing", "fewer words", "spot the difference",
                   "finally", "instead of", "how many shapes"):
        assert needle in joined, needle


def test_followup_and_text_task():
    scene = w.Scene("gray", (w.Shape("circle", "red", "large", "top left"),
                             w.Shape("square", "blue", "small", "center")))
    first = "a large red circle at the top left and a small blue square in the center, on a gray background."
    answers = {}
    for seed in range(60):
        q, a = w.followup(scene, first, random.Random(seed))
        answers[q] = a
    assert answers["how many colours did you mention?"] == "i mentioned three colours."
    assert answers["which shape did you mention first?"] == "i mentioned the circle first."
    assert answers["say it in fewer words."] == "red circle, blue square."
    numbers = {word: i for i, word in enumerate(w.NUMBER_WORDS)}
    kinds = set()
    for seed in range(300):
        q, a = w.text_task(random.Random(seed))
        assert ALLOWED.match(q) and ALLOWED.match(a)
        m = re.fullmatch(r"what is (\w+) (plus|minus) (\w+)\?", q)
        if m:
            x, op, y = numbers[m[1]], m[2], numbers[m[3]]
            z = x + y if op == "plus" else x - y
            assert a == f"{m[1]} {op} {m[3]} is {w.NUMBER_WORDS[z]}."
            kinds.add(op)
        m = re.fullmatch(r"count from (\w+) to (\w+)\.", q)
        if m:
            assert a == ", ".join(w.NUMBER_WORDS[numbers[m[1]]:numbers[m[2]] + 1]) + "."
            kinds.add("count")
        if q in ("what colour do you get by mixing blue and yellow?",
                 "what colour do you get by mixing yellow and blue?"):
            assert a == "green."
            kinds.add("mix")
    assert kinds == {"plus", "minus", "count", "mix"}


def test_answer_is_correct():
    assert w.answer_is_correct("the circle is red.", "  the circle   is red. ")
    assert not w.answer_is_correct("the circle is red.", "the circle is blue.")


def test_sample_mix_weights():
    rng = random.Random(0)
    kinds = [w.sample_mix(rng, {"story": 0, "qa": 1.0}, image_size=16)[0] for _ in range(10)]
    assert set(kinds) == {"qa"}
    kinds = {w.sample_mix(rng, None, image_size=16)[0] for _ in range(60)}
    assert {"caption", "qa"} <= kinds


def test_caption_is_exact_accepts_ground_truth_and_rejects_near_misses():
    rng = random.Random(3)
    for scene in _scenes(5, 200):
        text = w.caption(scene, rng)
        assert w.caption_is_exact(scene, text), text
    scene = w.Scene("gray", (w.Shape("circle", "red", "small", "top"),))
    assert w.caption_is_exact(scene, "a small red circle at the top, on a gray background.")
    assert w.caption_is_exact(scene, "at the top there is a small red circle. the background is gray.")
    for wrong in ("a large red circle at the top, on a gray background.",          # size
                  "a small red circle at the top left, on a gray background.",     # position
                  "a small red circle at the top, on a blue background.",          # background
                  "a small red circle at the top and a small blue square on the left, "
                  "on a gray background."):                                        # extra shape
        assert not w.caption_is_exact(scene, wrong), wrong
        assert w.caption_is_correct(scene, "a small red circle at the top, on a gray background.")


def test_build_all_lists_every_shipped_model_as_runnable_steps(capsys):
    """`zoo.build --all` names a build step for every shipped model folder, and each step's
    script exists with main(argv) and accepts the step's choices (checked without training)."""
    import importlib
    from pathlib import Path

    from vlmspec_cli.zoo import build, deepen, hidden, pipeline

    build.main(["--list"])
    listed = capsys.readouterr().out
    assert listed.count("python -m vlmspec_cli.zoo.") == len(pipeline.STEPS) == 14
    shipped = {p.name for p in (Path(build.__file__).parent / "weights" / "tinyworld").iterdir() if p.is_dir()}
    named = " ".join(s.name for s in pipeline.STEPS)
    assert not [m for m in shipped if m not in named.replace(",", " ").split()], shipped
    for step in pipeline.STEPS:
        assert callable(importlib.import_module(f"vlmspec_cli.zoo.{step.module}").main)
        argv = list(step.argv)
        if step.module == "hidden":
            assert argv[argv.index("--target") + 1] in hidden.TARGETS
        if step.module == "deepen":
            assert argv[argv.index("--family") + 1] in deepen.FAMILIES
    assert [i for i, _ in pipeline.select(9, 10)] == [9, 10]
    with pytest.raises(ValueError, match="steps run from 1 to 14"):
        pipeline.select(15)


@pytest.mark.parametrize("module", ["hidden", "eagle3_build", "mmspec_sample"])
def test_zoo_help_describes_in_whole_sentences(module, capsys):
    """A zoo script's --help states its docstring's first paragraph whole (it used to stop
    at the first line: "… for the tinyworld targets, on")."""
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(f"vlmspec_cli.zoo.{module}").main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    first = importlib.import_module(f"vlmspec_cli.zoo.{module}").__doc__.split("\n\n")[0]
    assert " ".join(first.split()) in text and first.rstrip().endswith((".", ":", "``"))
