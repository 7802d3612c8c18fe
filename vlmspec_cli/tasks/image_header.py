"""Reading an image file's header without reading the file: the checks ``load_image`` makes
before it lets the decoder read the rest.

PIL's parsers are lenient about what follows a format's signature: on a file that starts
like a JPEG or a GIF and then holds garbage they read it one byte at a time to the end
(about a minute for 100 MB), and on a PNG or BMP whose header claims a huge chunk they read
the whole file into memory before failing. So the first bytes are checked here where the
format says what must come first, and while PIL identifies a file it reads through a
:class:`HeaderReader` that stops it after ``HEADER_BYTES`` bytes or ``HEADER_READS`` read
calls, whichever comes first. The width and height the header declares are checked
(:func:`dimension_problem`) before any pixel is decoded: a 200-byte PNG can declare a
12,000 x 12,000 image (2.4 GB to decode) or a 100,000 x 1 strip that a model's processor
scales up by its short side (GBs). :func:`to_rgb` converts the decoded pixels. No click,
rich or torch.
"""

from __future__ import annotations

import codecs
import re
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

# What PIL may read while identifying an image: its header and the metadata before the
# pixels (EXIF, ICC profiles, XMP -- a few MB in some Photoshop exports --, PNG text
# chunks, TIFF tag tables), counted in bytes read, not in file position (a TIFF's tag
# table often sits at the end of the file). Real headers take a few hundred reads; the
# read limit stops the byte-by-byte scan of garbage after a JPEG or GIF signature.
HEADER_BYTES = 16 * 1024 ** 2
HEADER_READS = 65536

_PNG = b"\x89PNG\r\n\x1a\n"

# Reason strings (stable: tests and downstream summaries match on them; tasks/inputs.py
# exports them with its own).
REASON_TEXT = "not an image (text file?)"
REASON_UNRECOGNIZED = "unsupported or unrecognized image format"
REASON_TRUNCATED = "truncated or corrupt image"  # + " (<PIL message>)"
REASON_TOO_LARGE = "image too large"

# What an image may declare, checked on its header before decoding (constants, stated in
# the README's Safety section). 8192 x 8192 pixels is 192 MiB as RGB, well past what a
# model sees (a few hundred thousand pixels) and past most cameras' 48 M pixels; PIL's own
# bomb check (179 M pixels) let a 12,000 x 12,000 grey PNG decode at 2.4 GB. The aspect
# ratio bounds what a processor that scales the short side up (CLIP-style: shortest side
# to 336) makes of a thin strip: a 100,000 x 1 PNG became 2.7 GB. Panoramas, receipts and
# long screenshots stay within 50:1.
MAX_IMAGE_PIXELS = 8192 * 8192
MAX_ASPECT_RATIO = 50


class ImageRefused(Exception):
    """What is wrong with an image file (``str()``: the reason; the caller names the file)."""


class HeaderTooLong(Exception):
    """The decoder read more than the header budget before it knew what the file is."""


def bomb_problem(exc: Exception, max_pixels: int = MAX_IMAGE_PIXELS) -> str:
    """vlmspec's reason for an image PIL refused as a decompression bomb (declared past twice
    its own bound, so its width and height never reached ``dimension_problem``): the pixel
    count PIL's message gives, in vlmspec's words."""
    found = re.search(r"Image size \((\d+) pixels\)", str(exc))
    size = f"{int(found.group(1)) / 1e6:.1f} M pixels, " if found else ""
    return (f"image too large ({size}more than the {max_pixels / 1e6:.1f} M vlmspec decodes; "
            "not decoded)")


def header_problem(head: bytes) -> str | None:
    """What a file's first bytes already show is wrong with it as an image, or None."""
    if head.startswith(_PNG) and head[8:16] != b"\x00\x00\x00\x0dIHDR":
        return "PNG signature without the IHDR header chunk that must follow it"
    return None


def dimension_problem(width: int, height: int, max_pixels: int = MAX_IMAGE_PIXELS,
                      max_ratio: int = MAX_ASPECT_RATIO) -> str | None:
    """Why an image of ``width`` x ``height`` pixels is not decoded, or None."""
    size = f"{width:,} x {height:,} pixels"
    if width <= 0 or height <= 0:
        return f"image has no pixels ({size})"
    if width * height > max_pixels:
        return (f"image too large ({size} = {width * height / 1e6:.1f} M pixels, more than "
                f"the {max_pixels / 1e6:.1f} M vlmspec decodes; not decoded)")
    long, short = max(width, height), min(width, height)
    if long > max_ratio * short:
        return (f"image out of proportion ({size}: one side is more than {max_ratio} times "
                f"the other, which a model's processor scales up; not decoded)")
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


__all__ = ["HEADER_BYTES", "HEADER_READS", "MAX_ASPECT_RATIO", "MAX_IMAGE_PIXELS", "HeaderReader",
           "HeaderTooLong", "ImageRefused", "decode_pixels", "dimension_problem", "header_problem",
           "open_header", "pil_msg", "to_rgb", "upright_rgb"]


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


# ---------------------------------------------------------- the decoded pixels
def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any decoded mode to RGB; alpha is composited on white."""
    mode = im.mode
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        mode in ("P", "L", "RGB", "1") and "transparency" in im.info
    )
    if mode == "RGB" and not has_alpha:
        return im
    if has_alpha:
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        bg.alpha_composite(rgba)
        return bg.convert("RGB")
    if mode.startswith("I;16") or mode in ("I", "F"):
        # High bit depth grayscale: plain convert() clips to 255 (all white).
        f = im.convert("F") if mode != "F" else im
        lo, hi = f.getextrema()
        if hi is None or hi <= 255:
            scale = 1.0
        elif hi <= 65535:
            scale = 255.0 / 65535.0
        else:
            scale = 255.0 / float(hi)
        if lo is not None and lo < 0:
            f = f.point(lambda v: v - lo)  # type: ignore[operator]
        if scale != 1.0:
            f = f.point(lambda v: v * scale)  # type: ignore[operator]
        return f.convert("L").convert("RGB")
    return im.convert("RGB")


def open_header(fh, head: bytes) -> Image.Image:
    """Identify the image from its header (PIL reads only the first bytes here)."""
    try:
        with warnings.catch_warnings():  # past PIL's warning size: dimension_problem refuses
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(fh)
    except HeaderTooLong as e:
        kind = REASON_TRUNCATED if looks_like_image_magic(head) else REASON_UNRECOGNIZED
        raise ImageRefused(f"{kind} ({e}; the rest is not read)") from None
    except Image.DecompressionBombError as e:
        raise ImageRefused(bomb_problem(e)) from None
    except UnidentifiedImageError:
        # Only sniff for text when PIL cannot identify the bytes, so text-based
        # image formats that PIL reads (e.g. ASCII PPM) still load.
        if not looks_like_image_magic(head) and looks_like_text(head):
            raise ImageRefused(REASON_TEXT) from None
        if looks_like_image_magic(head):
            raise ImageRefused(f"{REASON_TRUNCATED} (cannot parse image header)") from None
        raise ImageRefused(REASON_UNRECOGNIZED) from None
    except MemoryError:
        raise ImageRefused(f"{REASON_TOO_LARGE} (out of memory)") from None
    except Exception as e:  # header parse errors of a recognized format
        raise ImageRefused(f"{REASON_TRUNCATED} ({pil_msg(e)})") from None


def decode_pixels(im: Image.Image) -> None:
    try:
        im.load()
    except Image.DecompressionBombError as e:
        raise ImageRefused(bomb_problem(e)) from None
    except MemoryError:
        raise ImageRefused(f"{REASON_TOO_LARGE} (out of memory)") from None
    except Exception as e:  # OSError, SyntaxError, ValueError, zlib.error, EOFError, ...
        raise ImageRefused(f"{REASON_TRUNCATED} ({pil_msg(e)})") from None


def upright_rgb(im: Image.Image) -> Image.Image:
    try:
        if im.getexif().get(0x0112, 1) in (2, 3, 4, 5, 6, 7, 8):  # EXIF Orientation
            im = ImageOps.exif_transpose(im)
    except Exception:
        pass  # bad EXIF never costs the image; keep it unrotated

    try:
        return to_rgb(im)
    except MemoryError:
        raise ImageRefused(f"{REASON_TOO_LARGE} (out of memory)") from None
    except Exception as e:
        raise ImageRefused(f"{REASON_UNRECOGNIZED} (cannot convert mode {im.mode}: {pil_msg(e)})") from None


def pil_msg(e: BaseException) -> str:
    msg = str(e).strip()
    return msg or type(e).__name__
