"""tinyworld: a deterministic synthetic world of coloured shapes on a 3x3 grid.

Used to train and evaluate tiny LLaVA-style models on CPU. ``scene.py``: scenes,
rendering, captions, Q&A and the checks that score answers; ``dialogue.py``: multi-image
and text-only turns and the conversation mix. This package re-exports their public names
(``from vlmspec_cli.zoo import world; world.render(...)``).
"""

from vlmspec_cli.zoo.world.dialogue import (
    Turn, corpus_lines, difference, followup, make_variant, sample_conversation, sample_mix, story,
    text_task,
)
from vlmspec_cli.zoo.world.scene import (
    BACKGROUNDS, CAPTION_PROMPTS, COLOURS, DEFAULT_WEIGHTS, DIFFERENCE_PROMPTS, KINDS,
    MAX_VARIANT_SHAPES, NUMBER_WORDS, POSITION_PHRASES, POSITIONS, SHAPES, SIZE_FRACTION, SIZES,
    STORY_PROMPTS, Scene, Shape, answer_is_correct, caption, caption_is_correct, caption_is_exact,
    qa_pairs, render, sample_scene,
)

__all__ = [
    "Turn", "corpus_lines", "difference", "followup", "make_variant", "sample_conversation",
    "sample_mix", "story", "text_task",
    "BACKGROUNDS", "CAPTION_PROMPTS", "COLOURS", "DEFAULT_WEIGHTS", "DIFFERENCE_PROMPTS", "KINDS",
    "MAX_VARIANT_SHAPES", "NUMBER_WORDS", "POSITION_PHRASES", "POSITIONS", "SHAPES",
    "SIZE_FRACTION", "SIZES", "STORY_PROMPTS", "Scene", "Shape", "answer_is_correct", "caption",
    "caption_is_correct", "caption_is_exact", "qa_pairs", "render", "sample_scene",
]
