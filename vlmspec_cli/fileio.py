"""Floor 1 of the package: how vlmspec writes whole files and tells files apart.

Every writer (the JSONL sink, profiles, recipe state, PNG images and charts) goes through
this module, so each rule is stated once:

- :func:`atomic_write_bytes` / :func:`atomic_write_text`: a temp file in the same directory
  + fsync + ``os.replace`` + fsync of the directory, so a file is whole or absent; a
  symbolic link is followed (the link stays a link); a non-regular target such as
  ``/dev/stdout`` is written as a stream.
- :func:`write_new`: the same, but without ``force`` an existing name is never replaced
  (the check and the rename are one step).
- :func:`same_file`: one file under two names (relative paths and links resolved, or the
  same inode).

It imports nothing from vlmspec_cli (tests/test_structure.py keeps it so).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_dir", "same_file", "write_all",
           "write_new"]


def same_file(a: str | os.PathLike, b: str | os.PathLike,
              a_stat: os.stat_result | None = None) -> bool:
    """One file under two names: the same resolved path, or (both existing) the same
    device and inode. ``a_stat``: ``os.stat(a)`` when the caller compares ``a`` with many
    names and has it already."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        st_a = a_stat if a_stat is not None else os.stat(a)
        st_b = os.stat(b)
    except OSError:
        return False
    return (st_a.st_dev, st_a.st_ino) == (st_b.st_dev, st_b.st_ino)


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


def write_new(path: Path, data: bytes, force: bool) -> None:
    """Write ``data`` to ``path`` atomically; without ``force`` never replace a file that
    exists (os.link refuses an existing name; the check and the rename are one step). With
    ``force``, atomic_write_bytes: a symbolic link is followed (the file it points to is
    replaced, the link stays) and the replaced file's permission bits are kept (this wrote
    its own temp file and renamed it over the name: a profile at 0640 came back 0644, and a
    link became a file while its target stayed stale)."""
    if force:
        atomic_write_bytes(path, data)
        return
    path = Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:          # no hard links here: check, then rename
            if path.exists():
                raise FileExistsError(str(path)) from None
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)
