"""``none``: no draft at all; the engine then decodes with the target alone (baseline).
The protocol's defaults (runtime/round/draft.py) already draft nothing."""

from __future__ import annotations

from vlmspec_cli.drafters.base import DraftingMethod, register


@register("none")
class NoDrafter(DraftingMethod):
    tasks = ("caption", "image", "video")
    batches = True
    drafts = False
    uses_draft = False
    help = "target only"

    @classmethod
    def label(cls, profile) -> str:
        return "none"

    @classmethod
    def drafting_inputs(cls, profile) -> list[str]:
        return []

    @classmethod
    def record_fields(cls, profile, task: str) -> dict:
        return {} if task == "image" else {"drafting_inputs": [], "gamma": 0,
                                           "draft_length": cls.draft_length(profile)}

    @classmethod
    def round_width(cls, profile) -> int:
        return 1   # one token a step

    @classmethod
    def compile_plan(cls, profile) -> list[tuple[str, int, str, int | None]]:
        return [("target", cls.round_width(profile), "causal", None)]

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "NoDrafter":
        return cls()
