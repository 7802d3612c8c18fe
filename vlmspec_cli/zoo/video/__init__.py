"""tinyworld video models (Qwen2.5-VL) that describe short videos of moving shapes.

``world.py``: the scripts, their frames and descriptions, the example videos;
``model.py``: tokenizer, model inputs, configs, saving; ``training.py``: vision
pre-training and end-to-end training; ``report.py``: evaluation and BUILD_REPORT.md;
``build.py``: ``python -m vlmspec_cli.zoo.video`` (builds everything). This package
re-exports their public names, e.g. ``from vlmspec_cli.zoo import video; video.describe``.
"""

from vlmspec_cli.zoo.train import WEIGHTS
from vlmspec_cli.zoo.video.build import main
from vlmspec_cli.zoo.video.model import (
    BOS, CHAT_TEMPLATE, DRAFT_TEXT, EOS, IMAGE_PAD, MAX_PIXELS, MEAN, MIN_PIXELS, PAD, ROPE,
    SPECIAL_TOKENS, STD, TARGET_TEXT, VIDEO_PAD, VISION, VISION_END, VISION_START,
    make_image_processor, make_model, prompt_text, save, train_video_tokenizer, video_inputs,
)
from vlmspec_cli.zoo.video.report import agreement, eval_scripts, evaluate, greedy, score, write_report
from vlmspec_cli.zoo.video.training import (
    CELL, FRAME_COUNTS, FRAME_WEIGHTS, N_CLASSES, N_MOTIONS, cell_labels, collate, encode_example,
    pretrain_vision, train,
)
from vlmspec_cli.zoo.video.world import (
    BACKGROUNDS, COLOURS, DURATION, EXAMPLE_SCRIPTS, EXAMPLES, FPS, FRAME_PX, MARGIN, MIN_GAP,
    MOTIONS, QUESTIONS, RAW_FRAMES, SHAPE_RADIUS, SHAPES, Actor, Script, corpus_lines, describe,
    make_script, parse_description, random_script, render_script, write_examples, write_video,
)

__all__ = [
    "WEIGHTS", "main",
    "BOS", "CHAT_TEMPLATE", "DRAFT_TEXT", "EOS", "IMAGE_PAD", "MAX_PIXELS", "MEAN", "MIN_PIXELS",
    "PAD", "ROPE", "SPECIAL_TOKENS", "STD", "TARGET_TEXT", "VIDEO_PAD", "VISION", "VISION_END",
    "VISION_START", "make_image_processor", "make_model", "prompt_text", "save",
    "train_video_tokenizer", "video_inputs",
    "agreement", "eval_scripts", "evaluate", "greedy", "score", "write_report",
    "CELL", "FRAME_COUNTS", "FRAME_WEIGHTS", "N_CLASSES", "N_MOTIONS", "cell_labels", "collate",
    "encode_example", "pretrain_vision", "train",
    "BACKGROUNDS", "COLOURS", "DURATION", "EXAMPLE_SCRIPTS", "EXAMPLES", "FPS", "FRAME_PX", "MARGIN",
    "MIN_GAP", "MOTIONS", "QUESTIONS", "RAW_FRAMES", "SHAPE_RADIUS", "SHAPES", "Actor", "Script",
    "corpus_lines", "describe", "make_script", "parse_description", "random_script",
    "render_script", "write_examples", "write_video",
]
