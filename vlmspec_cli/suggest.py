"""Did-you-mean hints for names a user typed: profile keys and values, methods, recipe
commands and variables, chat-file keys. One wording everywhere: `` (did you mean 'x'?)``.

Imports nothing from vlmspec_cli, so every layer (runtime, drafters, tasks, profile,
recipes) can use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping


def quoted(name: str) -> str:
    return f"'{name}'"


def closest(word, choices: Iterable, *, cutoff: float = 0.6,
            aliases: Mapping[str, str] | None = None) -> str | None:
    """The choice most like ``word`` (difflib ratio >= ``cutoff``), or None.

    ``aliases`` maps spellings difflib would not find (e.g. another format's name for a
    key) to the choice they mean; an alias wins when its target is one of the choices."""
    names = [str(c) for c in choices]
    alias = (aliases or {}).get(str(word))
    if alias is not None and alias in names:
        return alias
    match = difflib.get_close_matches(str(word), names, n=1, cutoff=cutoff)
    return match[0] if match else None


def did_you_mean(word, choices: Iterable, *, show: Callable[[str], str] = quoted,
                 cutoff: float = 0.6, aliases: Mapping[str, str] | None = None) -> str:
    """`` (did you mean X?)`` with X = ``show(closest choice)``, or "" if none is close."""
    match = closest(word, choices, cutoff=cutoff, aliases=aliases)
    return f" (did you mean {show(match)}?)" if match is not None else ""
