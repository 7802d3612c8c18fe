"""What every tinyworld training script shares: the optimiser loop, the learning-rate
schedule, batching of tokenized conversations, and the command-line setup.

The build scripts (``build.py``, ``twig.py``, ``hidden.py``, ``imagegen/``, ``video/``)
take their loop from here rather than from each other, so they import one another only
one way (``build`` runs ``twig``; ``hidden`` reads the worlds). The runtime never
imports the zoo.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

# where ``zoo:tinyworld/<name>`` finds the built models (runtime/models/loading.py ZOO_ROOT)
WEIGHTS = Path(__file__).resolve().parent / "weights" / "tinyworld"

def warmup_cosine(warmup: int, steps: int) -> Callable[[int], float]:
    """Learning-rate factor at step s: linear warm-up over ``warmup`` steps, then cosine
    decay to 0 at ``steps``."""
    return lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))


def optimize(params: Iterable[torch.nn.Parameter], steps: int,
             batch_loss: Callable[[int], torch.Tensor | tuple[torch.Tensor, str | Callable[[], str]]], label: str, *,
             lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.98),
             schedule: Callable[[int], float] | None = None, clip: float | None = 1.0,
             log_every: int = 100, log: Callable[[str], None] | None = None) -> torch.Tensor:
    """AdamW over ``params`` for ``steps`` steps; returns the last loss.

    ``batch_loss(step)`` computes the loss of the next batch, or ``(loss, note)`` where
    ``note`` (a string, or a function making one) replaces ``loss X`` in the progress line
    printed every ``log_every`` steps and at the last. ``schedule``: the learning-rate
    factor per step (None: constant); ``clip``: the gradient-norm clip (None: none)."""
    params = list(params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule is not None else None
    log = log or (lambda line: print(line, flush=True))
    t0 = time.time()
    loss = None
    for step in range(steps):
        out = batch_loss(step)
        loss, note = out if isinstance(out, tuple) else (out, None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if sched is not None:
            sched.step()
        if step % log_every == 0 or step == steps - 1:
            text = note() if callable(note) else note
            text = text if text is not None else f"loss {loss.item():.4f}"
            log(f"[{label}] step {step:5d}/{steps} {text} ({time.time() - t0:.0f}s)")
    return loss


# --------------------------------------------------------------- token batches
def batches(data, batch_tokens: int, seed: int):
    """Length-bucketed batches of indices into ``data`` (≈ batch_tokens tokens each, items
    ``(ids, labels, pixels)``), shuffled, endlessly."""
    rng = random.Random(seed)
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    groups, cur = [], []
    for i in order:
        cur.append(i)
        if len(cur) * len(data[i][0]) >= batch_tokens:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    while True:
        rng.shuffle(groups)
        yield from groups


def collate(data, idx, pad_id: int):
    """Right-padded ids, labels (-100 on padding), attention mask and the concatenated
    pixels (None if no item has any) of the items ``idx`` of ``data``."""
    width = max(len(data[i][0]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), width), -100, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    pix = []
    for row, i in enumerate(idx):
        seq, lab, p = data[i]
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, : len(seq)] = torch.tensor(lab)
        mask[row, : len(seq)] = 1
        if p is not None:
            pix.append(p)
    return ids, labels, mask, (torch.cat(pix) if pix else None)


# ------------------------------------------------------------------ command line
def arg_parser(doc: str, *, out: Path | None = WEIGHTS, threads: int = 2,
               threads_help: str | None = None, prog: str | None = None) -> argparse.ArgumentParser:
    """The options every build script has: ``--out`` (where the models go; omitted when
    ``out`` is None), ``--seed`` and ``--threads``."""
    ap = argparse.ArgumentParser(prog=prog, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if out is not None:
        ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=threads, help=threads_help)
    return ap


def parse_args(ap: argparse.ArgumentParser, argv=None, *, deterministic: bool = True):
    """Parse, then set torch's thread count (and deterministic algorithms: a build is
    reproducible from its seed)."""
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if deterministic:
        torch.use_deterministic_algorithms(True)
    return args
