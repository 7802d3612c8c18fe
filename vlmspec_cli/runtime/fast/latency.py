"""Latency measurements of target and draft forwards (TABED §3.1, App. F).

T_p(B, S, γ): the target verifying γ tokens after a cache of S positions; T_q(B, S, 1): one
draft step for B rows (an ensemble drafts B rows at once). Every number is the median of
``repeats`` timed calls after ``warmup`` untimed ones, with the device synchronised around
each call, and caches cropped back so every call sees the same S.

Remarks 1-3 of TABED say T is about constant in γ (for the target), in S and in B (for the
draft) at small sizes; ``remarks`` reports the largest relative deviation |ΔT/T| of each.
Eq. 1: expected speedup = τ / (γ·T_q/T_p + T_p(γ)/T_p) (the paper takes T_p(γ) ≈ T_p).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache

REMARK_TOLERANCE = 0.05


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 15) -> float:
    """Median wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(samples)


@dataclass
class LatencyTables:
    target_verify_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # [S][k]
    draft_step_ms: dict[int, dict[int, float]] = field(default_factory=dict)     # [B][S]
    target_batch_ms: dict[int, dict[int, float]] = field(default_factory=dict)   # [B][k] at S_0
    prefill_ms: float | None = None

    def target_ms(self, s: int, k: int = 1) -> float:
        return self.target_verify_ms[s][k]


def _filled_cache(lm, length: int, rows: int = 1):
    """A cache holding ``length`` positions of ordinary text tokens for ``rows`` rows."""
    tok = lm.tokenizer
    text = " ".join(["the small red circle is at the top left of the image."] * (length // 8 + 2))
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][:, :length]
    if ids.shape[1] < length:
        raise ValueError(f"cannot build a {length}-token context for '{lm.name}'")
    ids = ids.expand(rows, -1).to(lm.device)
    cache = lm.adapter.new_cache(lm)
    lm.adapter.prefill(lm, {"input_ids": ids}, cache)
    return cache, ids[:, -1:]


def time_extend(lm, context: int, new_tokens: int, rows: int, warmup: int, repeats: int) -> float:
    """One forward of ``new_tokens`` per row after ``context`` cached positions (ms)."""
    cache, last = _filled_cache(lm, context, rows)
    return time_feed(lm, cache, last.expand(rows, new_tokens).contiguous(), warmup, repeats)


def time_feed(lm, cache, feed: torch.Tensor, warmup: int, repeats: int) -> float:
    """The median ms of the adapter's forward of ``feed`` after ``cache``, the cache cut back
    to its length after every call, so each call sees the same context."""
    context = cache_length(cache)

    def step():
        lm.adapter.extend(lm, feed, cache)
        truncate_cache(cache, context)

    ms = median_ms(step, lm.device, warmup, repeats)
    assert cache_length(cache) == context
    return ms


def time_feeds(lm, cache, feeds: list[torch.Tensor], warmup: int, repeats: int) -> list[float]:
    """The median ms of the adapter's forward of each of ``feeds`` after ``cache`` (cut back
    after every call), the feeds timed in turn: every pass times each feed once, in
    alternating order. Timed one feed after another, a slow spell of the machine (other
    processes) slowed only the sizes timed in it: on a loaded machine a five-token
    verification measured a third of a one-token step (issue 60); in turn, every size
    sees the same load."""
    context = cache_length(cache)

    def step(feed):
        lm.adapter.extend(lm, feed, cache)
        truncate_cache(cache, context)

    for _ in range(warmup):
        for feed in feeds:
            step(feed)
    synchronize(lm.device)
    samples: list[list[float]] = [[] for _ in feeds]
    order = list(range(len(feeds)))
    for _ in range(repeats):
        for i in order:
            t0 = time.perf_counter()
            step(feeds[i])
            synchronize(lm.device)
            samples[i].append((time.perf_counter() - t0) * 1000.0)
        order.reverse()
    assert cache_length(cache) == context
    return [statistics.median(x) for x in samples]


def time_widths(lm, context: int, widths: list[int], rows: int, warmup: int,
                repeats: int) -> dict[int, float]:
    """{k: ms} of one forward of k new tokens per row after ``context`` cached positions,
    for every k of ``widths``, timed in turn (``time_feeds``)."""
    cache, last = _filled_cache(lm, context, rows)
    feeds = [last.expand(rows, k).contiguous() for k in widths]
    return dict(zip(widths, time_feeds(lm, cache, feeds, warmup, repeats)))


def measure_tables(target, draft, contexts: list[int], verify_tokens: list[int], batches: list[int],
                   warmup: int = 3, repeats: int = 15,
                   progress: Callable[[str], None] | None = None) -> LatencyTables:
    tables = LatencyTables()
    verify_tokens = sorted(verify_tokens)
    for s in contexts:   # the widths timed in turn: T_p(k) against T_p(1) under one load
        if progress:
            progress(f"target verifying {verify_tokens[0]}-{verify_tokens[-1]} tokens after {s} positions")
        tables.target_verify_ms[s] = time_widths(target, s, verify_tokens, 1, warmup, repeats)
    for b in batches:  # T_p(B, S_0, k): requests verified together (B > 1 batching)
        if progress:
            progress(f"target verifying {b} row{'s' if b > 1 else ''} together")
        tables.target_batch_ms[b] = time_widths(
            target, contexts[0], sorted({1, max(k for k in verify_tokens if k <= 8)}), b,
            warmup, repeats)
    if draft is not None:
        for b in batches:
            tables.draft_step_ms[b] = {}
            for s in contexts:
                if progress:
                    progress(f"draft step: {b} row{'s' if b > 1 else ''} after {s} positions")
                tables.draft_step_ms[b][s] = time_extend(draft, s, 1, b, warmup, repeats)
    return tables


def _deviation(values: list[float]) -> float:
    """max |T - T_ref| / T_ref with T_ref the first value."""
    ref = values[0]
    return max(abs(v - ref) / ref for v in values) if ref > 0 else 0.0


def remarks(tables: LatencyTables, max_gamma: int = 10) -> dict:
    """TABED Remarks 1-3: the largest |ΔT/T| seen, and whether it stays under 5%; None for
    a remark with no two timings to compare (one context, one batch size: an image
    profile's draft was timed at one point, and "≤ 0.000 (holds)" read as a finding)."""
    def worst(series) -> float | None:
        devs = [_deviation(values) for values in series if len(values) > 1]
        return max(devs) if devs else None

    out = {"remark1_target_vs_gamma": worst(
        [row[k] for k in sorted(row) if k <= max_gamma] for row in tables.target_verify_ms.values())}
    if tables.draft_step_ms:
        by_b = tables.draft_step_ms
        out["remark2_draft_vs_S"] = worst([row[s] for s in sorted(row)] for row in by_b.values())
        contexts = sorted(next(iter(by_b.values())))
        out["remark3_draft_vs_B"] = worst([by_b[b][s] for b in sorted(by_b)] for s in contexts)
    return {k: (None if v is None else {"max_rel_dev": round(v, 4), "holds": v < REMARK_TOLERANCE})
            for k, v in out.items()}


def eq1_speedup(tau: float, gamma: int, ratio: float, verify_factor: float = 1.0) -> float:
    """TABED Eq. 1: τ / (γ·T_q/T_p + T_p(γ)/T_p); verify_factor = T_p(γ)/T_p (≈ 1 by Remark 1)."""
    return tau / (gamma * ratio + verify_factor)
