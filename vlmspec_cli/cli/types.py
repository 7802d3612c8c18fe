"""Click parameter types shared by the commands: numbers checked at parse time, so a bad
value is a usage error naming the option (exit 2) before anything loads, never a failure
of every input at decode time."""

from __future__ import annotations

import math
import os

import click

# A seed is a signed 64-bit integer: torch.Generator.manual_seed accepts
# [-2**63, 2**64 - 1], and the engine derives other seeds from it by adding small offsets
# (the draft's generator, image K of a prompt), which must stay in that range too.
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 63 - 1


class FiniteFloat(click.FloatRange):
    """A float in a range that is also finite: ``inf`` and ``nan`` are rejected (click's
    FloatRange lets both through: inf is above any minimum, nan fails no comparison)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


class Count(click.IntRange):
    """An integer with a lower bound (a token limit, a batch size): click's IntRange, whose
    error for a word reads "'abc' is not a valid integer range."; this one says integer,
    and refuses one past the 64-bit range a profile key holds (the error named the profile
    key, not the option)."""

    name = "integer"

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if rv > SEED_MAX:
            self.fail(f"{rv} is too large (at most {SEED_MAX}).", param, ctx)
        return rv


class CountOrAuto(Count):
    """A count with a lower bound, or the word auto (--batch-size auto: measured)."""

    name = "integer or auto"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return super().convert(value, param, ctx)


class Seed(click.IntRange):
    """A sampling seed: an integer in the signed 64-bit range (see SEED_MIN / SEED_MAX)."""

    name = "seed"

    def __init__(self) -> None:
        super().__init__(min=SEED_MIN, max=SEED_MAX)


class IntList(click.ParamType):
    """Comma-separated integers, each in [min, max], e.g. ``2,4,6``; converts to a sorted
    list without duplicates."""

    name = "integer list"

    def __init__(self, min: int | None = None, max: int | None = None) -> None:
        self.item = click.IntRange(min=min, max=max)

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        if not any(parts):
            self.fail("expected comma-separated integers, got nothing.", param, ctx)
        out = set()
        for part in parts:
            if not part:
                self.fail(f"empty item in {value!r} (expected comma-separated integers).",
                          param, ctx)
            try:
                out.add(self.item.convert(part, param, ctx))
            except click.BadParameter as exc:
                self.fail(f"{exc.message} (in {value!r})", param, ctx)
        return sorted(out)


__all__ = ["FiniteFloat", "IntList", "Seed", "SEED_MIN", "SEED_MAX"]


class Utf8Text(click.types.StringParamType):
    """Text from the command line as UTF-8 whatever the locale: under LC_ALL=C with UTF-8
    mode off, Python decodes argv as ASCII with surrogateescape, and a tokenizer refuses
    the lone surrogates that "qué" becomes (a TypeError at decode time). The bytes the
    shell passed are decoded as UTF-8 again; bytes that are not UTF-8 are a usage error.
    (A string type still: recipe_paths.py counts any string a step is given as a path.)"""

    name = "text"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            raw = os.fsencode(value)   # the bytes of argv, as the shell passed them
        except UnicodeError:
            return value
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                      param, ctx)
