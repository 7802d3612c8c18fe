"""The tinyworld video models: tokenizer, model inputs, Qwen2.5-VL configs, saving.

* Tokenizer: byte-level BPE with Qwen-style vision specials; the chat template renders
  one ``<|video_pad|>`` per video.
* Inputs: ``video_inputs(tok, config, frames, question)``; the ``<|video_pad|>`` is
  expanded to t*h*w/merge**2 tokens (16 per 2 frames); ``mm_token_type_ids`` is 2 on
  video tokens; ``second_per_grid_ts`` = temporal_patch_size / fps with fps = frames /
  3 s. Pixels come from ``runtime.adapters.video_patches.patchify`` (the Qwen2-VL processor
  layout).
* Models: HF ``Qwen2_5_VLForConditionalGeneration``, a 6-layer target and a 1-layer
  draft with the same vision layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from vlmspec_cli.runtime.adapters.video_patches import patchify, resize_frames, smart_resize, video_token_count
from vlmspec_cli.zoo.video.world import DURATION

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
VIDEO_PAD, IMAGE_PAD = "<|video_pad|>", "<|image_pad|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, VISION_START, VISION_END, VIDEO_PAD, IMAGE_PAD]

# "USER: <|vision_start|><|video_pad|><|vision_end|>Q ASSISTANT: answer</s>"; the visual
# parts of a user turn come first, one placeholder per video / image.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %} "
    "{% elif message['role'] == 'assistant' %}ASSISTANT: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def train_video_tokenizer(lines: list[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen-style vision specials, wrapped for ``from_pretrained``."""
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(lines + ["USER:", " ASSISTANT:"] * 50, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        extra_special_tokens={"video_token": VIDEO_PAD, "image_token": IMAGE_PAD,
                              "vision_start_token": VISION_START, "vision_end_token": VISION_END},
        chat_template=CHAT_TEMPLATE, model_max_length=4096, padding_side="left",
    )


_PROMPTS: dict[tuple[int, str], str] = {}


def prompt_text(tok, question: str) -> str:
    """The chat template's generation prompt for one video and ``question``."""
    key = (id(tok), question)
    if key not in _PROMPTS:
        _PROMPTS[key] = _prompt_text(tok, question)
    return _PROMPTS[key]


def _prompt_text(tok, question: str) -> str:
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


# ----------------------------------------------------------------------------- inputs

MEAN, STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
MIN_PIXELS, MAX_PIXELS = 32 * 32, 128 * 128


def video_inputs(tok, config, frames: np.ndarray, question: str, fps: float | None = None
                 ) -> dict[str, torch.Tensor]:
    """Model inputs for ONE video (batch 1): input_ids, attention_mask,
    pixel_values_videos, video_grid_thw, mm_token_type_ids, second_per_grid_ts.

    ``frames``: (T, H, W, 3) uint8, resized to ``smart_resize`` if H, W are not already
    fitting multiples of patch*merge. ``fps``: the rate the frames were sampled at
    (default T / 3 s: the frames span one 3 s script)."""
    vision = config.vision_config
    frames = np.asarray(frames)
    factor = vision.patch_size * vision.spatial_merge_size
    h, w = smart_resize(frames.shape[1], frames.shape[2], factor, MIN_PIXELS, MAX_PIXELS)
    frames = resize_frames(frames, h, w)
    pix, grid = patchify(frames, vision.patch_size, vision.temporal_patch_size,
                         vision.spatial_merge_size, MEAN, STD)
    fps = fps if fps is not None else len(frames) / DURATION
    prompt = prompt_text(tok, question).replace(
        tok.video_token, tok.video_token * video_token_count(grid, vision.spatial_merge_size), 1)
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values_videos": pix,
        "video_grid_thw": grid[None],
        "mm_token_type_ids": (ids == config.video_token_id).long() * 2
        + (ids == config.image_token_id).long(),
        "second_per_grid_ts": torch.tensor([vision.temporal_patch_size / fps]),
    }


# ----------------------------------------------------------------------------- models

TARGET_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=4)
DRAFT_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=4)
# 64 px frames in 8 px patches, 2x2 merge: 4x4 = 16 tokens per 2 frames. window_size is
# in pixels: 32 px = 2x2 merged tokens per window (4 windows a frame) in block 0; block 1
# attends over the whole frame pair.
VISION = dict(depth=2, hidden_size=96, intermediate_size=192, num_heads=4, patch_size=8,
              temporal_patch_size=2, spatial_merge_size=2, window_size=32,
              fullatt_block_indexes=[1], tokens_per_second=2, hidden_act="silu")
# head_dim 32 -> 16 rotary frequencies: 4 temporal, 6 height, 6 width. theta 1e4: with
# theta 10 (tried first, so that the low-frequency width section would turn over the 0..3
# merged-grid positions) no frequency was slow enough for content-based attention and the
# model could not even learn "from top to -> bottom"; where things are and how they move
# is instead taught to the vision tower (the cell probe in ``train``).
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}


def make_model(tok, text: dict, seed: int) -> Qwen2_5_VLForConditionalGeneration:
    torch.manual_seed(seed)
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in
           [("video", VIDEO_PAD), ("image", IMAGE_PAD), ("start", VISION_START), ("end", VISION_END)]}
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), max_position_embeddings=4096, rms_norm_eps=1e-6,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, rope_parameters=dict(ROPE), **text),
        vision_config=dict(out_hidden_size=text["hidden_size"], **VISION),
        image_token_id=ids["image"], video_token_id=ids["video"],
        vision_start_token_id=ids["start"], vision_end_token_id=ids["end"],
        tie_word_embeddings=False,
    )
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def make_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=VISION["patch_size"], temporal_patch_size=VISION["temporal_patch_size"],
        merge_size=VISION["spatial_merge_size"], image_mean=MEAN, image_std=STD,
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


# ----------------------------------------------------------------------------- saving

def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def save(model, tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    make_image_processor().save_pretrained(out)
    # the processor keeps min/max pixels as size = {shortest_edge, longest_edge}; also write
    # the classic keys (from_pretrained maps them back to size) for readers that want them
    cfg_path = out / "preprocessor_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update({"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS})
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


