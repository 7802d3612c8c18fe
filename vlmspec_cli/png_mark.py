"""The mark every PNG vlmspec writes carries (images, heatmaps, plots): a tEXt chunk
Software = PNG_MARK after the header, by which tasks/output_files.py knows a PNG as its
own to replace with --force.

Below every writer of PNGs (plot.py, the tasks): it imports nothing from the package.
"""

from __future__ import annotations

import struct
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_MARK = "vlmspec"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def mark_png(data: bytes, **text: str) -> bytes:
    """``data`` (a PNG as PIL writes it, IHDR first) with tEXt chunks after its header:
    Software = PNG_MARK, then ``text`` (ASCII keys and values)."""
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    end = 8 + 8 + struct.unpack(">I", data[8:12])[0] + 4    # signature, IHDR, its CRC
    chunks = b"".join(_png_chunk(b"tEXt", k.encode("ascii") + b"\0" + v.encode("ascii"))
                      for k, v in {"Software": PNG_MARK, **text}.items())
    return data[:end] + chunks + data[end:]
