"""``none``: no draft at all; the engine then decodes with the target alone (baseline)."""

from __future__ import annotations

from vlmspec_cli.drafters.base import Draft, register
from vlmspec_cli.runtime.request import DecodeState


@register("none")
class NoDrafter:
    name = "none"
    needs_target_hidden = False
    lossless = True

    def __init__(self, **_: object) -> None:
        pass

    def prefill(self, state: DecodeState) -> None:
        state.drafter_state = None

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        return Draft([])

    def accept(self, state: DecodeState, n_accepted: int, target_logits=None) -> None:
        pass
