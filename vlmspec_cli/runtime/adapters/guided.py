"""What the image-generating families share: every step decodes two rows (the prompt and
an unconditional or negative one) and the engine sees one classifier-free-guided
distribution per position; the guidance scale comes from the profile (``image.cfg``),
else the model's generation config, else the family's default."""

from __future__ import annotations

from vlmspec_cli.runtime.adapters.base import ModelAdapter


class GuidedImageAdapter(ModelAdapter):
    takes_images = False          # image *understanding* inputs are not wired up
    generates_images = True
    decode_rows = 2               # every step decodes the conditional and the guiding row
    default_guidance = 5.0        # the family's own default when nothing sets the scale

    def __init__(self, guidance: float | None = None) -> None:
        self.guidance = guidance

    def with_guidance(self, guidance: float | None) -> "GuidedImageAdapter":
        """The same family with the profile's guidance scale (None: the model's own)."""
        return type(self)(guidance)

    def guidance_scale(self, lm) -> float:
        if self.guidance is not None:
            return float(self.guidance)
        value = getattr(lm.model.generation_config, "guidance_scale", None)
        return float(value) if value else self.default_guidance
