"""A deliberately bad draft: a shipped draft with its decoder layers drawn at random.

Each floating-point matrix under ``.layers.`` is replaced by Gaussian noise of its own
standard deviation (seeded), so the model loads and runs like the original but proposes
tokens the target almost never keeps (τ ≈ 1). bench/load.py, bench/auto_gamma.py and the
tests use it to check that drafting that does not pay is noticed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights" / "tinyworld"


def scrambled_draft(dest: str | Path, source: str = "llava-deep-draft", seed: int = 1234) -> Path:
    """Copy tinyworld's ``source`` to ``dest`` (kept if it exists) with its layers redrawn."""
    import torch
    from safetensors.torch import load_file, save_file

    dest = Path(dest)
    if dest.exists():
        return dest
    shutil.copytree(WEIGHTS / source, dest)
    gen = torch.Generator().manual_seed(seed)
    for f in dest.glob("*.safetensors"):
        state = load_file(f)
        for k, v in state.items():
            if ".layers." in k and v.dtype.is_floating_point and v.dim() >= 2:
                state[k] = (torch.randn(v.shape, generator=gen) * float(v.float().std())).to(v.dtype)
        save_file(state, f, metadata={"format": "pt"})
    return dest
