"""The drafter protocol and the registry of drafting methods by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from vlmspec_cli.runtime.request import DecodeState


@dataclass
class Draft:
    """A chain of proposed tokens and the draft distributions q they were drawn from
    (``probs``: (n, V); None at temperature 0, where only the tokens matter)."""

    tokens: list[int]
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> "Draft":
        return Draft(self.tokens[:n], None if self.probs is None else self.probs[:n])


class Drafter(Protocol):
    name: str
    needs_target_hidden: bool
    lossless: bool

    def prefill(self, state: DecodeState) -> None:
        """Build the drafter's own cache for the request (stored on ``state.drafter_state``)."""

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        """Propose up to ``max_tokens`` tokens continuing ``state.tokens``."""

    def accept(self, state: DecodeState, n_accepted: int,
               target_logits: torch.Tensor | None = None) -> None:
        """The first ``n_accepted`` proposals were kept (and ``state.tokens`` extended):
        roll the drafter's own state back to match. ``target_logits`` (n + 1, V) are the
        target's verified logits at the proposed positions, for adaptive drafters.

    Optional hooks: ``prepare(state)`` runs before the target's prefill (work that can
    overlap it, e.g. captioning); ``finish(state)`` after the last round (report to stats).
    A drafter with ``runs_target = True`` shares layers with the target (twig): its
    ``prefill`` also prefills the target (sets ``state.target_cache`` and
    ``state.target_next_logits``) and ``extend_target(state, ids)`` replaces the target's
    cached forward, returning logits (1, n, V)."""


DrafterFactory = Callable[..., Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}


def register(name: str):
    def deco(factory: DrafterFactory) -> DrafterFactory:
        _REGISTRY[name] = factory
        return factory

    return deco


def drafter_names() -> list[str]:
    return sorted(_REGISTRY)


def create_drafter(name: str, **kwargs) -> Drafter:
    if name not in _REGISTRY:
        from vlmspec_cli.suggest import did_you_mean

        hint = did_you_mean(name, _REGISTRY)
        raise ValueError(f"unknown method '{name}'{hint}; available: {', '.join(drafter_names())}")
    return _REGISTRY[name](**kwargs)
