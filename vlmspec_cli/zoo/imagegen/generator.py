"""Training the tinyworld Janus generators: teacher forcing on image codes with condition
dropout (10%, Janus' form), a prompt probe, and for the draft distillation from the target.
"""

from __future__ import annotations

import random
import re

import torch
import torch.nn.functional as F

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.imagegen.model import prompt_ids, unconditional
from vlmspec_cli.zoo.imagegen.scenes import sample_prompt_scene
from vlmspec_cli.zoo.train import optimize, warmup_cosine

PROBE_CLASSES = (len(world.COLOURS), len(world.SHAPES), len(world.BACKGROUNDS), len(world.SIZES),
                 len(world.POSITIONS))


def prompt_labels(prompt: str, scene: world.Scene) -> list[int]:
    """What the prompt says: shape colour, kind, background, and size / position if
    mentioned (else -100); targets of the training-time probe."""
    shape = scene.shapes[0]
    size = world.SIZES.index(shape.size) if re.search(rf"\b{shape.size}\b", prompt) else -100
    said = re.search(rf"{world.POSITION_PHRASES[shape.position]}(?! (left|right))", prompt)
    return [list(world.COLOURS).index(shape.colour), world.SHAPES.index(shape.kind),
            list(world.BACKGROUNDS).index(scene.background), size,
            world.POSITIONS.index(shape.position) if said else -100]


def make_dataset(tok, codes_by_scene: dict, n: int, seed: int) -> dict[int, tuple]:
    """``n`` (prompt ids, image codes, prompt labels) examples, bucketed by prompt length
    (so batches need no padding)."""
    rng = random.Random(seed)
    buckets: dict[int, list] = {}
    for _ in range(n):
        prompt, scene = sample_prompt_scene(rng)
        ids = prompt_ids(tok, prompt)
        buckets.setdefault(len(ids), []).append((ids, codes_by_scene[scene], prompt_labels(prompt, scene)))
    return {k: (torch.tensor([e[0] for e in v]), torch.stack([e[1] for e in v]), torch.tensor([e[2] for e in v]))
            for k, v in buckets.items()}


def batches(data: dict, batch: int, seed: int, tok, drop: float = 0.1):
    """Endless batches from one length bucket each, with condition dropout (10%)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lengths = sorted(data)
    weights = [len(data[k][0]) for k in lengths]
    while True:
        ids, codes, labels = data[rng.choices(lengths, weights)[0]]
        pick = torch.randint(len(ids), (batch,), generator=gen)
        ids, codes, labels = ids[pick], codes[pick], labels[pick]
        dropped = torch.rand(batch, generator=gen) < drop
        ids = torch.where(dropped[:, None], unconditional(ids, tok), ids)
        labels = torch.where(dropped[:, None], torch.full_like(labels, -100), labels)
        yield ids, codes, labels


def image_logits(model, ids: torch.Tensor, codes: torch.Tensor, return_hidden: bool = False):
    """Teacher-forced generation-head logits (B, 64, codebook) for image tokens ``codes``
    after prompt ``ids`` (which end with BOI); with ``return_hidden`` also the hidden
    states from BOI on."""
    embeds = torch.cat([model.get_input_embeddings()(ids),
                        model.prepare_embeddings_for_image_generation(codes[:, :-1])], dim=1)
    hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, ids.shape[1] - 1:]
    logits = model.model.generation_head(hidden)
    return (logits, hidden) if return_hidden else logits


def train_generator(model, data, steps: int, lr: float, batch: int, seed: int, tok, label: str,
                    teacher=None, distill: float = 3.0, probe_weight: float = 1.0) -> None:
    """Next-image-token CE (plus, with a ``teacher``, ``distill`` x KL to the teacher's
    distribution) on the language model and the generation embeddings / aligner / head;
    the VQ and the vision tower stay frozen. A linear probe on the BOI hidden state must
    read the prompt's attributes (``prompt_labels``): without it the first shape token, the
    one place the shape colour comes from the prompt, barely learned the colour (~20%
    right after 1400 steps). The probe is thrown away."""
    torch.manual_seed(seed)
    model.requires_grad_(False)
    parts = [model.model.language_model, model.model.generation_embeddings,
             model.model.generation_aligner, model.model.generation_head]
    for part in parts:
        part.requires_grad_(True)
    model.train()
    it = batches(data, batch, seed, tok)
    probe = torch.nn.Linear(model.config.text_config.hidden_size, sum(PROBE_CLASSES))

    def batch_loss(step):
        ids, codes, labels = next(it)
        logits, hidden = image_logits(model, ids, codes, return_hidden=True)
        loss = F.cross_entropy(logits.flatten(0, 1), codes.flatten())
        for i, lg in enumerate(probe(hidden[:, 0]).split(PROBE_CLASSES, dim=-1)):
            if (labels[:, i] >= 0).any():
                loss = loss + probe_weight * F.cross_entropy(lg, labels[:, i], ignore_index=-100)
        if teacher is not None:
            with torch.no_grad():
                soft = F.softmax(image_logits(teacher, ids, codes), dim=-1)
            kl = F.kl_div(F.log_softmax(logits, -1).flatten(0, 1), soft.flatten(0, 1), reduction="batchmean")
            loss = loss + distill * kl
        return loss

    params = [p for part in parts for p in part.parameters()] + list(probe.parameters())
    optimize(params, steps, batch_loss, label, lr=lr, weight_decay=0.01,
             schedule=warmup_cosine(max(1, steps // 20), steps))
    model.eval()
