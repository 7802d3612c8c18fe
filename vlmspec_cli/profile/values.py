"""The values a profile key may hold: each checked against its type (from ``schema.py``'s
annotations) and its ``_rule`` metadata (choices, pattern, bounds), with errors that name
the key and the source. ``loader.py`` walks the YAML and calls these per key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any, Mapping

from vlmspec_cli.suggest import did_you_mean


class ProfileError(Exception):
    """A user-facing profile problem; the message names the file and key path."""


class _RangeError(ProfileError):
    """A value of the right type that no field can hold (inf, nan, beyond 64 bits); a
    union type reports it rather than "expects X or Y"."""


# Every integer key is a signed 64-bit integer (torch tensors and generators hold no
# more; sampling.seed is exactly this range, leaving room for the seeds derived from it);
# every float key is finite.
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1


# ------------------------------------------------------------ types
def _union_args(tp) -> tuple | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _section_type(tp):
    """The dataclass behind a section type (``X`` or ``X | None``), else None."""
    args = _union_args(tp)
    if args is not None:
        rest = [a for a in args if a is not type(None)]
        tp = rest[0] if len(rest) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _is_optional(tp) -> bool:
    args = _union_args(tp)
    return args is not None and type(None) in args


def _type_name(tp) -> str:
    args = _union_args(tp)
    if args is not None:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(item)}"
    if _section_type(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


# ---------------------------------------------------------------- values
def _coerce(value, tp, key: str, source: str):
    """Type-check ``value`` against ``tp``; only int->float is converted."""
    def bad():
        got = "null" if value is None else type(value).__name__
        return ProfileError(f"{source}: key '{key}' expects {_type_name(tp)}, "
                            f"got {got} {_short(value)}")

    args = _union_args(tp)
    if args is not None:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except _RangeError:
                raise
            except ProfileError:
                pass
        raise bad()
    if tp is Any:
        return value
    if typing.get_origin(tp) is list:
        if not isinstance(value, (list, tuple)):
            hint = f" (a list: [{value}])" if isinstance(value, (str, int, float)) else ""
            raise ProfileError(str(bad()) + hint)
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if tp is float:
        return _finite_float(value, key, source, bad)
    if tp is int and isinstance(value, bool):
        raise bad()
    if tp is int and isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise _RangeError(f"{source}: key '{key}' must be a 64-bit integer, from {INT_MIN} "
                          f"to {INT_MAX} (got {_short(value)})")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise bad()


def _finite_float(value, key: str, source: str, bad) -> float:
    """An int or float as a finite float; inf, nan (also spelt as text) and ints too large
    for a float are errors naming the key."""
    if isinstance(value, str) and value.strip().lower().lstrip("+-.") in ("inf", "infinity", "nan"):
        raise _RangeError(f"{source}: key '{key}' must be a finite number (got {value!r})")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad()
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _RangeError(f"{source}: key '{key}' must be a finite number (got {_short(value)})")
    return number


def _short(value, most: int = 200) -> str:
    """A value for a message: huge integers by their size, not their 400 digits; a long
    text or list cut after ``most`` characters."""
    if isinstance(value, int) and abs(value) > 10 ** 30:
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)   # at most a few MiB: profile/yaml_file.py bounds what YAML holds
    return text if len(text) <= most else text[:most] + "…"


_BOUNDS = (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
           ("le", lambda a, b: a <= b, "<="))


def _number(item):
    """``item`` as a number for a range check (a count spelt as text, e.g. threads: "8",
    included), else None ("auto")."""
    if isinstance(item, str) and re.fullmatch(r"[0-9]{1,30}", item.strip()):
        return int(item)
    return item if isinstance(item, (int, float)) and not isinstance(item, bool) else None


def _range(meta: Mapping) -> str:
    """The allowed range of a key, as its error says it: ">= 1 and <= 64", ">= 0"."""
    return " and ".join(f"{sym} {meta[op]}" for op, _, sym in _BOUNDS if meta.get(op) is not None)


def _check(value, meta: Mapping, key: str, source: str) -> None:
    if value is None or not meta:
        return
    if meta.get("nonempty") and isinstance(value, list) and not value:
        raise ProfileError(f"{source}: key '{key}' must not be empty")
    for item in value if isinstance(value, list) else [value]:
        choices, pattern = meta.get("choices"), meta.get("pattern")
        if (choices and item not in choices) or (pattern and not re.fullmatch(pattern, str(item))):
            allowed = meta.get("allowed") or ", ".join(map(str, choices))
            msg = f"{source}: key '{key}' must be one of: {allowed} (got {_short(item)})"
            short = (meta.get("shorthand") or {}).get(item if isinstance(item, str) else None)
            if short:   # --inputs M,T takes letters; a profile and --set take the names
                raise ProfileError(f"{msg}: '{item}' is the command line's letter for "
                                   f"'{short}'; write {short} here")
            raise ProfileError(msg + did_you_mean(item, choices or ()))
        number = _number(item)
        if number is None:
            continue
        for op, ok, _ in _BOUNDS:
            bound = meta.get(op)
            if bound is not None and not ok(number, bound):
                raise ProfileError(f"{source}: key '{key}' must be {_range(meta)} "
                                   f"(got {_short(item)})")
