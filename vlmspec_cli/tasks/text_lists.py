"""List-like inputs read as bounded streams: the paths given on stdin (``-``), and the
prompts of ``generate-image --prompts-file``.

Whatever is behind the stream (``/dev/zero``, a 50 MB line, a FIFO, an image piped by
mistake), memory stays bounded: a line is read up to ``max_line`` bytes (a longer one is
skipped to its end in chunks and reported as that line's error), the whole list up to
``MAX_LIST_BYTES`` and ``MAX_LIST_LINES`` (:class:`ListTooLong` past either), and stdin is sniffed first: an image's
bytes (``cat img.png | vlmspec caption -``) are one image, read up to the image cap, and
other binary data is refused after its first 4 KiB. Lines come back as bytes; the callers
decode them (file names with ``os.fsdecode``, prompts as strict UTF-8). No click or rich.
"""

from __future__ import annotations

import io
import os
import stat
from typing import BinaryIO, Iterator

from vlmspec_cli.tasks.image_header import looks_like_image_magic

MiB = 1024 ** 2
MAX_LIST_BYTES = 64 * MiB        # a list of paths or prompts
MAX_LIST_LINES = 1_000_000       # ... and its lines (each one a stat at least: time)
MAX_PATH_LINE = 4096             # PATH_MAX on Linux
MAX_PROMPT_LINE = 1 * MiB        # one prompt line (still checked against the positions)
SNIFF_BYTES = 4096


class ListTooLong(Exception):
    """The list went past MAX_LIST_BYTES; ``str()`` says so. What came before is kept."""


class ListFileError(Exception):
    """A list file cannot be read at all (``str()``: the reason, without the name)."""


def bounded_lines(fh: BinaryIO, max_line: int, max_total: int = MAX_LIST_BYTES,
                  max_lines: int = MAX_LIST_LINES,
                  ) -> Iterator[tuple[int, bytes | None, str | None]]:
    """``(line number, line without its newline, None)`` for each line of the binary
    stream ``fh``, or ``(n, None, reason)`` for a line longer than ``max_line`` bytes
    (skipped to its end in 64 KiB chunks). Raises ListTooLong past ``max_total`` bytes or
    ``max_lines`` lines."""
    total, n = 0, 0
    too_long = f"more than {_size(max_total)} of lines; the rest is not read"
    while True:
        raw = fh.readline(max_line + 1)
        if not raw:
            return
        n += 1
        if n > max_lines:
            raise ListTooLong(f"more than {max_lines:,} lines; the rest is not read")
        total += len(raw)
        if total > max_total:
            raise ListTooLong(too_long)
        if len(raw) > max_line and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = fh.readline(64 * 1024)
                total += len(raw)
                if total > max_total:
                    raise ListTooLong(too_long)
            yield n, None, f"line {n} is longer than {_size(max_line)}; not read"
            continue
        yield n, raw[:-1] if raw.endswith(b"\n") else raw, None


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n:,} bytes"


class _Replay(io.RawIOBase):
    """A raw stream that gives ``head`` again, then the rest of ``fh``."""

    def __init__(self, head: bytes, fh) -> None:
        self._head, self._fh = head, fh

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            data, self._head = self._head[:len(buffer)], self._head[len(buffer):]
        else:
            read1 = getattr(self._fh, "read1", None)
            data = read1(len(buffer)) if read1 is not None else self._fh.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def binary_stream(stream) -> BinaryIO:
    """The bytes behind ``stream``: a text stream's ``buffer`` (sys.stdin), a binary
    stream itself, or the UTF-8 encoding of an in-memory text stream (tests)."""
    if isinstance(stream, io.BufferedIOBase):
        return stream
    if isinstance(stream, io.RawIOBase):   # readline() on a raw stream reads byte by byte
        return io.BufferedReader(stream, 64 * 1024)
    buffer = getattr(stream, "buffer", None)
    if isinstance(buffer, io.RawIOBase):
        return io.BufferedReader(buffer, 64 * 1024)
    if buffer is not None:
        return buffer
    if isinstance(stream, io.TextIOBase):
        return io.BytesIO(stream.read().encode("utf-8", "surrogateescape"))
    return io.BytesIO("".join(stream).encode("utf-8", "surrogateescape"))  # lines of text


def sniff_stdin(stream, max_image: int | None) -> tuple[str, object]:
    """What ``stream`` holds, from its first bytes: ``("image", bytes)`` (an image's
    signature: the whole stream, at most ``max_image`` bytes), ``("error", reason)`` (an
    image past that, or any image where ``max_image`` is None: not read further; binary
    data: see :func:`_binary`, from the first 4 KiB) or ``("lines", binary stream)`` to read with
    :func:`bounded_lines`."""
    fh = binary_stream(stream)
    head = fh.read(SNIFF_BYTES) or b""
    if looks_like_image_magic(head) and max_image is None:   # (an mp4's box looks alike)
        return "error", ("stdin holds a file's bytes (an image or a video), not a list of "
                         "paths: - reads newline-separated paths here (name the file instead)")
    if looks_like_image_magic(head):
        data = head + (fh.read(max_image + 1 - len(head)) or b"")
        if len(data) > max_image:
            return "error", (f"the image on stdin is more than {_size(max_image)}, the cap "
                             "for an image; not read further")
        return "image", data
    if _binary(head) and max_image is None:
        return "error", ("stdin holds binary data, not a list of paths: - reads "
                         "newline-separated paths here")
    if _binary(head):
        return "error", ("stdin holds binary data, not an image vlmspec recognises nor a "
                          "list of paths: - reads newline-separated paths (or one image's bytes)")
    return "lines", io.BufferedReader(_Replay(head, fh), 64 * 1024)


def _binary(head: bytes) -> bool:
    """Not a list of lines: NUL bytes with no line break, or many control bytes (random
    data has ~12 %). A list holding a name with a NUL byte in it is still a list: that
    line fails alone."""
    if b"\0" not in head:
        return False
    control = sum(1 for b in head if b < 32 and b not in b"\t\n\r")
    return b"\n" not in head or control > len(head) // 20


def open_list_file(path: str) -> BinaryIO:
    """A list file opened for :func:`bounded_lines`: a regular file only (a FIFO with no
    writer would block, a device never ends; ``-`` is stdin, the caller's to read), the
    same rule as ``--chat``. Raises ListFileError with the reason."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ListFileError("is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ListFileError("not a regular file (a FIFO, device or socket is not read: "
                                "pipe it to - instead)")
        return open(path, "rb")
    except FileNotFoundError:
        raise ListFileError("no such file or directory") from None
    except PermissionError:
        raise ListFileError("permission denied") from None
    except (OSError, ValueError) as exc:
        raise ListFileError(f"cannot read ({getattr(exc, 'strerror', None) or exc})") from None


__all__ = ["MAX_LIST_BYTES", "MAX_LIST_LINES", "MAX_PATH_LINE", "MAX_PROMPT_LINE", "ListFileError",
           "ListTooLong", "binary_stream", "bounded_lines", "open_list_file", "sniff_stdin"]
