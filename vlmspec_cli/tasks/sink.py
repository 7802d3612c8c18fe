"""The JSONL output of a batch (``--out``, ``--trace``, Ray shards): checked, locked,
repaired and appended to without ever losing a byte.

:func:`open_outputs` runs before any model loads. It refuses (raising
:class:`OutputError`, whose message is the one line to show) an output that names an
input, a directory, a file vlmspec cannot create or open for appending, a file another
vlmspec run is writing (an advisory ``flock`` held until the sink is closed), and any
existing file that is not recognisably vlmspec's own JSONL (records.scan_fd, which reads
it as a stream of lines; only the resume keys are kept): vlmspec appends to and repairs
only its own files.

Each record is one line written with one ``os.write`` on an ``O_APPEND`` descriptor, then
``fsync``; a failed or interrupted write is truncated back to the size before it, so the
file never holds a torn record from this run. A torn last record left by a crash (an
unterminated start of a record, or zero bytes after the last record: a filesystem that
grew the file but lost the data) is repaired in place when the sink opens: the torn bytes
are first saved to
``FILE.torn-YYYYmmddTHHMMSS`` (fsynced, never overwriting an existing copy), then the
file is truncated -- the same inode, so the lock stays valid and a symbolic link stays a
link. A non-regular output (``/dev/null``, a pipe) is a write-only stream: no scan, no
repair, no lock, no fsync.

No click or rich here.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from vlmspec_cli.fileio import fsync_dir, same_file, write_all
from vlmspec_cli.tasks.records import RECORD_KEYS, quick_foreign, record_key, scan_fd

try:
    import fcntl
except ImportError:  # not POSIX: no advisory lock
    fcntl = None

__all__ = ["OutputError", "LineKind", "RESULTS", "TRACE", "JsonlSink", "read_records",
           "open_outputs", "check_not_an_input"]

_HEAD = 64 * 1024
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)}


class OutputError(Exception):
    """An output vlmspec must not or cannot write; ``str()`` is the one line to show
    (naming the file and the reason)."""


@dataclass(frozen=True)
class LineKind:
    """What a sink's lines are: the keys every line has, the key written first (a torn
    first line is recognised by it), and whether lines are resumable records."""

    noun: str
    required: tuple[str, ...]
    first_key: str
    keyed: bool


RESULTS = LineKind("results", RECORD_KEYS, "input", True)
TRACE = LineKind("trace", ("request", "block"), "request", False)


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _holds(fd: int, before: int | None, size: int) -> bool:
    """The file (a regular one, ``before`` bytes long before a write of ``size``) holds the
    whole write now."""
    if before is None:
        return False
    try:
        return os.fstat(fd).st_size == before + size
    except OSError:
        return False


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _FSYNC_UNSUPPORTED:
            raise


def _encode(record: dict) -> bytes:
    try:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (undecodable bytes in a filename via surrogateescape) cannot be
        # UTF-8 encoded; \u-escape them so the record still round-trips through json.loads.
        return (json.dumps(record, ensure_ascii=True) + "\n").encode("ascii")


class JsonlSink:
    """An append-only JSONL file with resume support.

    :meth:`open` (called by the first :meth:`done_keys` / :meth:`append` if not before)
    checks, locks and repairs the file and raises :class:`OutputError`; ``warnings`` then
    holds notes to show (a repair and where its copy went), ``repaired`` says whether a
    torn record was dropped, ``stream`` whether the output is not a regular file.
    ``written`` counts the records this sink appended. Usage::

        with JsonlSink("out.jsonl").open() as sink:
            done = sink.done_keys()
            for rec in work:
                if record_key(rec) not in done:
                    sink.append(rec)
    """

    def __init__(self, path: str | os.PathLike, kind: LineKind = RESULTS, durable: bool = True):
        self.path = Path(path)
        self.kind = kind
        self.durable = durable
        self.warnings: list[str] = []
        self.repaired = False
        self.stream = False
        self.written = 0
        self._fd: int | None = None
        self._done: set[tuple] = set()
        self._mutex = threading.Lock()

    # -- opening: check, lock, repair ---------------------------------------

    def open(self) -> "JsonlSink":
        """Open the file for appending (creating it and its folders), lock it, check that
        it is vlmspec's and repair a torn last record. Idempotent; raises OutputError."""
        with self._mutex:
            self._ensure_open()
        return self

    def _ensure_open(self) -> int:
        if self._fd is not None:
            return self._fd
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise OutputError(f"{self.path}: {_strerror(exc)}") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{self.path}: is a directory, not a file")
        self.stream = st is not None and not stat.S_ISREG(st.st_mode)
        flags = os.O_WRONLY if self.stream else os.O_RDWR | os.O_CREAT
        # a FIFO is opened without waiting: with no reader the open would block for ever
        fifo = st is not None and stat.S_ISFIFO(st.st_mode)
        try:
            if st is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = (_open_fifo(self.path, flags) if fifo else
                  os.open(self.path, flags | os.O_APPEND | _O_CLOEXEC, 0o666))
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot open it for writing: {_strerror(exc)}") from None
        if fifo:   # writes wait for the reader as a pipe's do
            os.set_blocking(fd, True)
        if not self.stream:
            try:
                self._lock(fd)
                self._check_and_repair(fd)
            except OSError as exc:  # reading it, or the repair's own writes
                os.close(fd)
                raise OutputError(f"{self.path}: cannot check or repair it: "
                                  f"{_strerror(exc)}") from None
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd
        return fd

    def _lock(self, fd: int) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"{self.path}: another vlmspec run is writing this file; wait "
                              "for it to finish or choose another file") from None
        except OSError as exc:  # e.g. a filesystem without locks
            self.warnings.append(f"{self.path}: could not lock it ({_strerror(exc)}); do not "
                                 "let two runs write it at once")

    def _foreign(self, why: str) -> OutputError:
        return OutputError(f"{self.path}: not a vlmspec {self.kind.noun} JSONL file ({why}); "
                           "vlmspec only appends to its own files: choose another file")

    def _check_and_repair(self, fd: int) -> None:
        why = quick_foreign(os.pread(fd, _HEAD, 0), self.kind.required)
        if why:
            raise self._foreign(why)
        done: set[tuple] = set()
        old = 0

        def index(rec: dict) -> None:  # only the resume keys are kept, not the records
            nonlocal old
            key = record_key(rec)
            old += key is None
            if key is not None and rec.get("error") is None:
                done.add(key)

        scan = scan_fd(fd, self.kind.required, self.kind.first_key,
                       index if self.kind.keyed else None)
        if scan.foreign:
            raise self._foreign(scan.foreign)
        if scan.tail_at is not None:
            size = os.fstat(fd).st_size
            self._drop_torn_tail(fd, os.pread(fd, size - scan.tail_at, scan.tail_at), scan.tail_at)
        elif scan.unterminated:
            write_all(fd, b"\n")
            _fsync(fd)
            self.warnings.append(f"{self.path}: added the missing newline after its last record")
        self._done = done
        if old:
            self.warnings.append(
                f"{self.path}: {old} record(s) have no source/settings (written by an "
                "older vlmspec): their inputs are decoded again")

    def _drop_torn_tail(self, fd: int, torn: bytes, at: int) -> None:
        """Save the torn bytes next to the real file, then truncate the file in place."""
        real = Path(os.path.realpath(self.path))
        stamp = time.strftime("%Y%m%dT%H%M%S")
        copy, n = real.with_name(f"{real.name}.torn-{stamp}"), 1
        while True:
            try:
                cfd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666)
                break
            except FileExistsError:
                n += 1
                copy = real.with_name(f"{real.name}.torn-{stamp}-{n}")
            except OSError as exc:
                raise OutputError(f"{self.path}: its last record is torn and a copy of it "
                                  f"could not be saved ({copy}: {_strerror(exc)}); nothing "
                                  "was changed") from None
        try:
            write_all(cfd, torn)
            os.fsync(cfd)
        except OSError as exc:
            os.close(cfd)
            os.unlink(copy)
            raise OutputError(f"{self.path}: its last record is torn and a copy of it could "
                              f"not be saved ({copy}: {_strerror(exc)}); nothing was changed"
                              ) from None
        os.close(cfd)
        fsync_dir(real.parent)
        os.ftruncate(fd, at)
        _fsync(fd)
        self.repaired = True
        what = (f"{len(torn)} zero bytes after its last record (left by a crash?)"
                if not torn.strip(b"\0") else
                f"a torn last record ({len(torn)} bytes, an interrupted write?)")
        self.warnings.append(f"{self.path}: dropped {what}; kept a copy in {copy}")

    # -- reading ---------------------------------------------------------------

    def done_keys(self) -> set[tuple]:
        """Keys of the successful records in the file (``error`` is None), including those
        appended since it opened. Failed records are not counted, so their inputs are
        retried; records of an older vlmspec match nothing."""
        with self._mutex:
            self._ensure_open()
            return set(self._done)

    def records(self) -> list[dict]:
        """Every record in the file now (none for a stream)."""
        with self._mutex:
            fd = self._ensure_open()
            if self.stream:
                return []
            return scan_fd(fd, self.kind.required, self.kind.first_key, collect=True).records

    # -- writing ---------------------------------------------------------------

    def append(self, record: dict) -> None:
        """Append one record as one line, durably (write + fsync). A record that cannot be
        serialized raises without touching the file; a failed or interrupted write is cut
        back (no torn record) and raises OutputError (or the interrupt). An interrupt that
        comes once the whole line is written (during the fsync) keeps it, counted."""
        data = _encode(record)
        with self._mutex:
            fd = self._ensure_open()
            before = None if self.stream else os.fstat(fd).st_size
            whole = False
            try:
                write_all(fd, data)
                whole = True
                if self.durable and not self.stream:
                    _fsync(fd)
            except BaseException as exc:
                if not isinstance(exc, OSError) and (whole or _holds(fd, before, len(data))):
                    # interrupted once the whole line was in the file (while syncing, or
                    # between write_all's last os.write and its return): a reader may have
                    # seen it; keep it and count it rather than cut it (a SIGTERM sent as
                    # soon as the line appeared once found the file cut back to no record)
                    self._count(record)
                    raise
                if before is not None:
                    try:
                        os.ftruncate(fd, before)
                    except OSError:
                        pass
                if isinstance(exc, OSError):
                    raise OutputError(
                        f"{self.path}: cannot write a record: {_strerror(exc)}; this run wrote "
                        f"{self.written} record(s) to it before, all kept") from None
                raise
            self._count(record)

    def _count(self, record: dict) -> None:
        self.written += 1
        if self.kind.keyed and record.get("error") is None:
            key = record_key(record)
            if key is not None:
                self._done.add(key)

    def close(self) -> None:
        """Close the file (releasing the lock); appending again reopens it."""
        with self._mutex:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "JsonlSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"


def read_records(path: str | os.PathLike, kind: LineKind = RESULTS) -> list[dict]:
    """The records of a vlmspec JSONL file, read only: no lock, a torn last record skipped
    (not repaired). Raises OutputError for a file that is not vlmspec's."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            scan = scan_fd(fd, kind.required, kind.first_key, collect=True)
        finally:
            os.close(fd)
    except OSError as exc:
        raise OutputError(f"{path}: cannot read it: {_strerror(exc)}") from None
    if scan.foreign:
        raise OutputError(f"{path}: not a vlmspec {kind.noun} JSONL file ({scan.foreign})")
    return scan.records


# --------------------------------------------------------------------------
# before the models load
# --------------------------------------------------------------------------


def _is_stream(path: str) -> bool:
    try:
        return not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path)
    except OSError:
        return False


FIFO_WAIT_S = 10.0   # how long a FIFO --out may wait for its reader to open it


def _open_fifo(path, flags: int) -> int:
    """A FIFO opened for writing without blocking for ever: a reader that is starting (``cat
    fifo &`` just before the run) has FIFO_WAIT_S to open it; with none, OutputError."""
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            return os.open(path, flags | os.O_APPEND | _O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                raise OutputError(f"{path}: a FIFO that no process reads (none opened it in "
                                  f"{FIFO_WAIT_S:.0f} s); start its reader first, or choose a "
                                  "file") from None
            time.sleep(0.05)


def check_not_an_input(out: str, inputs: Iterable[str], what: str = "an input") -> None:
    """Raise OutputError when ``out`` is one of ``inputs`` (by resolved path or inode);
    ``what`` names them in the message."""
    if _is_stream(out):
        return  # /dev/null, a pipe: writing it destroys nothing
    try:
        out_stat = os.stat(out)
    except OSError:
        out_stat = None
    for name in inputs:
        if same_file(out, name, out_stat):
            raise OutputError(f"{out}: is also {what} ({name}); vlmspec never writes to "
                              "its inputs: choose another output file")


def open_outputs(out: str | None, inputs: Iterable[str] = (), trace: str | None = None,
                 profile_files: Iterable[str] = (),
                 ) -> tuple[JsonlSink | None, JsonlSink | None]:
    """The results sink for ``out`` and the trace sink for ``trace`` (None where not
    given), checked (neither is one of ``inputs`` nor of the ``profile_files`` the run
    read its settings from), locked and repaired: call before loading any model and close
    them when the run ends. Raises OutputError with the line to show."""
    inputs, profile_files = list(inputs), list(profile_files)
    if out and trace and not _is_stream(out) and same_file(trace, out):
        raise OutputError(f"{trace}: --trace and --out name the same file; give each its own")
    opened: list[JsonlSink] = []
    try:
        for path, kind, durable in ((out, RESULTS, True), (trace, TRACE, False)):
            if path:
                check_not_an_input(path, profile_files, "the profile or a file it includes")
                check_not_an_input(path, inputs)
                opened.append(JsonlSink(path, kind, durable).open())
            else:
                opened.append(None)
    except BaseException:
        for sink in opened:
            if sink is not None:
                sink.close()
        raise
    return opened[0], opened[1]
