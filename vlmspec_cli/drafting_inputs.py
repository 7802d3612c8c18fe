"""The drafting inputs: the ways a draft model can read a request (TABED §4), by name and
by letter. The one list of them: the profile's ``drafting.inputs`` choices, the CLI's
``--inputs`` parser and the drafters (drafters/inputs.py builds each one) all use it.

- ``multimodal`` (M): the prompt and the images, as the target reads them.
- ``text`` (T):       each image placeholder replaced by "\\n", no images.
- ``caption`` (C):    each image placeholder replaced by the image's caption.
- ``pooled`` (P):     the images with the vision tower's patch grid 2×2 average-pooled.

No imports beyond the standard library: the profile and the CLI read this before any
model code loads.
"""

from __future__ import annotations

DRAFTING_INPUTS = ("multimodal", "text", "caption", "pooled")
VIDEO_INPUTS = ("multimodal", "text")  # what a chain draft reads a video through
LETTERS = {"multimodal": "M", "text": "T", "caption": "C", "pooled": "P"}
_BY_LETTER = {letter.lower(): name for name, letter in LETTERS.items()}


def letters(inputs) -> str:
    """["multimodal", "text"] → "MT"."""
    return "".join(LETTERS[i] for i in inputs)


def parse_inputs(value: str | None) -> list[str] | None:
    """``M,T`` / ``multimodal,text`` / ``MTCP`` → a drafting.inputs list (unknown names are
    kept as given, for the profile to reject with its own message)."""
    if not value:
        return None
    parts = [v.strip() for v in value.split(",") if v.strip()]
    if len(parts) == 1 and parts[0].isupper() and set(parts[0].lower()) <= set(_BY_LETTER):
        parts = list(parts[0])
    return [_BY_LETTER.get(p.lower(), p) if len(p) == 1 else p for p in parts]
