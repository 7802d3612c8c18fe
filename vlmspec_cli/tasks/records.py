"""JSONL result records: their resume key, recognising a vlmspec JSONL file, and atomic
whole-file writes.

A record is one line of JSON: an object with at least ``task`` and ``input`` (the input
as the user spelled it). Records written since resume became path- and settings-aware
also carry ``source`` (the input's resolved path) and ``settings`` (everything besides
the input and prompt that changes the output); :func:`record_key` is built from those,
so ``d/x.png``, ``./d/x.png`` and ``$PWD/d/x.png`` are one input, and a run with another
model or token limit does not count as done. Older records without them stay readable
and simply never match.

:func:`scan_jsonl` decides whether bytes are a vlmspec JSONL file (every complete line
a record) and where a torn last record (a crash mid-write) starts; the sink
(tasks/sink.py) opens, locks and repairs files with it.

Whole-file outputs use :func:`atomic_write_bytes` / :func:`atomic_write_text` (temp file
in the same directory + fsync + ``os.replace``; a symbolic link is followed, so the link
stays a link; a non-regular target such as ``/dev/stdout`` is written as a stream).

This module knows nothing about the UI (no click/rich imports).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RECORD_KEYS",
    "record_key",
    "scan_jsonl",
    "JsonlScan",
    "fsync_dir",
    "write_all",
    "atomic_write_bytes",
    "atomic_write_text",
]

# the keys every vlmspec result record has; base records write "input" first
RECORD_KEYS = ("task", "input")


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


@dataclass
class JsonlScan:
    """What :func:`scan_jsonl` found. ``foreign``: why the file is not a vlmspec JSONL
    (None when it is); ``tail_at``: offset of a torn last record to drop; ``unterminated``:
    the last record is complete but lacks its newline (it is kept)."""

    records: list[dict] = field(default_factory=list)
    foreign: str | None = None
    tail_at: int | None = None
    unterminated: bool = False


def _parse_object(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))  # UnicodeDecodeError is a ValueError
    except ValueError:
        return ValueError


def _why_not(value: Any, required: tuple[str, ...]) -> str | None:
    if value is ValueError:
        return "not JSON"
    if not isinstance(value, dict):
        return "not a JSON object"
    missing = [k for k in required if k not in value]
    return f"a JSON object without {' and '.join(map(repr, missing))}" if missing else None


def _torn_start(raw: bytes, first_key: str, have_records: bool) -> bool:
    """Whether a last line looks like the start of a record cut by a crash: an opening
    brace after earlier records, or the very beginning of a first record."""
    if not raw.startswith(b"{"):
        return False
    if have_records:
        return True
    start = b'{"' + first_key.encode() + b'": '
    return raw.startswith(start) or start.startswith(raw)


def scan_jsonl(data: bytes, required: tuple[str, ...] = RECORD_KEYS,
               first_key: str = "input") -> JsonlScan:
    """Classify a JSONL file's bytes. Blank lines are allowed; every other complete line
    must be a JSON object with the ``required`` keys. The last line may be a torn record
    (see :func:`_torn_start`) -- anything else makes the file ``foreign``."""
    scan = JsonlScan()
    pos, lineno = 0, 0
    while pos < len(data):
        lineno += 1
        nl = data.find(b"\n", pos)  # b"\n" only: json.dumps leaves U+2028 raw
        end = len(data) if nl < 0 else nl
        raw, start, pos = data[pos:end], pos, end + 1
        if not raw.strip():
            continue
        value = _parse_object(raw)
        why = _why_not(value, required)
        if why is None:
            scan.records.append(value)
            scan.unterminated = nl < 0
            continue
        last = pos >= len(data)
        if last and value is ValueError and _torn_start(raw, first_key, bool(scan.records)):
            scan.tail_at = start
        else:
            scan.foreign = f"line {lineno} is {why}"
        break
    if scan.foreign is None and not scan.records and scan.tail_at is None and data:
        scan.foreign = "it holds only blank lines"
    return scan


def quick_foreign(head: bytes, required: tuple[str, ...] = RECORD_KEYS) -> str | None:
    """Why a file is foreign, judged from its first bytes alone (so a large video or image
    is refused without reading all of it); None when its first line may be a record."""
    first = head.split(b"\n", 1)[0]
    if not first.strip() or first.lstrip().startswith(b"{"):
        return None  # decided by scan_jsonl on the whole file
    return f"line 1 is {_why_not(_parse_object(first), required)}"


# --------------------------------------------------------------------------
# atomic whole-file writes
# --------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)  # EINTR is retried by Python (PEP 475)
        if n <= 0:
            raise OSError(f"os.write wrote {n} bytes")
        view = view[n:]


def _write_stream(path: Path, data: bytes) -> None:
    """Write to a non-regular file (a pipe, a terminal, /dev/null): no temp, no rename."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically.

    Writes a temp file in the same directory (so ``os.replace`` is a rename
    on one filesystem), fsyncs it, renames it over the target and fsyncs the
    directory.  Readers see the old or the new content, never a mix.  The
    temp file is removed on failure.  An existing target's permission bits
    are kept; a new file gets the usual ``0o666 & ~umask``.  Parent
    directories are created.  A symbolic link is followed (the file it points
    to is replaced, the link stays); an existing non-regular target (a pipe,
    ``/dev/stdout``) is written to directly and a directory raises
    ``IsADirectoryError``.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_stream(path, bytes(data))
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            write_all(fd, bytes(data))
            if st is not None and hasattr(os, "fchmod"):
                os.fchmod(fd, st.st_mode & 0o7777)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(parent)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """:func:`atomic_write_bytes` for text (no newline translation)."""
    atomic_write_bytes(path, text.encode(encoding))
