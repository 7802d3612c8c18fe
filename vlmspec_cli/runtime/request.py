"""What one decoding request is, and the state the engine keeps for it.

All decoding state lives on the request's ``DecodeState`` (caches, generated tokens,
generators, drafter state), never on the engine, so requests can later be batched (B > 1)
without a rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vlmspec_cli.runtime.stats import SpecStats


@dataclass
class Message:
    """One conversation turn; user turns may carry images and videos (placed before the
    text; a video is a ``tasks.video_io.VideoClip``)."""

    role: str
    text: str
    images: tuple = ()
    videos: tuple = ()


@dataclass
class Request:
    messages: list[Message]
    max_new_tokens: int = 64
    seed: int = 0
    request_id: str = ""

    @property
    def images(self) -> list:
        return [im for m in self.messages for im in m.images]

    @property
    def videos(self) -> list:
        return [v for m in self.messages for v in m.videos]


@dataclass
class TargetFeatures:
    """The target's hidden states (one chosen layer, or several concatenated: EAGLE-3) for
    drafters that read them (``Drafter.hidden_layer``): rows for target cache positions
    start, start + 1, … At prefill also the prompt's ids, which positions are visual and,
    for families with 3-D positions (Qwen-VL's M-RoPE), the prompt's positions."""

    hidden: torch.Tensor                    # (n, H) or (n, k·H)
    start: int = 0
    ids: torch.Tensor | None = None         # (L,) prompt ids, prefill only
    visual: torch.Tensor | None = None      # (L,) bool, prefill only
    positions: torch.Tensor | None = None   # (3, L) prompt positions, prefill only
    # the plain rounds' rows after the prompt's, while the drafter waits for its prefill
    later: list[torch.Tensor] = field(default_factory=list)
    later_end: int = 0                      # the target position after the last row kept

    def keep_for_late_prefill(self, hidden: torch.Tensor, start: int) -> None:
        """A plain round decoded while the drafter waits (``DecodeState.draft_deferred``):
        its fed token's rows (target positions ``start``, …) follow the prompt's, for the
        drafter's prefill at the request's first drafted round (a copy: the forward's
        output may be a buffer the next one writes)."""
        end = self.later_end or self.start + self.hidden.shape[0]
        if start != end:
            raise RuntimeError(f"target features: rows from position {start} after {end}")
        self.later.append(hidden.clone())
        self.later_end = end + hidden.shape[0]

    def rows(self) -> torch.Tensor:
        """Every row: the prompt's, then those kept while the drafter waited."""
        return torch.cat([self.hidden, *self.later]) if self.later else self.hidden


@dataclass
class DecodeState:
    request: Request
    prompt: str                                 # the target's rendered prompt text
    target_cache: Any = None
    target_pending: list[int] = field(default_factory=list)  # committed, not yet in the cache
    target_next_logits: torch.Tensor | None = None           # (V,) when pending is empty
    tokens: list[int] = field(default_factory=list)          # generated so far
    done: bool = False
    stats: SpecStats = field(default_factory=SpecStats)
    target_generator: torch.Generator | None = None
    draft_generator: torch.Generator | None = None
    drafter_state: Any = None
    features: TargetFeatures | None = None  # the last target forward's hidden states
    length: Any = None                      # drafting.length auto: draft_length.LengthState
    # the drafter's prefill waits for the request's first drafted round (the round policy's
    # choice, round_policy.py): until then nothing of the drafter runs for this request
    draft_deferred: bool = False
    # every round of this request (from its start, or from a round on) decodes plain,
    # whatever it emits (the round policy's: drafting off past its last round): the
    # target's forwards hand over no hidden states, as target-only's
    plain_throughout: bool = False
    # this round's draft_stop.ChainStop (drafting.length auto, a request alone): where a
    # drafter that reads its own confidence may end its chain; None: draft all k
    draft_stop: Any = None


def make_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Separate generators for target and draft, both derived from the request seed, so the
    draft's randomness never shifts the target's stream."""
    # CPU generators: sampling happens on small CPU-side tensors of probabilities
    target = torch.Generator(device="cpu").manual_seed(seed)
    draft = torch.Generator(device="cpu").manual_seed(seed + 0x9E3779B1)
    return target, draft
