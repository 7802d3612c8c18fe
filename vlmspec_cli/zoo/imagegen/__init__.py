"""tinyworld image generation: two Janus text-to-image models (target and draft).

``scenes.py``: the one-shape scenes, their prompts and the pixel check of an image;
``model.py``: tokenizer, prompt contract, model configs; ``vq.py``: the VQ codes and
their training; ``generator.py``: training the generators; ``build.py``: evaluation and
``python -m vlmspec_cli.zoo.imagegen``. This package re-exports their public names.
"""

from vlmspec_cli.zoo.imagegen.build import evaluate, guided_argmax, main
from vlmspec_cli.zoo.imagegen.generator import (
    PROBE_CLASSES, batches, image_logits, make_dataset, prompt_labels, train_generator,
)
from vlmspec_cli.zoo.imagegen.model import (
    BOI, CHAT_TEMPLATE, DRAFT_TEXT, GUIDANCE, TARGET_TEXT, VQ, make_model, make_tokenizer,
    prompt_ids, unconditional,
)
from vlmspec_cli.zoo.imagegen.scenes import (
    CODE_DIM, CODEBOOK, FLAT_CODES, GRID, IMAGE_PX, MASK_CLUSTERS, NUM_IMAGE_TOKENS, PATCH,
    TEMPLATES, all_scenes, image_matches, palette_labels, sample_prompt_scene, to_images, to_pixels,
)
from vlmspec_cli.zoo.imagegen.vq import patch_codes, train_vq, vq_encode, vq_report

__all__ = [
    "evaluate", "guided_argmax", "main",
    "PROBE_CLASSES", "batches", "image_logits", "make_dataset", "prompt_labels", "train_generator",
    "BOI", "CHAT_TEMPLATE", "DRAFT_TEXT", "GUIDANCE", "TARGET_TEXT", "VQ", "make_model",
    "make_tokenizer", "prompt_ids", "unconditional",
    "CODE_DIM", "CODEBOOK", "FLAT_CODES", "GRID", "IMAGE_PX", "MASK_CLUSTERS", "NUM_IMAGE_TOKENS",
    "PATCH", "TEMPLATES", "all_scenes", "image_matches", "palette_labels", "sample_prompt_scene",
    "to_images", "to_pixels",
    "patch_codes", "train_vq", "vq_encode", "vq_report",
]
