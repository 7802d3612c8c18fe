"""Training the tinyworld video models: first the vision tower alone on a linear probe
on the merged vision tokens (each cell's shape colour/kind and its motion;
``pretrain_vision``), then teacher forcing on the answer tokens (prompt + " " +
description + eos) with N in {4, 8, 16} frames per batch plus the same probe (``train``);
probes are thrown away. Both run the shared optimiser loop (``zoo/train.py``).
"""

from __future__ import annotations

import random
import time

import numpy as np
import torch
import torch.nn.functional as F

from vlmspec_cli.runtime.adapters.video_patches import patchify
from vlmspec_cli.zoo.train import optimize, warmup_cosine
from vlmspec_cli.zoo.video.model import MEAN, STD, video_inputs
from vlmspec_cli.zoo.video.world import (
    COLOURS, FRAME_PX, MOTIONS, QUESTIONS, SHAPES, Script, _render, describe, random_script,
)

FRAME_COUNTS = (4, 8, 16)
FRAME_WEIGHTS = (0.4, 0.35, 0.25)  # 16-frame batches cost twice an 8-frame one
CELL = FRAME_PX // 4  # one merged token covers 16x16 px
N_CLASSES = 1 + len(COLOURS) * len(SHAPES)  # 0 = background
N_MOTIONS = 1 + len(MOTIONS)  # 0 = background


def _frame_count(rng: random.Random, frame_weights: tuple[float, ...] | None) -> int:
    """Frames in the next batch: drawn from FRAME_COUNTS (weighted, or uniformly)."""
    return rng.choices(FRAME_COUNTS, weights=frame_weights)[0] if frame_weights else rng.choice(FRAME_COUNTS)


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
    ema: dict[str, float] = {}

    def batch_loss(step):
        n = _frame_count(rng, frame_weights)
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
        ema.update(acc if not ema else {k: 0.95 * ema[k] + 0.05 * v for k, v in acc.items()})
        return loss, lambda: (f"N={n:2d} probe {loss.item():.4f} "
                              f"class {ema['class']:.3f} motion {ema['motion']:.3f}")

    visual.train()
    t0 = time.time()
    loss = optimize([*visual.parameters(), *probe.parameters()], steps, batch_loss, label, lr=lr,
                    weight_decay=0.01, schedule=warmup_cosine(max(1, steps // 20), steps), log_every=50)
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

    def batch_loss(step):
        n = _frame_count(rng, frame_weights)
        exs = []
        for _ in range(batch):
            e = encode_example(tok, model.config, random_script(rng), n, rng.choice(QUESTIONS),
                               noise=6.0 if rng.random() < 0.5 else 0.0, rng=nrng)
            e["video_token_id"] = model.config.video_token_id
            exs.append(e)
        inputs = collate(exs, tok.pad_token_id)
        lm = captured["lm"] = model(**inputs).loss
        cells = torch.cat([e["cells"] for e in exs])
        aux, _ = _probe_loss(probe, captured.pop("feats"), cells)
        return lm + aux_weight * aux, lambda: f"N={n:2d} lm {lm.item():.4f} aux {aux.item():.4f}"

    model.train()
    t0 = time.time()
    optimize([*model.parameters(), *probe.parameters()], steps, batch_loss, label, lr=lr,
             weight_decay=0.01, schedule=warmup_cosine(max(1, steps // 20), steps), log_every=25)
    hook.remove()
    model.eval()
    return {"steps": steps, "lr": lr, "batch": batch, "train_seconds": round(time.time() - t0, 1),
            "final_lm_loss": round(captured["lm"].item(), 4), "frame_weights": frame_weights}


