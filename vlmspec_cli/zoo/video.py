"""tinyworld video models: ``python -m vlmspec_cli.zoo.video``.

Builds, on CPU and deterministically, two Qwen2.5-VL models (HF
``Qwen2_5_VLForConditionalGeneration``) that describe short videos of moving shapes: a
6-layer target and a 1-layer draft that share one tokenizer and the vision layout (the
draft reads all visual tokens itself; its vision tower starts from the target's).

* World: a 3 s script (8 fps, 24 raw frames) of one or two shapes (circle, square,
  triangle; red, green, blue, yellow, purple) on a plain background. Each shape moves
  across the frame (left->right, right->left, top->bottom, bottom->top) or stays.
  ``render_script(script, n)`` draws n frames evenly spaced over the 3 s at 64x64 px.
* Description: ``describe(script)``, shapes in colour order, e.g. "a red circle moves
  from left to right while a blue square stays.", "a red circle and a blue square stay."
* Inputs: ``video_inputs(tok, config, frames, question)``; the chat template renders one
  ``<|video_pad|>`` per video, expanded to t*h*w/merge**2 tokens (16 per 2 frames);
  ``mm_token_type_ids`` is 2 on video tokens; ``second_per_grid_ts`` =
  temporal_patch_size / fps with fps = frames / 3 s. Pixels come from
  ``runtime.video_patches.patchify`` (the Qwen2-VL processor layout).
* Training: first the vision tower alone on a linear probe on the merged vision tokens
  (each cell's shape colour/kind and its motion; ``pretrain_vision``), then teacher
  forcing on the answer tokens (prompt + " " + description + eos) with N in {4, 8, 16}
  frames per batch plus the same probe (two runs for the target); probes are thrown away.

Saves ``weights/tinyworld/qwen-video-{target,draft}`` (tokenizer and a
``preprocessor_config.json`` from ``Qwen2VLImageProcessor`` in each) and writes
``qwen-video-target/BUILD_REPORT.md`` with accuracy on fresh scripts at 4/8/16/64 frames.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from vlmspec_cli.runtime.video_patches import patchify, resize_frames, smart_resize, video_token_count
from vlmspec_cli.tasks.video_io import read_video

WEIGHTS = Path(__file__).resolve().parent / "weights" / "tinyworld"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "videos"

# ----------------------------------------------------------------------------- world

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


# ----------------------------------------------------------------------------- tokenizer

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


# ----------------------------------------------------------------------------- training

FRAME_COUNTS = (4, 8, 16)
FRAME_WEIGHTS = (0.4, 0.35, 0.25)  # 16-frame batches cost twice an 8-frame one
CELL = FRAME_PX // 4  # one merged token covers 16x16 px
N_CLASSES = 1 + len(COLOURS) * len(SHAPES)  # 0 = background
N_MOTIONS = 1 + len(MOTIONS)  # 0 = background


def cell_labels(script: Script, ids: np.ndarray, tp: int = 2) -> torch.Tensor:
    """(groups * 16, 2) per merged token (patchify order): the colour+kind class and the
    motion of the shape covering most of the cell over the group's frames (0 if none)."""
    t = ids.shape[0]
    if t % tp:
        ids = np.concatenate([ids, np.repeat(ids[-1:], tp - t % tp, axis=0)])
    g = ids.shape[0] // tp
    cells = ids.reshape(g, tp, 4, CELL, 4, CELL).transpose(0, 2, 4, 1, 3, 5).reshape(g, 16, -1)
    out = torch.zeros(g * 16, 2, dtype=torch.long)
    counts = np.stack([(cells == i + 1).sum(-1) for i in range(len(script.actors))], -1)  # g,16,A
    best, n = counts.argmax(-1).ravel(), counts.max(-1).ravel()
    for j in np.nonzero(n >= 0.15 * cells.shape[-1])[0]:
        a = script.actors[best[j]]
        out[j, 0] = 1 + list(COLOURS).index(a.colour) * len(SHAPES) + SHAPES.index(a.kind)
        out[j, 1] = 1 + MOTIONS.index(a.motion)
    return out


def encode_example(tok, config, script: Script, n_frames: int, question: str, noise: float = 0.0,
                   rng: np.random.Generator | None = None) -> dict:
    frames, ids = _render(script, n_frames)
    if noise:
        frames = np.clip(frames + rng.normal(0, noise, frames.shape), 0, 255).astype(np.uint8)
    inp = video_inputs(tok, config, frames, question)
    answer = tok(" " + describe(script) + tok.eos_token, add_special_tokens=False)["input_ids"]
    inp["labels"] = torch.cat([torch.full_like(inp["input_ids"], -100), torch.tensor([answer])], 1)
    inp["input_ids"] = torch.cat([inp["input_ids"], torch.tensor([answer])], 1)
    inp["attention_mask"] = torch.ones_like(inp["input_ids"])
    inp["mm_token_type_ids"] = torch.cat([inp["mm_token_type_ids"], torch.zeros(1, len(answer), dtype=torch.long)], 1)
    inp["cells"] = cell_labels(script, ids)
    return inp


def collate(examples: list[dict], pad_id: int) -> dict:
    width = max(e["input_ids"].shape[1] for e in examples)
    b = len(examples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    labels = torch.full((b, width), -100, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = e["input_ids"].shape[1]
        ids[i, :n], labels[i, :n], mask[i, :n] = e["input_ids"][0], e["labels"][0], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "mm_token_type_ids": (ids == examples[0]["video_token_id"]).long() * 2,
            "pixel_values_videos": torch.cat([e["pixel_values_videos"] for e in examples]),
            "video_grid_thw": torch.cat([e["video_grid_thw"] for e in examples]),
            "second_per_grid_ts": torch.cat([e["second_per_grid_ts"] for e in examples])}


def _probe_loss(probe, feats: torch.Tensor, cells: torch.Tensor) -> tuple[torch.Tensor, dict]:
    logits = probe(feats)
    fg = cells[:, 0] > 0
    # foreground cells weigh as much as all background cells together (most cells are
    # background, which otherwise dominates the probe and teaches little)
    w = torch.where(fg, (~fg).sum().clamp(min=1) / fg.sum().clamp(min=1), torch.ones(())).float()
    loss = ((F.cross_entropy(logits[:, :N_CLASSES], cells[:, 0], reduction="none")
             + F.cross_entropy(logits[:, N_CLASSES:], cells[:, 1], reduction="none")) * w).sum() / w.sum()
    acc = {"class": (logits[fg, :N_CLASSES].argmax(-1) == cells[fg, 0]).float().mean().item(),
           "motion": (logits[fg, N_CLASSES:].argmax(-1) == cells[fg, 1]).float().mean().item()}
    return loss, acc


def pretrain_vision(model, steps: int, lr: float, batch: int, seed: int, label: str,
                    frame_weights: tuple[float, ...] | None = None) -> dict:
    """Vision tower only: the cell probe (colour+kind class and motion of each merged
    token) on fresh scripts, before end-to-end training. Cheap (no language model), so
    the tower can take many more videos than in the end-to-end phase."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    vision = model.config.vision_config
    visual = model.model.visual
    probe = torch.nn.Linear(model.config.text_config.hidden_size, N_CLASSES + N_MOTIONS)
    params = [*visual.parameters(), *probe.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    visual.train()
    t0 = time.time()
    ema = None
    for step in range(steps):
        n = rng.choices(FRAME_COUNTS, weights=frame_weights)[0] if frame_weights else rng.choice(FRAME_COUNTS)
        pix, grids, cells = [], [], []
        for _ in range(batch):
            script = random_script(rng)
            frames, ids = _render(script, n)
            if rng.random() < 0.5:
                frames = np.clip(frames + nrng.normal(0, 6.0, frames.shape), 0, 255).astype(np.uint8)
            p, g = patchify(frames, vision.patch_size, vision.temporal_patch_size,
                            vision.spatial_merge_size, MEAN, STD)
            pix.append(p)
            grids.append(g[None])
            cells.append(cell_labels(script, ids))
        feats = visual(torch.cat(pix), grid_thw=torch.cat(grids)).pooler_output
        loss, acc = _probe_loss(probe, feats, torch.cat(cells))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema = acc if ema is None else {k: 0.95 * ema[k] + 0.05 * v for k, v in acc.items()}
        if step % 50 == 0 or step == steps - 1:
            print(f"[{label}] step {step:5d}/{steps} N={n:2d} probe {loss.item():.4f} "
                  f"class {ema['class']:.3f} motion {ema['motion']:.3f} ({time.time() - t0:.0f}s)", flush=True)
    visual.eval()
    return {"steps": steps, "lr": lr, "batch": batch, "train_seconds": round(time.time() - t0, 1),
            "final_probe_loss": round(loss.item(), 4),
            "probe_acc_ema": {k: round(v, 3) for k, v in ema.items()}}, probe


def train(model, tok, steps: int, lr: float, batch: int, seed: int, label: str,
          aux_weight: float = 1.0, frame_weights: tuple[float, ...] | None = None,
          probe: torch.nn.Module | None = None) -> dict:
    """Teacher forcing on fresh scripts (N frames per batch from FRAME_COUNTS) plus the
    cell probe on the merged vision tokens; AdamW, warm-up then cosine decay."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    hidden = model.config.text_config.hidden_size
    probe = probe if probe is not None else torch.nn.Linear(hidden, N_CLASSES + N_MOTIONS)
    captured = {}
    hook = model.model.visual.register_forward_hook(
        lambda mod, args, out: captured.__setitem__("feats", out.pooler_output))
    params = [*model.parameters(), *probe.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    t0 = time.time()
    for step in range(steps):
        n = rng.choices(FRAME_COUNTS, weights=frame_weights)[0] if frame_weights else rng.choice(FRAME_COUNTS)
        exs = []
        for _ in range(batch):
            e = encode_example(tok, model.config, random_script(rng), n, rng.choice(QUESTIONS),
                               noise=6.0 if rng.random() < 0.5 else 0.0, rng=nrng)
            e["video_token_id"] = model.config.video_token_id
            exs.append(e)
        inputs = collate(exs, tok.pad_token_id)
        lm = model(**inputs).loss
        cells = torch.cat([e["cells"] for e in exs])
        aux, _ = _probe_loss(probe, captured.pop("feats"), cells)
        loss = lm + aux_weight * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps - 1:
            print(f"[{label}] step {step:5d}/{steps} N={n:2d} lm {lm.item():.4f} aux {aux.item():.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    hook.remove()
    model.eval()
    return {"steps": steps, "lr": lr, "batch": batch, "train_seconds": round(time.time() - t0, 1),
            "final_lm_loss": round(lm.item(), 4), "frame_weights": frame_weights}


# ----------------------------------------------------------------------------- evaluation

@torch.inference_mode()
def greedy(model, tok, inputs: dict, max_new_tokens: int = 40) -> list[int]:
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def score(script: Script, text: str) -> dict[str, int]:
    """Per-shape hits: colour named, kind of that colour right, motion of that colour right."""
    pred = parse_description(text) or []
    by_colour = {c: (k, m) for c, k, m in pred}
    hits = {"shapes": len(script.actors), "colour": 0, "kind": 0, "motion": 0}
    for a in script.actors:
        if a.colour in by_colour:
            hits["colour"] += 1
            hits["kind"] += by_colour[a.colour][0] == a.kind
            hits["motion"] += by_colour[a.colour][1] == a.motion
    hits["count"] = int(len(pred) == len(script.actors))
    hits["exact"] = int(text.strip() == describe(script))
    hits["parsed"] = int(bool(pred))
    return hits


def eval_scripts(n: int, seed: int) -> list[Script]:
    rng = random.Random(seed)
    return [random_script(rng) for _ in range(n)]


@torch.inference_mode()
def evaluate(model, tok, scripts: list[Script], n_frames: int, seed: int = 0,
             keep_outputs: bool = False) -> dict:
    rng = random.Random(seed)
    tot: dict[str, int] = {}
    outputs = []
    t0 = time.time()
    for script in scripts:
        inputs = video_inputs(tok, model.config, render_script(script, n_frames), rng.choice(QUESTIONS))
        out = greedy(model, tok, inputs)
        text = tok.decode(out, skip_special_tokens=True).strip()
        for k, v in score(script, text).items():
            tot[k] = tot.get(k, 0) + v
        outputs.append((inputs, out))
    n, shapes = len(scripts), tot["shapes"]
    res = {"frames": n_frames, "videos": n, "exact": round(tot["exact"] / n, 3),
           "count": round(tot["count"] / n, 3), "colour": round(tot["colour"] / shapes, 3),
           "shape": round(tot["kind"] / shapes, 3), "motion": round(tot["motion"] / shapes, 3),
           "parsed": round(tot["parsed"] / n, 3), "seconds": round(time.time() - t0, 1)}
    if keep_outputs:
        res["_outputs"] = outputs
    return res


@torch.inference_mode()
def agreement(target, draft, outputs) -> dict:
    """On the target's greedy outputs: how often the draft's argmax (teacher-forced on the
    target's tokens) equals the target's next token, and how often the draft's own greedy
    output equals the target's."""
    hit = total = same = 0
    for inputs, out in outputs:
        ids = torch.cat([inputs["input_ids"], torch.tensor([out])], 1)
        full = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids),
                    mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"],
                                                 torch.zeros(1, len(out), dtype=torch.long)], 1))
        logits = draft(**full).logits[0, inputs["input_ids"].shape[1] - 1: -1]
        hit += (logits.argmax(-1) == torch.tensor(out)).sum().item()
        total += len(out)
        same += greedy(draft, None, inputs) == out
    return {"token_agreement": round(hit / total, 4), "sequence_match": round(same / len(outputs), 3)}


# ----------------------------------------------------------------------------- examples

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


# ----------------------------------------------------------------------------- main

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    ap.add_argument("--examples-dir", type=Path, default=EXAMPLES)
    ap.add_argument("--vision-steps", type=int, default=1200)
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--target-steps-2", type=int, default=1000)
    ap.add_argument("--draft-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-videos", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="1: on a shared 2-CPU machine 2 threads thrashed (steps 5-10x slower)")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the saved models, rewrite the report")
    ap.add_argument("--draft-only", action="store_true",
                    help="keep the saved target (and its tokenizer), rebuild the draft, evaluate both")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite BUILD_REPORT.md from the saved BUILD_REPORT.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    tdir, ddir = args.out / "qwen-video-target", args.out / "qwen-video-draft"
    report: dict = {"seed": args.seed}
    if args.report_only:
        write_report(tdir / "BUILD_REPORT.md", json.loads((tdir / "BUILD_REPORT.json").read_text()),
                     Qwen2_5_VLForConditionalGeneration.from_pretrained(tdir, use_safetensors=True),
                     Qwen2_5_VLForConditionalGeneration.from_pretrained(ddir, use_safetensors=True))
        return
    t_start = time.time()
    if args.eval_only or args.draft_only:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tdir)
        target = Qwen2_5_VLForConditionalGeneration.from_pretrained(tdir, use_safetensors=True).eval()
        if args.eval_only:
            draft = Qwen2_5_VLForConditionalGeneration.from_pretrained(ddir, use_safetensors=True).eval()
        old = tdir / "BUILD_REPORT.json"
        if old.exists():
            report.update({k: v for k, v in json.loads(old.read_text()).items()
                           if "_train" in k or k == "vision_pretrain"})
    else:
        tok = train_video_tokenizer(corpus_lines(5000, args.seed))
        print(f"vocab {len(tok)}: {tok.tokenize(' ' + describe(random_script(random.Random(1))))}", flush=True)
        target = make_model(tok, TARGET_TEXT, seed=args.seed + 1)
        report["vision_pretrain"], probe = pretrain_vision(
            target, args.vision_steps, 5e-3, 16, args.seed + 50, "vision", frame_weights=FRAME_WEIGHTS)
        report["target_train"] = train(target, tok, args.target_steps, 3e-3, args.batch, args.seed + 100,
                                       "target", frame_weights=FRAME_WEIGHTS, probe=probe)
        # a second end-to-end run (fresh optimizer and probe, lower probe weight): after the
        # first the language model had not yet learned the "from X to Y" pairing
        report["target_train_continued"] = train(
            target, tok, args.target_steps_2, 2e-3, args.batch, args.seed + 300, "target+",
            aux_weight=0.5, frame_weights=FRAME_WEIGHTS)
        save(target, tok, tdir)
        (tdir / "BUILD_REPORT.json").write_text(json.dumps(report, indent=2) + "\n")
        (tdir / "BUILD_REPORT.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.eval_only:
        draft = make_model(tok, DRAFT_TEXT, seed=args.seed + 2)
        # the draft starts from the target's trained vision tower (same layout), then trains
        draft.model.visual.load_state_dict(target.model.visual.state_dict())
        report["draft_train"] = train(draft, tok, args.draft_steps, 3e-3, args.batch, args.seed + 200,
                                      "draft", frame_weights=FRAME_WEIGHTS)
        save(draft, tok, ddir)
    for name, m in (("target", target), ("draft", draft)):
        report[f"{name}_params"] = {"total": _params(m), "vision": _params(m.model.visual),
                                    "text": _params(m.model.language_model) + _params(m.lm_head)}
    scripts = eval_scripts(args.eval_videos, 10_000 + args.seed)  # training uses seeds 100/200
    report["target_eval"], report["draft_eval"] = [], []
    for n in (4, 8, 16, 64):
        res = evaluate(target, tok, scripts, n, seed=n, keep_outputs=(n == 8))
        if n == 8:
            report["agreement_8_frames"] = agreement(target, draft, res.pop("_outputs"))
            print(f"[agreement] {report['agreement_8_frames']}", flush=True)
        report["target_eval"].append(res)
        report["draft_eval"].append(evaluate(draft, tok, scripts, n, seed=n))
        print(f"[eval {n}] target {res}\n         draft  {report['draft_eval'][-1]}", flush=True)
    # the example videos, decoded from mp4 and sampled to 8 frames
    made = write_examples(args.examples_dir, seed=20_000 + args.seed)
    report["examples"] = []
    for name, script in made:
        # decoded and sampled exactly as describe-video does (tasks/video_io.py)
        clip = read_video(args.examples_dir / name, frames=8)
        frames = np.stack([np.asarray(f) for f in clip.frames])
        out = greedy(target, tok, video_inputs(tok, target.config, frames, QUESTIONS[0]))
        report["examples"].append({"file": name, "truth": describe(script),
                                   "target": tok.decode(out, skip_special_tokens=True).strip()})
    report["total_seconds"] = round(time.time() - t_start, 1)
    (tdir / "BUILD_REPORT.json").write_text(json.dumps(report, indent=2) + "\n")
    write_report(tdir / "BUILD_REPORT.md", report, target, draft)
    print(json.dumps(report, indent=2), flush=True)


def write_report(path: Path, report: dict, target, draft) -> None:
    rows = ["| frames | model | exact | count | colour | shape | motion | parsed |", "|---|---|---|---|---|---|---|---|"]
    for t, d in zip(report["target_eval"], report["draft_eval"]):
        for name, r in (("target", t), ("draft", d)):
            rows.append(f"| {r['frames']} | {name} | {r['exact']:.2f} | {r['count']:.2f} | {r['colour']:.2f} | "
                        f"{r['shape']:.2f} | {r['motion']:.2f} | {r['parsed']:.2f} |")
    tt, dt = report.get("target_train", {}), report.get("draft_train", {})
    vp = report.get("vision_pretrain", {})
    tc = report.get("target_train_continued")
    train_total = sum(r.get("train_seconds", 0) for r in (vp, tt, dt, tc or {}))
    t_steps = f"{tt.get('steps', '-')} (batch {tt.get('batch', '-')})"
    t_secs = tt.get("train_seconds", "-")
    if tc:  # a second end-to-end run from the saved target (fresh optimizer and probe)
        t_steps += f" + {tc['steps']} (batch {tc['batch']}, lr {tc['lr']})"
        t_secs = f"{t_secs} + {tc['train_seconds']}"
    d_steps = f"{dt.get('steps', '-')} (batch {dt.get('batch', '-')})"
    ex = "\n".join(f"- `{e['file']}`: truth \"{e['truth']}\" / target \"{e['target']}\"" for e in report["examples"])
    text = f"""# tinyworld Qwen2.5-VL video models — build report

Built by `python -m vlmspec_cli.zoo.video` (seed {report["seed"]}, CPU, 1 thread).
Real class `transformers.Qwen2_5_VLForConditionalGeneration`; tokenizer and
`preprocessor_config.json` (`Qwen2VLImageProcessor`, mean/std {MEAN}/{STD}, min/max pixels
{MIN_PIXELS}/{MAX_PIXELS}) saved with each model. Inputs: `vlmspec_cli.zoo.video.video_inputs`.

## Models

| model | params (total / vision / text) | text layers | train steps | train time |
|---|---|---|---|---|
| qwen-video-target | {report['target_params']['total']:,} / {report['target_params']['vision']:,} / {report['target_params']['text']:,} | {target.config.text_config.num_hidden_layers} | {vp.get('steps', 0)} vision (batch {vp.get('batch', '-')}) + {t_steps} | {vp.get('train_seconds', 0)} + {t_secs} s |
| qwen-video-draft | {report['draft_params']['total']:,} / {report['draft_params']['vision']:,} / {report['draft_params']['text']:,} | {draft.config.text_config.num_hidden_layers} | {d_steps} | {dt.get('train_seconds', '-')} s |

- Text (target): {json.dumps(TARGET_TEXT)}; draft: {json.dumps(DRAFT_TEXT)};
  rope {json.dumps(ROPE)}; vocab {target.config.text_config.vocab_size} (byte-level BPE).
- Vision (both): {json.dumps(VISION)}, out_hidden_size 128. 64x64 frames -> 16 video tokens
  per 2 frames. The draft's vision tower starts from the target's trained tower.
- Training, phase 1 (vision tower only, `pretrain_vision`): {vp.get('steps', '-')} steps of batch
  {vp.get('batch', '-')} fresh scripts (seed 50), a linear probe on the merged vision tokens
  (per cell: colour+kind class and motion, foreground cells weighted as much as all
  background cells), lr {vp.get('lr', '-')}, {vp.get('train_seconds', '-')} s; probe accuracy on
  foreground cells at the end (running mean over training batches): class
  {vp.get('probe_acc_ema', {}).get('class', '-')}, motion {vp.get('probe_acc_ema', {}).get('motion', '-')}.
- Phase 2 (end to end): fresh random scripts every step (generator seeds 100 target / 200 draft),
  N frames per batch drawn from {list(FRAME_COUNTS)} with weights {list(FRAME_WEIGHTS)},
  half the videos with Gaussian pixel noise (sigma 6), loss on answer tokens (+ eos) plus
  1.0 x the same probe loss (the target keeps the phase-1 probe; discarded after
  training). AdamW (0.9, 0.98), 5% warm-up + cosine, lr {tt.get('lr', '-')}
  (target) / {dt.get('lr', '-')} (draft). Final LM loss: target {(tc or tt).get('final_lm_loss', '-')}, draft {dt.get('final_lm_loss', '-')}.

## Accuracy on {report['target_eval'][0]['videos']} fresh scripts (eval generator seed 10000)

HF `generate` greedy, question drawn from {list(QUESTIONS)}. exact = whole description
equal; count = number of shapes right; colour/shape/motion = per true shape (the shape of
that colour named / its kind / its motion right); parsed = output follows the grammar.
Frames are rendered evenly over the 3 s script; `second_per_grid_ts` = 2 / (frames / 3 s).
Training only saw 4, 8 and 16 frames.

{chr(10).join(rows)}

Draft vs target at 8 frames (on the target's greedy outputs): token agreement
(draft argmax = target token, teacher-forced) {report['agreement_8_frames']['token_agreement']:.3f},
whole greedy output identical {report['agreement_8_frames']['sequence_match']:.3f}.

Example videos (`examples/videos`, mp4 decoded with PyAV, 8 frames sampled):
{ex}

Training time {train_total:.0f} s in all (target {vp.get('train_seconds', 0) + tt.get('train_seconds', 0) + (tc or {}).get('train_seconds', 0):.0f} s, draft {dt.get('train_seconds', 0):.0f} s); the last run
(evaluation included) took {report['total_seconds']:.0f} s. These weights were built in stages with the same
functions (build to the first end-to-end run; the second run as `train(..., 1000, 2e-3, 8,
300, "target+", aux_weight=0.5)` on the saved target; then `--draft-only`); `main()` now
runs all stages in one go.

## Deviations and notes

- **Goal (shape and motion >= 70% per shape at 8 frames) met** on these 40 scripts.
  Previous build (vision hidden 64, no vision pre-training, probe weight 0.5, 2500
  end-to-end steps, 583 s), same 40 eval scripts, target at 8 frames: exact 0.07,
  count 1.00, colour 1.00, shape 0.37, motion 0.39, parsed 1.00 (4 frames: 0.10 / 0.39 /
  0.42; 16: 0.05 / 0.35 / 0.37; 64: 0.07 / 0.35 / 0.34 for exact / shape / motion).
- What changed in this build and why: (1) vision hidden size 64 -> 96 (intermediate
  128 -> 192); (2) a vision-only pre-training phase on the cell probe (cheap: no language
  model; the previous build's draft, whose tower had trained longer, told kinds apart
  better, pointing at the tower); (3) the probe loss weights foreground cells as much as
  all background cells (background cells are ~85% of the cells and dominated it) and has
  weight 1.0 (0.5 in the second run); (4) the target keeps the pre-trained probe when
  end-to-end training starts; (5) end-to-end training in two runs (1500 steps lr 3e-3,
  then 1000 steps lr 2e-3 with a fresh optimizer and probe); the draft trains 600 steps
  (was 1200). World, tokenizer, inputs and text sizes are unchanged.
- Measured while building: the cell probe learns slowly even on its own (foreground
  class accuracy 0.39 after 300 steps, 0.52 after 1200; with colour nearly free, kind
  is only a little above chance), and bigger shapes (radius 12) did not help it in a
  300-step test (not kept). The end-to-end phase then had less time for the language
  model, which after 1500 steps had not yet learned the "from X to Y" pairing (outputs
  such as "from right to right" do not parse; parsed 0.28 at 8 frames), hence the
  second end-to-end run (LM loss 0.21 -> 0.12), which is what moved shape/motion from
  near chance to ~75%.
- The draft's vision tower has the target's layout and starts from the target's trained
  weights (then trains on with the draft); a separate smaller tower would have needed its
  own training time, which the shared 2-CPU machine did not leave.
- Training length was set by the compute budget (about 20 min of training on a 2-CPU
  machine shared with other jobs, which made steps 0.5-5 s each), so batches are small
  (8 videos) and 16-frame batches rarer than 4- and 8-frame ones.
- Earlier attempts (not kept): rope_theta 10 (see the config note in `video.py`; the
  language model never learned to copy words from the video or the sentence, ~14 min
  of training spent), and batch 16.
- 64 frames (32 temporal groups, 512 video tokens) is outside the training range; within a
  temporal patch the two frames are then only ~0.7 px apart, so the motion must be read
  across groups. Reported as measured.
- `rope_theta` is 1e4 (not Qwen's 1e6; 10 was tried first, see above). The height/width
  mRoPE sections get the lowest frequencies, so on the 4x4 merged grid they barely
  change: where a shape is, and so its motion, has to come from the vision features.
- `preprocessor_config.json` is `Qwen2VLImageProcessor(...).save_pretrained` (the PIL
  backend; torchvision is absent) plus explicit `min_pixels` / `max_pixels` keys; the
  video processor cannot be built on CPU, so video pixels come from
  `vlmspec_cli.runtime.video_patches.patchify`.
"""
    path.write_text(text)


if __name__ == "__main__":
    main()
