"""``vlmspec profile`` for image-generation profiles (``task: image``, Janus-class models).

An image model decodes VQ codes with classifier-free guidance: every forward carries two
rows (the prompt and the unconditional prompt) and mixes their logits. So its latency
tables are made of guided forwards: the target's prefill of a sample prompt, the target
verifying k image tokens after it (k = a chain's γ+1 or a draft tree's node count, up to
64: ADT-Tree's largest trees), and one guided draft step; the method's own rounds are
timed on a whole image grid (runtime/round/round_timing.py). The numbers land in the same
``hardware:`` keys as a caption profile's, so ``include:`` and ``--plot`` work alike.
"""

from __future__ import annotations

from typing import Callable

import torch

from vlmspec_cli.runtime.adapters.base import cache_length
from vlmspec_cli.runtime.fast.latency import LatencyTables, median_ms, time_feeds
from vlmspec_cli.runtime.request import Message, Request

PROMPTS = ("a red circle on a blue background", "a small green square at the top left",
           "a white triangle on a black background")
NODES = (1, 2, 4, 8, 16, 32, 64)


def image_request(lm, seed: int = 0) -> Request:
    """One whole image of a tinyworld prompt."""
    return Request([Message("user", PROMPTS[seed % len(PROMPTS)])], seed=seed,
                   max_new_tokens=lm.adapter.num_image_tokens(lm))


def _prompt_inputs(lm) -> dict[str, torch.Tensor]:
    prompt = lm.adapter.prompt_text(lm, image_request(lm).messages)
    return lm.adapter.encode(lm, prompt, None)


def time_guided_extend(lm, ks: list[int], warmup: int, repeats: int) -> tuple[int, dict[int, float]]:
    """(S, {k: ms}): one guided forward of k image tokens (both rows) after the sample
    prompt's S positions, for every k of ``ks``, timed in turn (``time_feeds``), the cache
    cropped back after each call."""
    cache = lm.adapter.new_cache(lm)
    lm.adapter.prefill(lm, _prompt_inputs(lm), cache)
    feeds = [torch.zeros((1, k), dtype=torch.long, device=lm.device) for k in ks]  # code 0
    return cache_length(cache), dict(zip(ks, time_feeds(lm, cache, feeds, warmup, repeats)))


def image_tables(session, warmup: int, repeats: int,
                 progress: Callable[[str], None] | None = None) -> LatencyTables:
    """T_p(k) for k in NODES (and the method's round width), the draft's guided step, the
    target's prefill."""
    target, draft = session.target, session.draft
    tables = LatencyTables()
    ks = sorted(set(NODES) | {session.method.round_width(session.profile)})
    if progress:
        progress(f"target: guided forwards of {ks[0]}-{ks[-1]} image tokens")
    s, row = time_guided_extend(target, ks, warmup, repeats)
    tables.target_verify_ms[s] = row
    if draft is not None:
        if progress:
            progress("draft: one guided step")
        s, row = time_guided_extend(draft, [1], warmup, repeats)
        tables.draft_step_ms[1] = {s: row[1]}
    if progress:
        progress("target prefill of a sample prompt")
    inputs = _prompt_inputs(target)
    tables.prefill_ms = median_ms(
        lambda: target.adapter.prefill(target, inputs, target.adapter.new_cache(target)),
        target.device, warmup, repeats)
    return tables

