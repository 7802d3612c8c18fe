"""``--batch-size auto`` (``generation.batch_size: auto``; issue 61, item 3): the batch size
a folder decodes at, chosen on this machine from the folder's own first requests.

1. Memory bounds B. One row's KV caches (the target's and the draft model's, if any:
   2 · layers · kv_heads · head_dim · element size per position) over the longest of the
   first requests' prompts + ``max_new_tokens`` + a round's width, a third more for the
   ragged cache's waste before it packs (runtime/fast/ragged.py), must fit B times within
   the budget: BUDGET_SHARE of the memory free now (the GPU's free memory on CUDA, the
   system's available memory on a CPU). The budget and one row's share are printed. A
   later request longer than the first ones can take its row past that share.
2. Throughput is measured: after one untimed warm-up row, the first B requests decoded
   together at B = 1, 2, 4, 8, … (each capped at PROBE_TOKENS new tokens), tokens per
   second over the run; B doubles while the doubling raised the rate by at least GROWTH
   (5%), and the largest B that did is chosen (``grow``). At most as many as the first
   requests that load, and MAX_ROWS.
3. A session that decodes one request at a time (its method, a draft of another tokenizer)
   decodes at B = 1, saying why in one line, instead of failing as a count > 1 does.

The measuring decodes are thrown away; every input is then decoded at the chosen B, where
each row's output is the one it gets decoded alone, as at any B. The auto draft length's
costs and acceptance (drafting.length: auto) learn from the measuring rounds too.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from vlmspec_cli.runtime.request import Request

GROWTH = 1.05         # a doubled B must raise the measured tokens/s by this much
PROBE_TOKENS = 16     # new tokens per request while measuring
BUDGET_SHARE = 0.5    # of the memory free now, what the rows' KV caches may take
MAX_ROWS = 64
RAGGED_SLACK = 4 / 3  # the ragged cache packs its rows once a quarter of its width is waste


@dataclass
class BatchChoice:
    rows: int
    rates: dict[int, float] = field(default_factory=dict)   # B → tokens/s measured
    per_row: int = 0          # bytes: one row's KV caches
    budget: int = 0           # bytes: what the rows' KV caches may take
    alone: str | None = None  # why the session decodes one request at a time

    def label(self) -> str:
        """For the runtime line: the B chosen and what it was chosen from ("" for a
        session decoding one request at a time: ``line`` says so)."""
        if self.alone is not None:
            return ""
        rates = ", ".join(f"{b}: {r:.0f}" for b, r in self.rates.items())
        return (f"batch {self.rows} (auto; tokens/s at B {rates}; KV {_mib(self.per_row)}/row "
                f"of a {_mib(self.budget)} budget)")

    def line(self) -> str:
        """The one line a session decoding one request at a time prints."""
        return f"--batch-size auto: {self.alone}; decoding at batch size 1"


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:.1f} GiB"


def one_at_a_time(session) -> str | None:
    """Why this session decodes one request at a time, or None when its rows can batch."""
    p = session.profile
    if not session.method.batches:
        return f"method '{p.method}' decodes one request at a time"
    try:
        session.engine.drafter.check_batch()
    except ValueError as exc:
        return str(exc)
    return None


def kv_bytes_per_position(lm) -> int:
    """Keys and values of every layer for one position of ``lm``'s text model."""
    cfg = lm.model.config
    text = getattr(cfg, "text_config", None) or cfg
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    size = torch.empty((), dtype=lm.dtype).element_size()
    return 2 * text.num_hidden_layers * kv_heads * head_dim * size


def free_memory(device: torch.device) -> int:
    """Bytes free now: the GPU's on CUDA, else the system's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def grow(measure: Callable[[int], float], limit: int) -> tuple[int, dict[int, float]]:
    """B = 1, 2, 4, … up to ``limit`` (and ``limit`` itself, where no power of two is
    it), measured by ``measure(B)`` (tokens/s); the largest B whose step up from the one
    before raised the rate by GROWTH. Returns (B, {B: rate measured})."""
    rates = {1: measure(1)}
    best = 1
    while best < limit:
        b = min(2 * best, limit)
        rates[b] = measure(b)
        if rates[b] < GROWTH * rates[best]:
            break
        best = b
    return best, rates


def _prompt_positions(session, request: Request) -> int:
    lm = session.target
    videos = {"videos": request.videos} if request.videos else {}
    inputs = lm.adapter.encode(lm, lm.adapter.prompt_text(lm, request.messages),
                               request.images or None, **videos)
    return int(inputs["input_ids"].shape[-1])


def _rate(session, requests: list[Request], rows: int) -> float:
    """Tokens per second decoding ``requests[:rows]`` ``rows`` together."""
    engine = session.batched_engine(rows)
    t0 = time.perf_counter()
    tokens = sum(len(res.tokens) for _, res in engine.run(requests[:rows], lambda r: r)
                 if not isinstance(res, Exception))
    return tokens / max(time.perf_counter() - t0, 1e-9)


def choose_batch_size(session, make_request: Callable[[object], Request], jobs) -> BatchChoice:
    """The batch size for ``jobs`` (the module's docstring); ``make_request(job)`` builds a
    job's request (a job that cannot is left out of the measuring)."""
    why = one_at_a_time(session)
    if why is not None:
        return BatchChoice(1, alone=why)
    requests = []
    for job in jobs:
        if len(requests) >= MAX_ROWS:
            break
        try:
            request = make_request(job)
        except Exception:   # a bad input: it fails in the run, with its own record
            continue
        requests.append(dataclasses.replace(
            request, max_new_tokens=min(request.max_new_tokens, PROBE_TOKENS)))
    if len(requests) < 2:
        return BatchChoice(1, alone="fewer than two inputs to batch")
    models = [lm for lm in (session.target, session.draft) if lm is not None]
    longest = max(_prompt_positions(session, r) for r in requests)
    positions = (longest + session.profile.generation.max_new_tokens
                 + session.method.round_width(session.profile))
    per_row = int(sum(kv_bytes_per_position(lm) for lm in models) * positions * RAGGED_SLACK)
    budget = int(BUDGET_SHARE * free_memory(session.target.device))
    limit = max(1, min(len(requests), MAX_ROWS, budget // max(per_row, 1)))
    _rate(session, requests, 1)    # warm-up: first-call costs are no batch size's
    rows, rates = grow(lambda b: _rate(session, requests, b), limit)
    return BatchChoice(rows, rates, per_row, budget)
