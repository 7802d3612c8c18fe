"""Input expansion and robust image loading for batch tasks.

Principle: bad input never loses work.  Expansion never raises for a bad
path; it returns an :class:`InputItem` carrying an ``error`` so the batch can
record one clear reason and go on.  :func:`load_image` raises a single
:class:`InputError` whose ``str()`` names the file and the reason.

This module knows nothing about the UI (no click/rich imports).
"""

from __future__ import annotations

import errno
import glob
import io
import os
import stat
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, TextIO

from PIL import Image, ImageFile

from vlmspec_cli.tasks.image_header import (REASON_TEXT, REASON_TOO_LARGE, REASON_TRUNCATED,
                                            REASON_UNRECOGNIZED, HeaderReader, ImageRefused,
                                            decode_pixels, dimension_problem, header_problem,
                                            open_header, upright_rgb)
from vlmspec_cli.tasks.text_lists import MAX_PATH_LINE, ListTooLong, bounded_lines, sniff_stdin

__all__ = [
    "IMAGE_EXTENSIONS",
    "InputItem",
    "InputError",
    "expand_inputs",
    "load_image",
    "check_image_size",
    "size_text",
    "name_problem",
    "shown_name",
    "utf8_name",
    "MAX_IMAGE_BYTES",
    "REASON_MISSING",
    "REASON_EMPTY_PATH",
    "REASON_BROKEN_LINK",
    "REASON_IS_DIR",
    "REASON_PERMISSION",
    "REASON_EMPTY",
    "REASON_TEXT",
    "REASON_UNRECOGNIZED",
    "REASON_TRUNCATED",
    "REASON_TOO_LARGE",
    "REASON_NOT_REGULAR",
    "REASON_NO_MATCH",
    "REASON_EMPTY_DIR",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")

# Reason strings (stable: tests and downstream summaries match on them).
REASON_MISSING = "no such file or directory"
REASON_EMPTY_PATH = "an empty path names no file"
REASON_BROKEN_LINK = "no such file or directory (broken symbolic link)"
REASON_IS_DIR = "is a directory"
REASON_PERMISSION = "permission denied"
REASON_EMPTY = "empty file (0 bytes)"
REASON_NOT_REGULAR = "not a regular file"
REASON_NO_MATCH = "no files match this pattern"
REASON_EMPTY_DIR = "directory holds no image files"
REASON_NUL = "not a file name (it holds a NUL byte)"
REASON_NOT_UNICODE = "not a file name (it holds a lone surrogate, not text)"
STDIN = "-"

_GLOB_CHARS = frozenset("*?[")


# --------------------------------------------------------------------------
# data types
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class InputItem:
    """One input of a batch.

    ``path`` is the user-facing name exactly as it appears in records: as
    given for explicitly named files, ``os.path.join(dir, relpath)`` for
    directory members (e.g. ``"shots/a.png"``), the match as returned by
    :func:`glob.glob` for glob members, and the pattern itself for a glob that
    matched nothing.  ``error`` is set when the item is known bad already at
    expansion time (missing path, dangling symlink, no-match glob, ...).
    """

    path: str
    error: str | None = None
    data: bytes | None = field(default=None, repr=False, compare=False)  # an image on stdin

    @property
    def ok(self) -> bool:
        return self.error is None


class InputError(Exception):
    """A single input could not be used; ``str()`` is ``"<path>: <reason>"``."""

    def __init__(self, path: str, reason: str):
        super().__init__(path, reason)  # keeps the exception picklable
        self.path = str(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path or repr('')}: {self.reason}"   # '': a --var left empty


# --------------------------------------------------------------------------
# expansion
# --------------------------------------------------------------------------


def name_problem(path: str) -> str | None:
    """Why ``path`` can name no file (a NUL byte, a character the file system encoding
    cannot hold), or None. Undecodable bytes of a real name (surrogateescape) are fine."""
    if "\0" in path:
        return REASON_NUL
    try:
        os.fsencode(path)
    except UnicodeError:
        return REASON_NOT_UNICODE
    return None


def shown_name(path: str) -> str:
    """``path`` as messages and records show it: a NUL as ``\\0``, a lone surrogate that
    no file name can hold as ``\\udXXX`` (undecodable bytes of real names stay as they
    are: the records keep them)."""
    if name_problem(path) is None:
        return path
    return path.replace("\0", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def utf8_name(name: str) -> str:
    """A file name as records show it: its bytes decoded as UTF-8 whatever the locale (under
    LC_ALL=C "café.png" is "caf\\udcc3\\udca9.png" to Python; bytes that are not UTF-8 stay
    surrogate escapes, as in a UTF-8 locale), so records and resume keys do not depend on
    the locale."""
    try:
        return os.fsencode(name).decode("utf-8", "surrogateescape")
    except UnicodeError:
        return name


def _checked_name(item: InputItem) -> InputItem:
    problem = name_problem(item.path)
    return item if problem is None else InputItem(shown_name(item.path), problem)


def _stdin_items(stream, exts: tuple[str, ...], image_ok: bool) -> Iterable[InputItem]:
    """The items ``-`` stands for: one image (its bytes on stdin), or a path per line
    (read bounded: text_lists.py); an error item for what cannot be read."""
    if stream is None:   # started with stdin closed (``<&-``): Python gives no stream
        yield InputItem(STDIN, "stdin is closed: there is nothing to read for '-'")
        return
    kind, value = sniff_stdin(stream, MAX_IMAGE_BYTES if image_ok else None)
    if kind == "image":
        yield InputItem(STDIN, data=value)
        return
    if kind == "error":
        yield InputItem(STDIN, value)
        return
    try:
        previous = None
        for n, raw, problem in bounded_lines(value, MAX_PATH_LINE):
            if problem is not None:
                yield InputItem(f"{STDIN}:{n}", problem)
                continue
            if raw == previous:   # the same path again (``yes |``): dropped as a duplicate
                continue          # would be, without a stat for each
            previous = raw
            line = os.fsdecode(raw).strip()   # undecodable bytes kept: the name's own
            if not line or line.startswith("#"):
                continue
            if line == STDIN:
                yield InputItem(STDIN, "'-' (stdin) cannot be listed inside a stdin list")
                continue
            yield from _expand_one(line, exts)
    except ListTooLong as exc:
        yield InputItem(STDIN, f"stdin: {exc}")
    except OSError as exc:
        yield InputItem(STDIN, f"cannot read stdin ({exc.strerror or exc})")


def _has_ext(name: str, exts: tuple[str, ...]) -> bool:
    return name.lower().endswith(exts)


def _norm_key(path: str) -> str:
    return os.path.normcase(os.path.abspath(path))


def _is_glob(arg: str) -> bool:
    return any(c in _GLOB_CHARS for c in arg)


def _classify_member(path: str) -> str | None:
    """Expansion-time check of a directory/glob member; ``None`` when usable."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return REASON_BROKEN_LINK if os.path.islink(path) else REASON_MISSING
    except PermissionError:
        return REASON_PERMISSION
    except OSError as e:
        return f"cannot access ({e.strerror or e})"
    if stat.S_ISDIR(st.st_mode):
        return REASON_IS_DIR
    if not stat.S_ISREG(st.st_mode):
        return REASON_NOT_REGULAR
    if not os.access(path, os.R_OK):  # always true for root; see tests/corpus.py
        return REASON_PERMISSION
    return None


def _walk_dir(top: str, exts: tuple[str, ...]) -> list[InputItem]:
    """Recursive listing of ``top``: image-extension files, hidden entries skipped.

    Directories (including symlinked ones and ones whose *name* has an image
    extension, e.g. ``folder.png/``) are always descended into and never become
    items themselves.  Symlink cycles are cut by tracking (dev, inode).  A
    member with an image extension that is a dangling symlink / not a regular
    file / unreadable becomes an error item; a subdirectory that cannot be
    listed also becomes an error item (so the loss is visible).  The result is
    sorted by path string.
    """
    items: list[InputItem] = []
    seen_dirs: set[tuple[int, int]] = set()

    def visit(d: str) -> None:
        try:
            st = os.stat(d)
        except OSError as e:
            items.append(InputItem(d, _os_reason(e)))
            return
        ident = (st.st_dev, st.st_ino)
        if ident in seen_dirs:
            return
        seen_dirs.add(ident)
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except PermissionError:
            items.append(InputItem(d, f"{REASON_PERMISSION} (cannot list directory)"))
            return
        except OSError as e:
            items.append(InputItem(d, f"cannot list directory ({e.strerror or e})"))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = os.path.join(d, entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if is_dir:
                visit(child)
                continue
            if not _has_ext(entry.name, exts):
                continue
            items.append(InputItem(child, _classify_member(child)))

    visit(top)
    items.sort(key=lambda it: it.path)
    return items


def _expand_glob(pattern: str, exts: tuple[str, ...]) -> list[InputItem]:
    """Glob members are filtered like directory members.

    Files are kept when they have an image extension, or when they end with
    the literal extension written in the pattern (``"scans/*.dat"`` keeps
    ``.dat`` files: the user asked for them).  Matched directories are skipped
    (use ``**`` to recurse).  Hidden files are skipped by :mod:`glob` itself
    unless the pattern names them explicitly.
    """
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
        return [InputItem(pattern, REASON_NO_MATCH)]
    lit_ext = os.path.splitext(os.path.basename(pattern))[1]
    allowed = exts
    if lit_ext and not _is_glob(lit_ext):
        allowed = tuple(exts) + (lit_ext.lower(),)
    items: list[InputItem] = []
    skipped = 0
    for m in matches:
        if os.path.isdir(m):
            continue
        if not _has_ext(os.path.basename(m), allowed):
            skipped += 1
            continue
        items.append(InputItem(m, _classify_member(m)))
    if not items:
        reason = REASON_NO_MATCH
        if skipped:
            reason = f"no image files match this pattern ({skipped} non-image matches skipped)"
        return [InputItem(pattern, reason)]
    return items


def _expand_one(arg: str, exts: tuple[str, ...]) -> list[InputItem]:
    if name_problem(arg):
        return [InputItem(arg, name_problem(arg))]
    if os.path.isdir(arg):
        top = arg.rstrip("/\\" if os.sep == "\\" else "/") or arg
        # a directory named on the command line that yields nothing is worth a line
        return _walk_dir(top, exts) or [InputItem(top, REASON_EMPTY_DIR)]
    try:
        os.stat(arg)
    except FileNotFoundError:
        if os.path.lexists(arg):   # dangling symlink named explicitly
            return [InputItem(arg, REASON_BROKEN_LINK)]
        return _expand_glob(arg, exts) if _is_glob(arg) else [InputItem(arg, REASON_MISSING)]
    except OSError as e:   # a symlink loop, a folder that cannot be searched: said so,
        return [InputItem(arg, _os_reason(e))]   # not "no such file or directory"
    # Explicitly named file: kept whatever its extension; load_image
    # reports precisely what is wrong with it (empty, text, fifo, ...).
    return [InputItem(arg)]


def expand_inputs(
    args: Sequence[str],
    stdin: TextIO | None = None,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
    stdin_image: bool = False,
) -> list[InputItem]:
    """Expand CLI arguments into an ordered, de-duplicated list of inputs.

    Each arg is a file, a directory (recursive), a glob pattern (only when it
    is not an existing path) or ``"-"`` (read paths from ``stdin``, default
    ``sys.stdin``; read at most once, a later ``"-"`` adds nothing; a ``"-"``
    line inside the stdin list becomes an error item; read as a bounded stream, and with
    ``stdin_image`` an image's bytes on stdin are one item, ``"-"``, holding them).
    Never raises for bad paths: they come back as items with ``error`` set (a name with
    a NUL byte too, shown with ``\\0``).  Duplicates (same absolute normalized path)
    are dropped, keeping the first occurrence.
    """
    exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
    out: list[InputItem] = []
    seen: set[str] = set()
    stdin_read = False

    def add(items: Iterable[InputItem]) -> None:
        for it in map(_checked_name, items):
            key = "-stdin-" if it.data is not None else _norm_key(it.path)
            if key in seen:
                continue
            seen.add(key)
            out.append(it)

    for arg in args:
        arg = os.fspath(arg)
        if arg == "-":
            if stdin_read:
                continue
            stdin_read = True
            add(_stdin_items(stdin if stdin is not None else sys.stdin, exts, stdin_image))
            continue
        if arg == "":
            add([InputItem(arg, REASON_EMPTY_PATH)])
            continue
        add(_expand_one(arg, exts))
    return out


# --------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------

_SNIFF_BYTES = 4096

# An image file larger than this is refused before any of it is read (a constant, not a
# profile key). 256 MiB holds an uncompressed 85 M-pixel RGB (64 M-pixel RGBA) image;
# PIL refuses images past ~179 M pixels anyway, and a model sees a few hundred thousand.
MAX_IMAGE_BYTES = 256 * 1024 ** 2


def _os_reason(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return REASON_MISSING
    if isinstance(e, IsADirectoryError):
        return REASON_IS_DIR
    if isinstance(e, PermissionError):
        return REASON_PERMISSION
    if e.errno == errno.ENOTDIR:
        return f"{REASON_MISSING} (a parent path is not a directory)"
    return f"cannot read file ({(e.strerror or str(e)).lower()})"


def stat_regular(path: str) -> os.stat_result:
    """``os.stat`` of a regular, non-empty file; InputError naming why not otherwise."""
    if name_problem(path):
        raise InputError(shown_name(path), name_problem(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, REASON_BROKEN_LINK if os.path.islink(path) else REASON_MISSING) from None
    except OSError as e:
        raise InputError(path, _os_reason(e)) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(path, REASON_IS_DIR)
    if not stat.S_ISREG(st.st_mode):  # fifo/socket/device: opening could block
        raise InputError(path, REASON_NOT_REGULAR)
    if st.st_size == 0:
        raise InputError(path, REASON_EMPTY)
    return st


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def check_image_size(path: str, size: int, max_bytes: int = MAX_IMAGE_BYTES) -> None:
    """InputError when a file of ``size`` bytes is too big to be an image input (its
    bytes are never read)."""
    if size > max_bytes:
        raise InputError(path, f"{REASON_TOO_LARGE} (the file is {size_text(size)}, more than "
                               f"the {size_text(max_bytes)} an image file may be; not read)")


def read_regular_file(path: str, check_head: Callable[[bytes], str | None] | None = None) -> bytes:
    """The bytes of a regular, non-empty file; InputError naming why not otherwise.
    ``check_head``: the reason to reject the file from its first bytes, or None; the
    rest is read only when it returns None."""
    stat_regular(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(_SNIFF_BYTES)
            reason = check_head(data) if check_head is not None and data else None
            if reason:
                raise InputError(path, reason)
            data += fh.read()
    except OSError as e:
        raise InputError(path, _os_reason(e)) from None
    if not data:  # emptied between stat and read
        raise InputError(path, REASON_EMPTY)
    return data


def load_image(path: str, max_bytes: int = MAX_IMAGE_BYTES, data: bytes | None = None) -> Image.Image:
    """Fully decode ``path`` (or, given ``data``, those bytes, named ``path``: an image
    read from stdin) into an RGB image or raise :class:`InputError`.

    A file larger than ``max_bytes`` is refused unread. Otherwise the header is checked
    from the first bytes, PIL identifies the file reading at most a header budget
    (image_header.py), the width and height it declares are checked (a pixel limit and
    an aspect-ratio limit: image_header.dimension_problem), and only then is the rest
    read, for the pixels: a 200 MB non-image is rejected after a few KB or MB, a
    200-byte PNG declaring 12,000 x 12,000 pixels is never decoded. No file handle
    outlives the call.
    The image is fully decoded with ``.load()`` and converted to RGB. EXIF orientation
    is applied (best effort). Animated images yield their first frame.
    """
    path = os.fspath(path)
    check_image_size(path, stat_regular(path).st_size if data is None else len(data), max_bytes)

    # Our contract: truncated images fail.  Something else in the process may
    # have flipped this global; the loader relies on it being False.
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        ImageFile.LOAD_TRUNCATED_IMAGES = False

    try:
        with open(path, "rb") if data is None else io.BytesIO(data) as fh:
            head = fh.read(_SNIFF_BYTES)
            if not head:  # emptied between stat and read
                raise InputError(path, REASON_EMPTY)
            problem = header_problem(head)
            if problem:
                raise InputError(path, f"{REASON_TRUNCATED} ({problem})")
            fh.seek(0)
            reader = HeaderReader(fh)
            im = open_header(reader, head)
            problem = dimension_problem(*im.size)
            if problem:
                raise InputError(path, problem)
            reader.lift()
            decode_pixels(im)
            return upright_rgb(im)
    except ImageRefused as e:
        raise InputError(path, str(e)) from None
    except OSError as e:  # open / read errors (PIL's own are ImageRefused by now)
        raise InputError(path, _os_reason(e)) from None
