"""The tinyworld Janus VQ model: fixed patch codes (a function of the 4x4 patch alone),
and training the VQ decoder / encoder to match them.

32 px -> 8x8 codes, codebook 256 x 8 (stored L2-normalised, so HF's raw-argmin
``encode`` and its normalising ``decode`` agree).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.imagegen.scenes import (
    CODE_DIM, CODEBOOK, FLAT_CODES, GRID, IMAGE_PX, MASK_CLUSTERS, NUM_IMAGE_TOKENS, PATCH,
    image_matches, to_images,
)
from vlmspec_cli.zoo.train import optimize

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

    def batch_loss(step):
        pick = torch.randint(len(pixels), (batch,), generator=gen)
        x, c = pixels[pick], codes[pick]
        book = F.normalize(codebook, dim=1)
        zq = book[c].view(batch, GRID, GRID, CODE_DIM).permute(0, 3, 1, 2)
        err = (vq.decoder(vq.post_quant_conv(zq)) - x).pow(2).mean(1)
        shape = (x - x[:, :, :1, :1]).abs().sum(1) > 0.01  # not the corner (background) colour
        rec_loss = (err * (1 + (shape_weight - 1) * shape)).mean()
        z = F.normalize(vq.quant_conv(vq.encoder(x)), dim=1).permute(0, 2, 3, 1).reshape(-1, CODE_DIM)
        enc_loss = F.cross_entropy(z @ book.detach().T / temperature, c.flatten())
        return rec_loss + 0.1 * enc_loss, lambda: f"rec {rec_loss.item():.4f} enc {enc_loss.item():.4f}"

    # warm-up over 20 steps, then linear decay to 10%
    optimize(vq.parameters(), steps, batch_loss, "janus-vq", lr=lr, weight_decay=0.0, betas=(0.9, 0.99),
             schedule=lambda s: min(1.0, (s + 1) / 20) * (1 - 0.9 * s / steps))
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
