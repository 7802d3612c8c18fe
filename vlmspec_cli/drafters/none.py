"""``none``: no draft at all; the engine then decodes with the target alone (baseline).
The protocol's defaults (runtime/draft.py) already draft nothing."""

from __future__ import annotations

from vlmspec_cli.drafters.base import DraftingMethod, register
from vlmspec_cli.runtime.draft import BatchDrafter


@register("none")
class NoDrafter(DraftingMethod):
    tasks = ("caption", "image", "video")
    batches = True

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "NoDrafter":
        return cls()

    def batched(self) -> BatchDrafter:
        return BatchDrafter()
