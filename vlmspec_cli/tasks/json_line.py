"""One line of a JSONL input file (chats, benchmark samples), parsed warily.

:func:`parse_json_line` returns the value or raises :class:`JsonLineError` whose message is
the reason as a user reads it: ``not valid JSON (Expecting ',' delimiter at column 17)``,
``duplicate key 'id' in a JSON object`` (json.loads would silently keep the last one),
``not valid JSON (nested too deeply)``, or a number too long to convert. Callers add the
file name and line number.
"""

from __future__ import annotations

import json
from typing import Any


class JsonLineError(ValueError):
    """What is wrong with one line (without its ``FILE:N:`` prefix)."""


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise JsonLineError(f"duplicate key '{key}' in a JSON object")
        obj[key] = value
    return obj


def parse_json_line(text: str) -> Any:
    """The JSON value of ``text`` (the raw line, so error columns match the file)."""
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except JsonLineError:
        raise
    except json.JSONDecodeError as e:
        raise JsonLineError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise JsonLineError("not valid JSON (nested too deeply)") from None
    except ValueError as e:   # e.g. an integer too long to convert
        raise JsonLineError(f"not valid JSON ({e})") from None
