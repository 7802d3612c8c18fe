"""``chain``: a separate small draft model proposes γ tokens one by one, reading the request
through one drafting input (members.py: multimodal, text, caption or pooled).

It is the ensemble drafter with a single member: the mixture is that member's own
distribution and there are no weights to adapt.
"""

from __future__ import annotations

from vlmspec_cli.drafters.base import register
from vlmspec_cli.drafters.ensemble import EnsembleDrafter
from vlmspec_cli.drafters.members import MEMBER_INPUTS
from vlmspec_cli.runtime.verify import SamplingParams

INPUT_VARIANTS = MEMBER_INPUTS


@register("chain")
def make_chain(draft, sampling: SamplingParams, variant: str = "multimodal",
               image_token: str | None = None, captioner=None, trace=None, **_: object) -> EnsembleDrafter:
    if variant not in INPUT_VARIANTS:
        raise ValueError(f"chain drafting supports inputs {INPUT_VARIANTS}, not '{variant}'")
    return EnsembleDrafter(draft, sampling, [variant], image_token=image_token,
                           captioner=captioner, policy="static", name="chain", trace=trace)
