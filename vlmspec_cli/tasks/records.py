"""JSONL result records: their resume key and recognising a vlmspec JSONL file.

A record is one line of JSON: an object with at least ``task`` and ``input`` (the input
as the user spelled it). Records written since resume became path- and settings-aware
also carry ``source`` (the input's resolved path) and ``settings`` (everything besides
the input and prompt that changes the output); :func:`record_key` is built from those,
so ``d/x.png``, ``./d/x.png`` and ``$PWD/d/x.png`` are one input, and a run with another
model or token limit does not count as done. Older records without them stay readable
and simply never match.

:func:`scan_fd` (and :func:`scan_jsonl`, for bytes) decides whether a file is a vlmspec
JSONL file (every complete line a record) and where a torn last record (a crash
mid-write) starts, reading it as a stream of lines (a 150 MiB file costs a MiB, plus what
the caller keeps of each record); the sink (tasks/sink.py) opens, locks and repairs files
with it.

Whole-file writes (atomic, fsynced) live in vlmspec_cli/fileio.py.

This module knows nothing about the UI (no click/rich imports).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

__all__ = [
    "SCHEMA",
    "RECORD_KEYS",
    "record_key",
    "scan_jsonl",
    "scan_fd",
    "JsonlScan",
]

# the keys every vlmspec result record has; base records write "input" first
RECORD_KEYS = ("task", "input")

# the version of the result records' fields (README "Output record" lists them), written as
# "schema" in every caption, chat, video and image record. Records without it (written by
# vlmspec before it was versioned) are the same fields less "schema": read and resumed
# alike (record_key does not read it). Raise it when a field is renamed or changes meaning.
SCHEMA = 1


def record_key(record: dict) -> tuple | None:
    """Identity of a record for resume: ``(task, source, prompt, settings)``, or None for
    a record without ``source``/``settings`` (written by an older vlmspec: it is kept and
    read, but matches no input, so that input is decoded again)."""
    source, settings = record.get("source"), record.get("settings")
    if not isinstance(source, str) or not isinstance(settings, dict):
        return None
    return (record["task"], source, record.get("prompt"),
            json.dumps(settings, sort_keys=True, ensure_ascii=False))


# --------------------------------------------------------------------------
# recognising a vlmspec JSONL file
# --------------------------------------------------------------------------


MAX_LINE = 64 * 1024 ** 2   # a longer line is no record of vlmspec's (they are KiB)
MAX_DEPTH = 64              # nor one nested deeper (they nest 3 or 4 levels)
_CHUNK = 1024 ** 2
_DEEP = object()            # _parse_object: nested past json's recursion limit


@dataclass
class JsonlScan:
    """What :func:`scan_lines` found. ``foreign``: why the file is not a vlmspec JSONL
    (None when it is); ``tail_at``: offset of a torn last record to drop; ``unterminated``:
    the last record is complete but lacks its newline (it is kept); ``count``: the
    records; ``records``: the records themselves, when collected."""

    records: list[dict] = field(default_factory=list)
    foreign: str | None = None
    tail_at: int | None = None
    unterminated: bool = False
    count: int = 0


def iter_lines(read: Callable[[int, int], bytes]) -> Iterator[tuple[int, bytes | None, bool]]:
    """``(offset, line without its newline, terminated)`` for each line of a file read
    as ``read(offset, n)`` in 1 MiB pieces: memory holds one piece and one line, however
    large the file. A line past MAX_LINE ends the lines with ``(offset, None, False)``."""
    buf, base = bytearray(), 0          # base: the file offset of buf[0]
    while chunk := read(base + len(buf), _CHUNK):
        search, start = len(buf), 0
        buf += chunk
        while (nl := buf.find(b"\n", search)) >= 0:   # b"\n" only: json.dumps leaves U+2028 raw
            yield base + start, bytes(buf[start:nl]), True
            start = search = nl + 1
        del buf[:start]
        base += start
        if len(buf) > MAX_LINE:
            yield base, None, False
            return
    if buf:
        yield base, bytes(buf), False


def _parse_object(raw: bytes) -> Any:
    try:
        value = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError is a ValueError
    except ValueError:
        return ValueError
    except RecursionError:
        return _DEEP
    return _DEEP if _too_deep(value, raw) else value


def _too_deep(value: Any, raw: bytes) -> bool:
    """Whether ``value`` nests past MAX_DEPTH (walked without recursion, and only when
    ``raw`` holds that many brackets at all)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _why_not(value: Any, required: tuple[str, ...]) -> str | None:
    if value is ValueError:
        return "not JSON"
    if value is _DEEP:
        return f"JSON nested more than {MAX_DEPTH} levels deep"
    if not isinstance(value, dict):
        return "not a JSON object"
    missing = [k for k in required if k not in value]
    return f"a JSON object without {' and '.join(map(repr, missing))}" if missing else None


def _torn_tail(raw: bytes, first_key: str, have_records: bool) -> bool:
    """Whether an unterminated last line is what a crash leaves: the start of a record
    (an opening brace after earlier records, or the very beginning of a first record),
    possibly followed by zeros, or only zeros after complete records (a filesystem that
    grew the file but never wrote the data)."""
    body = raw.rstrip(b"\0")
    if not body:
        return have_records
    if not body.startswith(b"{"):
        return False
    if have_records:
        return True
    start = b'{"' + first_key.encode() + b'": '
    return body.startswith(start) or start.startswith(body)


def scan_lines(lines: Iterable[tuple[int, bytes | None, bool]], required: tuple[str, ...],
               first_key: str, on_record: Callable[[dict], None] | None = None) -> JsonlScan:
    """Classify a JSONL file from its :func:`iter_lines`. Blank lines are allowed; every
    other complete line must be a JSON object with the ``required`` keys (each is passed
    to ``on_record``). The last line may be a torn record (:func:`_torn_tail`), never
    one that ends in a newline: a crash cannot leave that. Anything else makes the
    file ``foreign``."""
    scan, seen = JsonlScan(), False
    for lineno, (start, raw, terminated) in enumerate(lines, 1):
        seen = True
        if raw is None:
            scan.foreign = f"line {lineno} is longer than {MAX_LINE // 1024 ** 2} MiB"
            break
        if not raw.strip():
            continue
        value = _parse_object(raw)
        why = _why_not(value, required)
        if why is None:
            scan.count += 1
            scan.unterminated = not terminated
            if on_record is not None:
                on_record(value)
            continue
        if not terminated and value is ValueError and _torn_tail(raw, first_key, scan.count > 0):
            scan.tail_at = start
        else:
            scan.foreign = f"line {lineno} is {why}"
        break
    if scan.foreign is None and not scan.count and scan.tail_at is None and seen:
        scan.foreign = "it holds only blank lines"
    return scan


def scan_fd(fd: int, required: tuple[str, ...] = RECORD_KEYS, first_key: str = "input",
            on_record: Callable[[dict], None] | None = None, collect: bool = False) -> JsonlScan:
    """:func:`scan_lines` over an open file, read as a stream (``collect``: keep the
    records in ``records``)."""
    lines = iter_lines(lambda pos, n: os.pread(fd, n, pos))
    if not collect:
        return scan_lines(lines, required, first_key, on_record)
    kept: list[dict] = []

    def keep(record: dict) -> None:
        kept.append(record)
        if on_record is not None:
            on_record(record)
    scan = scan_lines(lines, required, first_key, keep)
    scan.records = kept
    return scan


def scan_jsonl(data: bytes, required: tuple[str, ...] = RECORD_KEYS,
               first_key: str = "input") -> JsonlScan:
    """:func:`scan_lines` over bytes in memory, the records collected."""
    scan = scan_lines(iter_lines(lambda pos, n: data[pos:pos + n]), required, first_key,
                      (kept := []).append)
    scan.records = kept
    return scan


def quick_foreign(head: bytes, required: tuple[str, ...] = RECORD_KEYS) -> str | None:
    """Why a file is foreign, judged from its first bytes alone (so a large video or image
    is refused without reading all of it); None when its first line may be a record."""
    first = head.split(b"\n", 1)[0]
    if not first.strip() or first.lstrip().startswith(b"{"):
        return None  # decided by scan_lines on the whole file
    return f"line 1 is {_why_not(_parse_object(first), required)}"
