"""Reading an image file's header without reading the file: the checks ``load_image`` makes
before it lets the decoder read the rest.

PIL's parsers are lenient about what follows a format's signature: on a file that starts
like a JPEG or a GIF and then holds garbage they read it one byte at a time to the end
(about a minute for 100 MB), and on a PNG or BMP whose header claims a huge chunk they read
the whole file into memory before failing. So the first bytes are checked here where the
format says what must come first, and while PIL identifies a file it reads through a
:class:`HeaderReader` that stops it after ``HEADER_BYTES`` bytes or ``HEADER_READS`` read
calls, whichever comes first. No click, rich or torch.
"""

from __future__ import annotations

import codecs

# What PIL may read while identifying an image: its header and the metadata before the
# pixels (EXIF, ICC profiles, XMP -- a few MB in some Photoshop exports --, PNG text
# chunks, TIFF tag tables), counted in bytes read, not in file position (a TIFF's tag
# table often sits at the end of the file). Real headers take a few hundred reads; the
# read limit stops the byte-by-byte scan of garbage after a JPEG or GIF signature.
HEADER_BYTES = 16 * 1024 ** 2
HEADER_READS = 65536

_PNG = b"\x89PNG\r\n\x1a\n"


class HeaderTooLong(Exception):
    """The decoder read more than the header budget before it knew what the file is."""


def header_problem(head: bytes) -> str | None:
    """What a file's first bytes already show is wrong with it as an image, or None."""
    if head.startswith(_PNG) and head[8:16] != b"\x00\x00\x00\x0dIHDR":
        return "PNG signature without the IHDR header chunk that must follow it"
    return None


class HeaderReader:
    """A binary file for PIL to read from: reads fail with HeaderTooLong past ``budget``
    bytes or ``reads`` calls, until ``lift()`` (then it reads freely, for the pixels)."""

    def __init__(self, fh, budget: int = HEADER_BYTES, reads: int = HEADER_READS) -> None:
        self._fh = fh
        self._left: int | None = budget
        self._reads = reads
        self._limits = f"{budget / 1024 ** 2:g} MiB or {reads:,} reads"

    def lift(self) -> None:
        self._left = None

    def _take(self, data: bytes) -> bytes:
        self._reads -= 1
        if len(data) > self._left or self._reads < 0:
            raise HeaderTooLong(f"no image header within its first {self._limits}")
        self._left -= len(data)
        return data

    def _cap(self, n: int | None) -> int:
        """Bytes to ask for: ``n``, or one past the budget (the same bytes as ``n`` when
        the file ends within the budget)."""
        return self._left + 1 if n is None or n < 0 or n > self._left else n

    def read(self, n: int | None = -1) -> bytes:
        if self._left is None:
            return self._fh.read(n)
        return self._take(self._fh.read(self._cap(n)))

    def readline(self, limit: int | None = -1) -> bytes:
        if self._left is None:
            return self._fh.readline(limit)
        return self._take(self._fh.readline(self._cap(limit)))

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def __getattr__(self, name):  # fileno, closed, name, ... of the real file
        return getattr(self._fh, name)


__all__ = ["HEADER_BYTES", "HEADER_READS", "HeaderReader", "HeaderTooLong", "header_problem"]


# ---------------------------------------------------------- what a file looks like
_IMAGE_MAGICS: tuple[bytes, ...] = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
    b"GIF87a",
    b"GIF89a",
    b"BM",  # BMP
    b"II*\x00",  # TIFF little endian
    b"MM\x00*",  # TIFF big endian
    b"II+\x00",  # BigTIFF
    b"MM\x00+",
    b"\x00\x00\x01\x00",  # ICO
    b"\x00\x00\x00\x0cjP  ",  # JPEG 2000
    b"\xff\x4f\xff\x51",  # J2K codestream
    b"8BPS",  # PSD
    b"qoif",
)


def looks_like_image_magic(head: bytes) -> bool:
    if head.startswith(_IMAGE_MAGICS):
        return True
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return True
    if head[4:8] == b"ftyp":  # HEIF/AVIF container
        return True
    return False


def looks_like_text(head: bytes) -> bool:
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return True
    if b"\x00" in head:
        return False
    try:
        # incremental decode: a multi-byte char cut at the sniff boundary is fine
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(head, final=False)
    except UnicodeDecodeError:
        return False
    control = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f\v\x1b")
    return control <= max(1, len(text) // 100)
