"""Benchmark workload files for ``vlmspec bench``: MMSpec's JSONL as it ships, and ``--chat``
conversations.

MMSpec (arXiv 2603.14989, github.com/killthefullmoon/MMSpec) ships each split as
``mmspec.jsonl`` with an ``images/`` folder beside it. One sample per line::

    {"id": "img_000001", "image": "general_vqa/img_000001.png",
     "turns": ["What type of plant is in the foreground?", "What is the weather like?"],
     "category": "Landscape with reeds and lake", "topic": "general vqa"}

* ``turns``: the user's questions, answered in order as one conversation: the image comes
  with the first, and each answer is fed back as the assistant's turn before the next.
* ``image``: relative to the file's folder, or to the ``images/`` folder beside it (where
  MMSpec keeps them), or absolute.
* ``topic`` is MMSpec's task category (general vqa, text vqa, image captioning, chart
  understanding, complex reasoning, multi-turn), the one its own summaries group by;
  ``category`` there describes the image. A sample is grouped by ``topic``, else by
  ``category`` when it has no topic, else "uncategorised".
* ``id`` (a string or an integer; default ``FILE:LINE``) must be unique in the file.
* Any other key is ignored.

A line with ``messages`` is a ``--chat`` conversation (tasks/chat.py): the messages as
given, and the model writes the next assistant turn; ``id``, ``topic`` and ``category``
as above, other keys ignored.

A bad line never loses the good ones: it becomes a :class:`SampleError` naming its line.
The file is read as a bounded stream (text_lists.py): a regular file only, lines up to
1 MiB, 64 MiB in all; a file whose first bytes are binary or not UTF-8 is refused whole
(InputError), never reported line by line. Images are only located here, not opened.
No click or rich.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from dataclasses import dataclass

from vlmspec_cli.tasks.chat import ChatTurn, fs_name, parse_messages
from vlmspec_cli.tasks.inputs import InputError, name_problem, shown_name
from vlmspec_cli.tasks.json_line import JsonLineError, parse_json_line
from vlmspec_cli.tasks.text_lists import (MAX_LIST_BYTES, ListFileError, ListTooLong,
                                          bounded_lines, open_list_file)

MAX_SAMPLE_LINE = 1024 ** 2
UNCATEGORISED = "uncategorised"
_HEAD = 4096


@dataclass(frozen=True)
class BenchSample:
    """One sample: its ``turns`` (user and given assistant messages, images resolved) and
    ``replies``: the indices of the user turns the model answers (MMSpec: every one; a
    --chat line: the last)."""

    key: str
    line: int
    group: str
    turns: tuple[ChatTurn, ...]
    replies: tuple[int, ...]
    digest: str               # SHA-256 of what the sample asks (part of its resume key)

    @property
    def questions(self) -> list[str]:
        return [self.turns[i].text for i in self.replies]

    @property
    def image_paths(self) -> list[str]:
        return [p for turn in self.turns for p in turn.image_paths]


@dataclass(frozen=True)
class SampleError:
    line: int
    key: str                  # the id when it could be read, else "FILE:LINE"
    group: str | None
    reason: str


class _Bad(Exception):
    """Internal: what is wrong with one line."""


def category_name(text: str) -> str:
    """A category as --categories matches it: case, "_" and "-" ignored ("General_VQA" is
    "general vqa")."""
    return " ".join(text.lower().replace("_", " ").replace("-", " ").split())


def read_bench_file(path: str) -> list[BenchSample | SampleError]:
    """Every sample of the file in order (blank and ``#`` lines skipped). Raises
    InputError when the file itself is unusable (missing, not a regular file, binary,
    past 64 MiB, or without a single sample)."""
    try:
        fh = open_list_file(path)
    except ListFileError as exc:
        raise InputError(path, str(exc)) from None
    name, base = os.path.basename(path), os.path.dirname(path)
    out: list[BenchSample | SampleError] = []
    first: dict[str, int] = {}
    with fh:
        problem = _binary_head(fh.peek(_HEAD)[:_HEAD])
        if problem:
            raise InputError(path, problem)
        try:
            for n, raw, too_long in bounded_lines(fh, MAX_SAMPLE_LINE, MAX_LIST_BYTES):
                sample = _line(n, raw, too_long, name, base, first)
                if sample is not None:
                    out.append(sample)
        except ListTooLong as exc:
            raise InputError(path, str(exc)) from None
        except OSError as exc:
            raise InputError(path, f"cannot read ({exc.strerror or exc})") from None
    if not out:
        raise InputError(path, "holds no samples (only blank and comment lines)")
    return out


def _binary_head(head: bytes) -> str | None:
    if b"\0" in head:
        return "binary data, not a JSONL file of samples"
    try:  # incremental: a character cut at the end of the head is fine
        codecs.getincrementaldecoder("utf-8-sig")("strict").decode(head, final=False)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (invalid byte at offset {e.start})"
    return None


def _line(n: int, raw: bytes | None, too_long: str | None, name: str, base: str,
          first: dict[str, int]) -> BenchSample | SampleError | None:
    key, group = f"{name}:{n}", None
    if too_long:
        return SampleError(n, key, None, too_long)
    try:
        text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
    except UnicodeDecodeError as e:
        return SampleError(n, key, None, f"not UTF-8 text (invalid byte at column {e.start + 1})")
    if not text.strip() or text.lstrip().startswith("#"):
        return None
    try:
        obj = _json(text)
        key = _id(obj) or key
        group = _group(obj)
        turns, replies = _conversation(obj, base)
        if key in first:
            raise _Bad(f"duplicate id '{key}' (first on line {first[key]})")
    except _Bad as exc:
        return SampleError(n, key, group, str(exc))
    first[key] = n
    return BenchSample(key, n, group, turns, replies, _digest(turns, replies))


def _json(text: str) -> dict:
    try:
        obj = parse_json_line(text)
    except JsonLineError as e:
        raise _Bad(str(e)) from None
    if not isinstance(obj, dict):
        raise _Bad("expected a JSON object (a sample), got "
                   f"{type(obj).__name__ if obj is not None else 'null'}")
    return obj


def _id(obj: dict) -> str | None:
    if "id" not in obj:
        return None
    value = obj["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise _Bad("'id' must be a non-empty string or an integer")
    return str(value)


def _group(obj: dict) -> str:
    for field in ("topic", "category"):
        value = obj.get(field)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise _Bad(f"'{field}' must be a non-empty string")
        return value.strip()
    return UNCATEGORISED


def _conversation(obj: dict, base: str) -> tuple[tuple[ChatTurn, ...], tuple[int, ...]]:
    if "messages" in obj:   # a --chat line
        try:
            turns = parse_messages(obj["messages"], base)
        except ValueError as exc:
            raise _Bad(str(exc)) from None
        for turn in turns:
            for p in turn.image_paths:
                if not os.path.exists(p):
                    raise _Bad(f"image not found: {shown_name(p)}")
        return tuple(turns), (len(turns) - 1,)
    questions = obj.get("turns")
    if questions is None:
        raise _Bad("no 'turns' (MMSpec: a list of questions) and no 'messages' (--chat)")
    if not isinstance(questions, list) or not questions:
        raise _Bad("'turns' must be a non-empty list of questions")
    for i, q in enumerate(questions, 1):
        if not isinstance(q, str) or not q.strip():
            raise _Bad(f"turn {i} must be a non-empty string")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError:
            raise _Bad(f"turn {i} holds a lone surrogate (an escape like \\ud800)") from None
    image = _image(obj, base)
    turns = [ChatTurn("user", q, (image,) if i == 0 else ()) for i, q in enumerate(questions)]
    return tuple(turns), tuple(range(len(turns)))


def _image(obj: dict, base: str) -> str:
    value = obj.get("image")
    if not isinstance(value, str) or not value:
        raise _Bad("'image' must be an image path (relative to the file's folder or its "
                   "images/ folder)")
    value = fs_name(value)
    if name_problem(value):
        raise _Bad(f"image {shown_name(value)}: {name_problem(value)}")
    if os.path.isabs(value):
        candidates = [value]
    else:
        candidates = [os.path.join(base, value), os.path.join(base, "images", value)]
    for path in candidates:
        if os.path.exists(path):
            return path
    where = "" if os.path.isabs(value) else " (looked beside the file and in its images/ folder)"
    raise _Bad(f"image not found: {shown_name(value)}{where}")


def _digest(turns, replies) -> str:
    """What the sample asks, as one hash: its messages, the images' names and which turns
    are answered (a changed question is a new sample to a rerun)."""
    data = json.dumps([[t.role, t.text, list(t.image_paths)] for t in turns] + [list(replies)],
                      ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogateescape")).hexdigest()


def select(items: list[BenchSample | SampleError], categories: list[str] | None,
           limit: int | None) -> list[BenchSample | SampleError]:
    """The items of the chosen categories (``category_name`` matching; a line too broken
    to have one is kept, so its error is still shown), then the first ``limit``."""
    if categories:
        wanted = {category_name(c) for c in categories}
        items = [it for it in items if it.group is None or category_name(it.group) in wanted]
    return items[:limit] if limit is not None else items


def unknown_categories(items, categories: list[str]) -> list[str]:
    """The --categories that no sample of the file has."""
    have = {category_name(it.group) for it in items if it.group is not None}
    return [c for c in categories if category_name(c) not in have]


def groups(items) -> list[str]:
    """The file's categories, in order of first appearance."""
    return list(dict.fromkeys(it.group for it in items if it.group is not None))


__all__ = ["BenchSample", "SampleError", "UNCATEGORISED", "category_name", "groups",
           "read_bench_file", "select", "unknown_categories"]
