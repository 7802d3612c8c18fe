"""JSONL result records: atomic per-record appends, crash repair and resume.

Each record is one line of JSON written with a single ``os.write`` on an
``O_APPEND`` descriptor followed by ``fsync``; a crash can therefore leave at
most one partial line, at the end of the file.  :meth:`JsonlSink.done_keys`
drops such a tail (rewriting the file atomically) and returns the keys of the
records that succeeded, so a rerun skips them and retries only failures.

Whole-file outputs elsewhere use :func:`atomic_write_bytes` /
:func:`atomic_write_text` (temp file in the same directory + fsync +
``os.replace``).

This module knows nothing about the UI (no click/rich imports).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any

__all__ = [
    "record_key",
    "JsonlSink",
    "atomic_write_bytes",
    "atomic_write_text",
]

_PREVIEW = 80


def record_key(record: dict) -> tuple:
    """Identity of a record for resume: ``(task, input, prompt)``."""
    return (record["task"], record["input"], record.get("prompt"))


# --------------------------------------------------------------------------
# atomic whole-file writes
# --------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)  # EINTR is retried by Python (PEP 475)
        if n <= 0:
            raise OSError(f"os.write wrote {n} bytes")
        view = view[n:]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically.

    Writes a temp file in the same directory (so ``os.replace`` is a rename
    on one filesystem), fsyncs it, renames it over the target and fsyncs the
    directory.  Readers see the old or the new content, never a mix.  The
    temp file is removed on failure.  An existing target's permission bits
    are kept; a new file gets the usual ``0o666 & ~umask``.  Parent
    directories are created.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            _write_all(fd, bytes(data))
            try:
                mode = os.stat(path).st_mode & 0o7777
            except OSError:
                mode = None
            if mode is not None and hasattr(os, "fchmod"):
                os.fchmod(fd, mode)
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
    _fsync_dir(parent)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """:func:`atomic_write_bytes` for text (no newline translation)."""
    atomic_write_bytes(path, text.encode(encoding))


# --------------------------------------------------------------------------
# JSONL sink
# --------------------------------------------------------------------------


def _preview(raw: bytes) -> str:
    s = raw.decode("utf-8", errors="replace")
    return s if len(s) <= _PREVIEW else s[:_PREVIEW] + "..."


def _parse_line(raw: bytes) -> Any:
    """Parsed JSON value of one line; raises ``ValueError`` when invalid."""
    return json.loads(raw.decode("utf-8"))  # UnicodeDecodeError is a ValueError


class JsonlSink:
    """Append-only JSONL results file with resume support.

    ``warnings`` collects human-readable notes about problems found while
    reading an existing file (dropped partial tail, skipped invalid lines);
    it is never fatal.  ``repaired`` is True once a partial tail was removed.

    Usage::

        with JsonlSink("out.jsonl") as sink:
            done = sink.done_keys()
            for rec in work:
                if record_key(rec) not in done:
                    sink.append(rec)
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.warnings: list[str] = []
        self.repaired = False
        self._fd: int | None = None
        self._lock = threading.Lock()

    # -- reading / resume -------------------------------------------------

    def _scan(self) -> set[tuple]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return set()
        if not data:
            return set()

        name = str(self.path)
        # Split on b"\n" only: str.splitlines() would also split on U+2028 etc.
        # which json.dumps(ensure_ascii=False) leaves raw inside strings.
        starts: list[int] = []
        lines: list[bytes] = []
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            end = len(data) if nl < 0 else nl
            starts.append(pos)
            lines.append(data[pos:end])
            pos = end + 1

        # A trailing partial line: no final newline, or the last non-blank
        # line is not valid JSON (crash mid-write).  Drop it from the file.
        cut: int | None = None
        last = len(lines) - 1
        while last >= 0 and not lines[last].strip():
            last -= 1
        if last >= 0:
            tail_unterminated = not data.endswith(b"\n")
            tail_invalid = False
            try:
                _parse_line(lines[last])
            except ValueError:
                tail_invalid = True
            if tail_unterminated or tail_invalid:
                cut = starts[last]
                dropped = data[cut:]
                why = "no final newline" if tail_unterminated else "invalid JSON"
                self.warnings.append(
                    f"{name}: dropped partial last line ({len(dropped)} bytes, {why}; "
                    f"interrupted write?): {_preview(dropped.rstrip())!r}"
                )
                lines = lines[:last]
                atomic_write_bytes(self.path, data[:cut])
                self.repaired = True

        done: set[tuple] = set()
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                rec = _parse_line(raw)
            except ValueError as e:
                self.warnings.append(
                    f"{name}:{lineno}: skipped invalid JSON line ({e}): {_preview(raw)!r}"
                )
                continue
            if not isinstance(rec, dict):
                self.warnings.append(f"{name}:{lineno}: skipped line that is not a JSON object")
                continue
            try:
                key = record_key(rec)
                hash(key)
            except (KeyError, TypeError):
                self.warnings.append(
                    f"{name}:{lineno}: skipped record without usable task/input/prompt"
                )
                continue
            if rec.get("error") is None:
                done.add(key)
        return done

    def done_keys(self) -> set[tuple]:
        """Keys of successful records already in the file (``error`` is None).

        Failed records are not counted, so their inputs are retried on rerun.
        Repairs a trailing partial line as a side effect; see ``warnings``.
        """
        with self._lock:
            return self._scan()

    # -- writing ------------------------------------------------------------

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Never append onto a partial line left by a crash: the new record
        # would be glued to it and lost.  Repair the tail first.
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size:
            with open(self.path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    self._scan()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(self.path, flags, 0o666)
        return self._fd

    def append(self, record: dict) -> None:
        """Append one record as one line, durably (write + fsync).

        Serialization happens before anything is written, so a record that
        cannot be serialized raises without touching the file.
        """
        line = json.dumps(record, ensure_ascii=False) + "\n"
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates (e.g. undecodable bytes in a filename via
            # surrogateescape) cannot be UTF-8 encoded; \u-escape them instead
            # so the record still round-trips through json.loads.
            data = (json.dumps(record, ensure_ascii=True) + "\n").encode("ascii")
        with self._lock:
            fd = self._open()
            _write_all(fd, data)
            os.fsync(fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def __enter__(self) -> "JsonlSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"
