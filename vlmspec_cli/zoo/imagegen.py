"""tinyworld image generation: ``python -m vlmspec_cli.zoo.imagegen``.

Builds, on CPU and deterministically (~8 min on 2 threads), two Janus text-to-image models
(HF ``JanusForConditionalGeneration``, Llama text model) for the tinyworld scenes: a
6-layer target and a 1-layer draft with one tokenizer and one VQ model (``JanusVQVAE``).

* World: one shape on a background, ``world.render`` at 32 px. Prompts always name the
  shape colour, kind and background, each half the time the size and position; what a
  prompt leaves out is sampled at random, so the models learn a distribution over it.
* VQ: 32 px -> 8x8 codes, codebook 256 x 8 (stored L2-normalised, so HF's raw-argmin
  ``encode`` and its normalising ``decode`` agree). A patch's code is a function of the
  patch alone (``patch_codes``); the decoder and encoder are trained to match it.
* Prompt contract: ``tok("<s>" + prompt, add_special_tokens=False).input_ids + [BOI]``,
  then 64 image tokens. Trained by teacher forcing with 10% condition dropout in Janus'
  form (every token but BOS / BOI -> ``<pad>``), so HF ``generate(generation_mode="image")``
  with classifier-free guidance reproduces training. The draft also distils the target.

Saves ``weights/tinyworld/janus-{target,draft}`` and adds greedy-generation quality and
draft/target agreement to BUILD_REPORT.json (keys janus-vq, janus-target, janus-draft).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    JanusConfig,
    JanusForConditionalGeneration,
    JanusVisionConfig,
    JanusVQVAEConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.build import WEIGHTS, optimize
from vlmspec_cli.zoo.tokenizer import BOS, EOS, IMAGE, PAD, UNK

IMAGE_PX, PATCH = 32, 4
GRID = IMAGE_PX // PATCH  # 8x8 codes
NUM_IMAGE_TOKENS = GRID * GRID
CODEBOOK, CODE_DIM = 256, 8
FLAT_CODES = len(world.BACKGROUNDS) + len(world.COLOURS)  # 13 flat-colour codes, then
MASK_CLUSTERS = (CODEBOOK - FLAT_CODES) // len(world.COLOURS)  # 30 edge masks per colour
BOI = "<begin_of_image>"
# CFG scale for generate: the unconditional rows do not know the shape colour, so guidance
# multiplies that colour's codes by ~8**(g-1) everywhere; at g=3 stray shape patches appeared
# all over (32% of greedy images matched), at 1.5-1.75 88-98% did
GUIDANCE = 1.5
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% endif %}{% endfor %}"
)
TARGET_TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=4)
DRAFT_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=4)
# GroupNorm has 32 groups: with 32 channels each group is one channel and normalising it over
# the image erases a flat image's absolute colour, so 64 channels (groups of 2) throughout;
# num_res_blocks=0 (encoder: convs only; decoder: one block per level) keeps it fast on CPU
VQ = dict(embed_dim=CODE_DIM, num_embeddings=CODEBOOK, latent_channels=64, base_channels=64,
          channel_multiplier=(1, 1, 1), num_res_blocks=0)


# ----------------------------------------------------------------------------- world

def all_scenes() -> list[world.Scene]:
    """Every one-shape scene (shape colour named differently from the background)."""
    return [world.Scene(bg, (world.Shape(kind, colour, size, pos),))
            for bg in world.BACKGROUNDS for colour in world.COLOURS if colour != bg
            for kind in world.SHAPES for size in world.SIZES for pos in world.POSITIONS]


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


TEMPLATES = ("{thing}{where} on {a_bg} background", "{bg} background with {thing}{where}",
             "draw {thing}{where} on {a_bg} background", "on {a_bg} background, {thing}{where}",
             "{thing}{where}, {bg} background", "a picture of {thing}{where} on {a_bg} background")


def sample_prompt_scene(rng: random.Random) -> tuple[str, world.Scene]:
    """A random one-shape scene and a prompt naming its colour, kind and background, and
    (each half the time) its size and position."""
    bg = rng.choice(list(world.BACKGROUNDS))
    shape = world.Shape(rng.choice(world.SHAPES), rng.choice([c for c in world.COLOURS if c != bg]),
                        rng.choice(world.SIZES), rng.choice(world.POSITIONS))
    size = f"{shape.size} " if rng.random() < 0.5 else ""
    where = f" {world.POSITION_PHRASES[shape.position]}" if rng.random() < 0.5 else ""
    prompt = rng.choice(TEMPLATES).format(thing=_a(f"{size}{shape.colour} {shape.kind}"), where=where,
                                          bg=bg, a_bg=_a(bg))
    return prompt, world.Scene(bg, (shape,))


_PALETTE = np.array(list(world.BACKGROUNDS.values()) + list(world.COLOURS.values()), dtype=np.float32)
_NAMES = list(world.BACKGROUNDS) + list(world.COLOURS)


def _labels(image: Image.Image) -> np.ndarray:
    """Per pixel, the nearest palette entry (backgrounds first, then shape colours)."""
    if image.size != (IMAGE_PX, IMAGE_PX):
        image = image.resize((IMAGE_PX, IMAGE_PX), Image.NEAREST)
    px = np.asarray(image.convert("RGB"), dtype=np.float32)
    return ((px[:, :, None, :] - _PALETTE) ** 2).sum(-1).argmin(-1)


def _largest_blob(mask: np.ndarray) -> int:
    """Pixels in the largest 4-connected component of ``mask``."""
    ids = np.where(mask, np.arange(1, mask.size + 1).reshape(mask.shape), 0)
    while True:  # spread the largest id through each component
        p = np.pad(ids, 1)
        new = np.maximum.reduce([ids, p[:-2, 1:-1], p[2:, 1:-1], p[1:-1, :-2], p[1:-1, 2:]]) * mask
        if (new == ids).all():
            return int(np.bincount(ids[mask]).max()) if mask.any() else 0
        ids = new


def image_matches(image: Image.Image, colour: str, background: str, min_blob: int = 4) -> bool:
    """Pixel check of a (32 px) image against "a <colour> shape on a <background> background".

    Every pixel is classified to its nearest palette colour (world.BACKGROUNDS and
    world.COLOURS; a name in both, e.g. "green", counts as one colour for the shape).
    True when >= 60% of the border pixels are the background, a 4-connected blob of
    >= ``min_blob`` pixels has the shape colour, and the shape colour is the most common
    colour name among the non-background pixels."""
    lab = _labels(image)
    bg = list(world.BACKGROUNDS).index(background)
    border = np.concatenate([lab[0], lab[-1], lab[1:-1, 0], lab[1:-1, -1]])
    if (border == bg).mean() < 0.6:
        return False
    name = np.array(_NAMES)[lab]
    if _largest_blob((name == colour) & (lab != bg)) < min_blob:
        return False
    names, counts = np.unique(name[lab != bg], return_counts=True)
    return str(names[counts.argmax()]) == colour


def to_pixels(images: list[Image.Image]) -> torch.Tensor:
    """PIL images -> (B, 3, H, W) in [-1, 1]."""
    arr = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2) / 127.5 - 1


def to_images(pixels: torch.Tensor) -> list[Image.Image]:
    """(B, H, W, 3) in [-1, 1] (``decode_image_tokens`` output) -> PIL images."""
    arr = ((pixels.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    return [Image.fromarray(a, "RGB") for a in arr]


# ----------------------------------------------------------------------------- tokenizer

def make_tokenizer(seed: int = 0, vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the prompts (as ``tokenizer.train_tokenizer``), with ``<begin_of_image>``."""
    rng = random.Random(seed)
    lines = [sample_prompt_scene(rng)[0] for _ in range(20000)]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # 'blue' = ' blue'
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS, UNK, IMAGE, BOI],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(lines, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE, "boi_token": BOI},
        chat_template=CHAT_TEMPLATE, model_max_length=2048, padding_side="left")


def prompt_ids(tok, prompt: str) -> list[int]:
    """The contract: ``<s> prompt`` (no other special tokens) followed by BOI."""
    return tok(BOS + prompt, add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids(BOI)]


def unconditional(ids: torch.Tensor, tok) -> torch.Tensor:
    """Janus CFG rows: every token that is neither BOS nor BOI becomes ``<pad>``."""
    keep = (ids == tok.bos_token_id) | (ids == tok.convert_tokens_to_ids(BOI))
    return torch.where(keep, ids, torch.full_like(ids, tok.pad_token_id))


# ----------------------------------------------------------------------------- models

def make_model(tok, text: dict, seed: int) -> JanusForConditionalGeneration:
    torch.manual_seed(seed)
    hidden = text["hidden_size"]
    text_config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=256,
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id, **text)
    # the understanding tower is unused (image generation only), so it is tiny
    vision_config = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      image_size=IMAGE_PX, patch_size=PATCH, projection_dim=hidden,
                                      num_image_tokens=NUM_IMAGE_TOKENS, mlp_ratio=2.0)
    vq_config = JanusVQVAEConfig(**VQ, projection_dim=hidden, image_token_embed_dim=hidden)
    config = JanusConfig(text_config=text_config, vision_config=vision_config, vq_config=vq_config,
                         image_token_id=tok.image_token_id)
    model = JanusForConditionalGeneration(config)
    gc = model.generation_config
    gc.bos_token_id, gc.pad_token_id, gc.eos_token_id = tok.bos_token_id, tok.pad_token_id, tok.eos_token_id
    gc.generation_kwargs = {"boi_token_id": tok.convert_tokens_to_ids(BOI)}
    gc.guidance_scale = GUIDANCE
    gc.max_length = 128
    gc._from_model_config = False  # else from_pretrained drops generation_kwargs (boi_token_id)
    return model


# ----------------------------------------------------------------------------- VQ

def _kmeans(x: np.ndarray, weight: np.ndarray, k: int, seed: int, iters: int = 30) -> np.ndarray:
    """Weighted k-means (k-means++ start); returns the centroids."""
    rs = np.random.RandomState(seed)
    cent = [x[rs.choice(len(x), p=weight / weight.sum())]]
    for _ in range(k - 1):
        d = ((x[:, None] - np.array(cent)[None]) ** 2).sum(-1).min(1) * weight
        cent.append(x[rs.choice(len(x), p=d / d.sum())])
    cent = np.array(cent)
    for _ in range(iters):
        assign = ((x[:, None] - cent[None]) ** 2).sum(-1).argmin(1)
        for j in range(k):
            if (assign == j).any():
                w = weight[assign == j]
                cent[j] = (x[assign == j] * w[:, None]).sum(0) / w.sum()
    return cent


def patch_codes(scenes: list[world.Scene], seed: int = 0) -> torch.Tensor:
    """The code of every 4x4 patch, (N, 64), a function of the patch alone: one code per
    flat colour (backgrounds, then shape colours), else shape colour x one of
    ``MASK_CLUSTERS`` k-means clusters of the shape-pixel mask."""
    n = len(scenes)
    arr = np.stack([np.asarray(world.render(s, IMAGE_PX)) for s in scenes]).astype(np.int16)
    patches = arr.reshape(n, GRID, PATCH, GRID, PATCH, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, 64, 16, 3)
    fg_rgb = np.array([world.COLOURS[s.shapes[0].colour] for s in scenes])
    fg = np.array([list(world.COLOURS).index(s.shapes[0].colour) for s in scenes])
    bg = np.array([list(world.BACKGROUNDS).index(s.background) for s in scenes])
    mask = (patches == fg_rgb[:, None, None, :]).all(-1)  # (N, 64, 16)
    count = mask.sum(-1)
    mixed = (count > 0) & (count < 16)
    uniq, inverse, weight = np.unique(mask[mixed].astype(np.float32), axis=0, return_inverse=True,
                                      return_counts=True)
    cent = _kmeans(uniq, weight.astype(np.float64), MASK_CLUSTERS, seed)
    cluster = ((uniq[:, None] - cent[None]) ** 2).sum(-1).argmin(1)[inverse.ravel()]
    codes = np.where(count == 0, bg[:, None], len(world.BACKGROUNDS) + fg[:, None])
    codes[mixed] = FLAT_CODES + (fg[:, None].repeat(64, 1)[mixed] * MASK_CLUSTERS + cluster)
    return torch.from_numpy(codes).long()


def train_vq(vq, pixels: torch.Tensor, codes: torch.Tensor, steps: int, seed: int, batch: int = 16,
             lr: float = 2e-3, shape_weight: float = 4.0, temperature: float = 0.07) -> None:
    """Train the VQ model on fixed patch codes (``patch_codes``): the codebook rows
    (L2-normalised, as HF ``decode`` normalises them), ``post_quant_conv`` and the decoder
    learn to draw the image from its codes (MSE, shape pixels weighted up), and the encoder
    learns to pick those codes (cross-entropy over cosine similarities to the codebook).
    Leaves the codebook stored normalised, so HF ``encode``'s raw argmin is that choice."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    vq.train()
    codebook = vq.quantize.embedding.weight
    opt = torch.optim.AdamW(vq.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * (1 - 0.9 * s / steps))
    t0 = time.time()
    for step in range(steps):
        pick = torch.randint(len(pixels), (batch,), generator=gen)
        x, c = pixels[pick], codes[pick]
        book = F.normalize(codebook, dim=1)
        zq = book[c].view(batch, GRID, GRID, CODE_DIM).permute(0, 3, 1, 2)
        err = (vq.decoder(vq.post_quant_conv(zq)) - x).pow(2).mean(1)
        shape = (x - x[:, :, :1, :1]).abs().sum(1) > 0.01  # not the corner (background) colour
        rec_loss = (err * (1 + (shape_weight - 1) * shape)).mean()
        z = F.normalize(vq.quant_conv(vq.encoder(x)), dim=1).permute(0, 2, 3, 1).reshape(-1, CODE_DIM)
        enc_loss = F.cross_entropy(z @ book.detach().T / temperature, c.flatten())
        opt.zero_grad(set_to_none=True)
        (rec_loss + 0.1 * enc_loss).backward()
        torch.nn.utils.clip_grad_norm_(vq.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"[janus-vq] step {step:4d}/{steps} rec {rec_loss.item():.4f} enc {enc_loss.item():.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    with torch.no_grad():
        codebook.copy_(F.normalize(codebook, dim=1))
    vq.eval()


@torch.no_grad()
def vq_encode(vq, pixels: torch.Tensor) -> torch.Tensor:
    """HF ``encode`` -> (B, 64) code ids."""
    return torch.cat([vq.encode(pixels[i:i + 256]).image_tokens.view(-1, NUM_IMAGE_TOKENS)
                      for i in range(0, len(pixels), 256)])


@torch.no_grad()
def vq_report(vq, scenes, pixels, codes, sample_dir: Path | None = None) -> dict:
    """Reconstruction from the patch codes, and how often HF ``encode`` picks them."""
    rec = torch.cat([vq.decode(codes[i:i + 256]) for i in range(0, len(codes), 256)])
    images = to_images(rec.permute(0, 2, 3, 1))
    ok = sum(image_matches(im, s.shapes[0].colour, s.background) for im, s in zip(images, scenes))
    if sample_dir is not None:
        sample_dir.mkdir(parents=True, exist_ok=True)
        for i in range(0, len(images), 500):
            images[i].resize((128, 128), Image.NEAREST).save(sample_dir / f"vq_reconstruction_{i}.png")
    return {"images": len(scenes), "codebook": CODEBOOK, "codes_used": int(codes.unique().numel()),
            "code_scheme": f"{FLAT_CODES} flat colours + {len(world.COLOURS)} shape colours x "
                           f"{MASK_CLUSTERS} edge-mask clusters",
            "hf_encode_agreement": round((vq_encode(vq, pixels) == codes).float().mean().item(), 4),
            "mean_abs_error_0_255": round((rec.clamp(-1, 1) - pixels).abs().mean().item() * 127.5, 2),
            "reconstruction_match_rate": round(ok / len(scenes), 4),
            "params": sum(p.numel() for p in vq.parameters())}


# ----------------------------------------------------------------------------- generator

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

    def batch_loss():
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
    optimize(params, steps, lr, 0.01, max(1, steps // 20), batch_loss, label)
    model.eval()


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def guided_argmax(model, ids: torch.Tensor, codes: torch.Tensor, tok, guidance: float) -> torch.Tensor:
    """Greedy CFG choice at every position along ``codes`` (teacher forced)."""
    cond = image_logits(model, ids, codes)
    uncond = image_logits(model, unconditional(ids, tok), codes)
    return (uncond + guidance * (cond - uncond)).argmax(-1)


@torch.no_grad()
def evaluate(target, draft, tok, n: int, seed: int, guidance: float = GUIDANCE,
             sample_dir: Path | None = None) -> dict:
    """Greedy image generation (HF ``generate``) from ``n`` fresh prompts: the share whose
    image matches its prompt, for each model, and how often the draft's greedy token equals
    the target's along the target's greedy sequence (flat background patches vs the rest)."""
    rng = random.Random(seed)
    out = {"prompts": n, "guidance_scale": guidance}
    match, secs = {"target": 0, "draft": 0}, {"target": 0.0, "draft": 0.0}
    agree = {"flat": [0, 0], "shape": [0, 0]}
    replay = 0
    for i in range(n):
        prompt, scene = sample_prompt_scene(rng)
        colour, bg = scene.shapes[0].colour, scene.background
        ids = torch.tensor([prompt_ids(tok, prompt)])
        for name, model in (("target", target), ("draft", draft)):
            t0 = time.time()
            codes = model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                   do_sample=False, guidance_scale=guidance)
            secs[name] += time.time() - t0
            image = to_images(model.decode_image_tokens(codes))[0]
            match[name] += image_matches(image, colour, bg)
            if sample_dir is not None and i < 8:
                sample_dir.mkdir(parents=True, exist_ok=True)
                path = sample_dir / f"{name}_{i}.png"
                image.resize((128, 128), Image.NEAREST).save(path)
                print(f"[eval] {name} {prompt!r} -> {path} match={image_matches(image, colour, bg)}", flush=True)
            if name == "target":
                target_codes, target_image = codes, image
        replay += (guided_argmax(target, ids, target_codes, tok, guidance) == target_codes).float().mean().item()
        same = (guided_argmax(draft, ids, target_codes, tok, guidance) == target_codes)[0].view(GRID, GRID)
        lab = torch.from_numpy(_labels(target_image)).view(GRID, PATCH, GRID, PATCH)
        flat = (lab == list(world.BACKGROUNDS).index(bg)).all(3).all(1)
        for key, where in (("flat", flat), ("shape", ~flat)):
            agree[key][0] += int(same[where].sum())
            agree[key][1] += int(where.sum())
    hits, total = agree["flat"][0] + agree["shape"][0], agree["flat"][1] + agree["shape"][1]
    out.update({
        "target_match_rate": match["target"] / n, "draft_match_rate": match["draft"] / n,
        "draft_target_greedy_agreement": round(hits / total, 4),
        "agreement_flat_background": round(agree["flat"][0] / max(1, agree["flat"][1]), 4),
        "agreement_shape_patches": round(agree["shape"][0] / max(1, agree["shape"][1]), 4),
        "shape_patch_share": round(agree["shape"][1] / total, 4),
        "teacher_forced_replay_of_hf_generate": round(replay / n, 4),
        "target_generate_s": round(secs["target"] / n, 3), "draft_generate_s": round(secs["draft"] / n, 3),
    })
    return out


def _size(model, path: Path) -> dict:
    return {"params": sum(p.numel() for p in model.parameters()),
            "text_layers": model.config.text_config.num_hidden_layers,
            "disk_mb": round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 2)}


def _evaluate_into(report: dict, target, draft, tok, args) -> None:
    m = evaluate(target, draft, tok, args.eval_prompts, seed=10_000 + args.seed, sample_dir=args.samples)
    for role in ("target", "draft"):
        report[f"janus-{role}"].update({"guidance_scale": m["guidance_scale"], "eval_prompts": m["prompts"],
                                        "match_rate": m[f"{role}_match_rate"],
                                        "generate_s_per_image": m[f"{role}_generate_s"]})
    report["janus-target"]["teacher_forced_replay_of_hf_generate"] = m["teacher_forced_replay_of_hf_generate"]
    report["janus-draft"].update({k: m[k] for k in ("draft_target_greedy_agreement", "agreement_flat_background",
                                                    "agreement_shape_patches", "shape_patch_share")})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    ap.add_argument("--vq-steps", type=int, default=600)
    ap.add_argument("--target-steps", type=int, default=1400)
    ap.add_argument("--draft-steps", type=int, default=1000)
    ap.add_argument("--examples", type=int, default=40000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--eval-only", action="store_true", help="only re-evaluate the models in --out")
    ap.add_argument("--samples", type=Path, default=Path("/tmp/tinyworld-imagegen"),
                    help="where sample PNGs go (not the repo)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()
    report_path = args.out / "BUILD_REPORT.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report = {k: v for k, v in report.items() if k.startswith("janus-")}  # only ours are written

    if args.eval_only:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.out / "janus-target")
        target, draft = (JanusForConditionalGeneration.from_pretrained(args.out / f"janus-{r}", use_safetensors=True).eval()
                         for r in ("target", "draft"))
        for role in ("target", "draft"):
            report.setdefault(f"janus-{role}", {})
        _evaluate_into(report, target, draft, tok, args)
    else:
        tok = make_tokenizer(args.seed)
        target = make_model(tok, TARGET_TEXT, seed=args.seed + 1)
        draft = make_model(tok, DRAFT_TEXT, seed=args.seed + 2)
        scenes = all_scenes()
        pixels = to_pixels([world.render(s, IMAGE_PX) for s in scenes])

        t0 = time.time()
        vq = target.model.vqmodel
        codes = patch_codes(scenes, args.seed)
        train_vq(vq, pixels, codes, args.vq_steps, args.seed)
        report["janus-vq"] = {"steps": args.vq_steps, "train_s": round(time.time() - t0),
                              **vq_report(vq, scenes, pixels, codes, args.samples)}
        print(f"[janus-vq] {json.dumps(report['janus-vq'])}", flush=True)
        for model in (target, draft):
            model.model.vqmodel.load_state_dict(vq.state_dict())
            with torch.no_grad():  # image-token input embeddings start from the codebook
                model.model.generation_embeddings.weight.copy_(vq.quantize.embedding.weight)

        data = make_dataset(tok, dict(zip(scenes, codes)), args.examples, args.seed + 1)
        for role, model, steps, lr, teacher in (("target", target, args.target_steps, 3e-3, None),
                                                ("draft", draft, args.draft_steps, 3e-3, target)):
            t0 = time.time()
            train_generator(model, data, steps, lr, args.batch, args.seed, tok, f"janus-{role}", teacher=teacher)
            out = args.out / f"janus-{role}"
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out)
            tok.save_pretrained(out)
            report[f"janus-{role}"] = {"steps": steps, "train_s": round(time.time() - t0), **_size(model, out)}
        report["janus-draft"]["distilled_from"] = "janus-target"
        report["janus-target"]["tokens"] = {"bos": tok.bos_token_id, "pad": tok.pad_token_id,
                                            "boi": tok.convert_tokens_to_ids(BOI), "image": tok.image_token_id,
                                            "num_image_tokens": NUM_IMAGE_TOKENS}
        _evaluate_into(report, target, draft, tok, args)
        for role in ("target", "draft"):
            report[f"janus-{role}"]["build_wall_s"] = round(time.time() - t_start)
    for key in ("janus-vq", "janus-target", "janus-draft"):
        print(f"[{key}] {json.dumps(report.get(key))}", flush=True)
    # read-modify-write at the end: others may have updated their keys meanwhile
    full = json.loads(report_path.read_text()) if report_path.exists() else {}
    report_path.write_text(json.dumps({**full, **report}, indent=2) + "\n")


if __name__ == "__main__":
    main()
