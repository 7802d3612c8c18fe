"""Test helpers: a corpus of bad inputs and a few good images.

Note on permissions: the test suite may run as root, for whom chmod-000 files
are still readable, so no corpus entry relies on file permissions to be bad;
"permission denied" is not exercised here.

Decision on ``folder.png`` (a directory whose name has an image extension):
directory expansion treats it as a directory like any other -- it is descended
into and never becomes an item itself (so it is silently empty here);
passing it explicitly to ``load_image`` reports "is a directory".
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

from PIL import Image


def _noise_png(path: Path, size: int = 32, seed: int = 0) -> None:
    rng = random.Random(seed)
    Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3)).save(path, format="PNG")


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _bomb_png(path: Path, width: int = 20000, height: int = 20000) -> None:
    """A tiny PNG whose header claims width*height pixels (> 2x PIL's limit)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    data = (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00"))
        + _png_chunk(b"IEND", b"")
    )
    path.write_bytes(data)


def make_bad_corpus(root: Path) -> dict[str, str]:
    """Create bad inputs in ``root``; return ``{filename: expected reason substring}``.

    ``missing.png`` is not created (pass ``root / "missing.png"`` to exercise
    the missing-file path).  ``dangling.png`` is left out of the mapping when
    the filesystem cannot make symlinks.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}

    expected["missing.png"] = "no such file or directory"

    (root / "empty.png").write_bytes(b"")
    expected["empty.png"] = "empty file (0 bytes)"

    full = root / "_full.tmp"
    _noise_png(full, 32, seed=1)
    data = full.read_bytes()
    full.unlink()
    (root / "truncated.png").write_bytes(data[: len(data) // 2])
    expected["truncated.png"] = "truncated or corrupt image"

    (root / "notes.jpg").write_text(
        "# meeting notes\nThese are not pixels.\nCaf\u00e9 \u2014 r\u00e9sum\u00e9\n", encoding="utf-8"
    )
    expected["notes.jpg"] = "not an image (text file?)"

    try:
        os.symlink(root / "does-not-exist.png", root / "dangling.png")
        expected["dangling.png"] = "broken symbolic link"
    except (OSError, NotImplementedError):
        pass

    (root / "folder.png").mkdir(exist_ok=True)
    expected["folder.png"] = "is a directory"

    (root / "garbage.png").write_bytes(random.Random(2).randbytes(512).replace(b"\x00", b"\x01") + b"\x00\xff")
    expected["garbage.png"] = "unsupported or unrecognized image format"

    _bomb_png(root / "bomb.png")
    expected["bomb.png"] = "image too large"

    return expected


def make_good_images(root: Path, n: int, size: int = 16, seed: int = 1234) -> list[Path]:
    """Write ``n`` valid small PNGs (seeded random colours) named img_000.png..."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths: list[Path] = []
    for i in range(n):
        colour = tuple(rng.randrange(256) for _ in range(3))
        im = Image.new("RGB", (size, size), colour)
        # a second random block so images differ beyond a flat colour
        block = Image.new("RGB", (size // 2, size // 2), tuple(rng.randrange(256) for _ in range(3)))
        im.paste(block, (rng.randrange(size // 2), rng.randrange(size // 2)))
        p = root / f"img_{i:03d}.png"
        im.save(p, format="PNG")
        paths.append(p)
    return paths


# ------------------------------------------------------------------ input limits
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff\xe0"
GIB = 1024 ** 3


def make_sparse_file(path: Path, size: int = 2 * GIB, head: bytes = PNG_SIGNATURE) -> Path:
    """``head`` then zeros up to ``size`` bytes, as a sparse file: it takes no disk space,
    but a loader that reads it whole reads (and holds) ``size`` bytes."""
    path = Path(path)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def make_huge_png(root: Path, name: str = "huge.png") -> Path:
    """A 2 GiB sparse file that starts like a PNG (far past any sane image file size)."""
    return make_sparse_file(Path(root) / name, 2 * GIB, PNG_SIGNATURE)


def make_garbage_after_signature(root: Path, name: str = "fake.jpg", size: int = 64 * 1024 ** 2,
                                 head: bytes = JPEG_SIGNATURE) -> Path:
    """A sparse file under the image size cap whose signature is an image's and whose
    rest is zeros (PIL scans such a JPEG / GIF byte by byte to its end)."""
    return make_sparse_file(Path(root) / name, size, head)


def long_prompt(chars: int = 20_000) -> str:
    """A prompt far longer than the tinyworld models' context (1,024 / 256 positions)."""
    words = "what colour is the circle and where is the square "
    return (words * (chars // len(words) + 1))[:chars]


NEWLINE_NAME = "two\nlines\tand a tab\\slash.png"


def make_newline_named_image(root: Path, size: int = 16) -> Path:
    """A valid PNG whose name holds a newline, a tab and a backslash (legal on POSIX)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / NEWLINE_NAME
    Image.new("RGB", (size, size), (200, 30, 30)).save(path, format="PNG")
    return path


def make_long_video(path: Path, frames: int = 300, fps: int = 30, size: int = 16) -> Path:
    """A clip of ``frames`` tiny frames (10 s at 30 fps by default; fast to write): --fps 30
    samples every frame, more than the default video.max_frames 256. Use .mp4: Matroska
    keeps millisecond timestamps, so --fps 30 there samples only 2 frames in 3."""
    from videofiles import moving_square_frames, write_video

    return write_video(Path(path), moving_square_frames(frames, size=size, square=4), fps=fps)


def make_long_chat(path: Path, image: Path, chars: int = 20_000) -> Path:
    """Two conversations about ``image``: one with a turn far past the context, one short."""
    import json

    lines = [{"id": "long", "messages": [{"role": "user", "text": long_prompt(chars),
                                          "images": [str(image)]}]},
             {"id": "short", "messages": [{"role": "user", "text": "what colour is it?",
                                           "images": [str(image)]}]}]
    Path(path).write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return Path(path)
