"""Test helpers: write small videos (and broken ones) with PyAV.

Codec per suffix (all encodable by the PyAV wheel in use, PyAV 18 / FFmpeg 8):

====== =========== ========== ===============================================
suffix codec       pix_fmt    notes
====== =========== ========== ===============================================
.mp4   libx264     yuv420p    B-frames on (decode order != presentation order)
.mov   mpeg4       yuv420p
.webm  libvpx-vp9  yuv420p    realtime, cpu-used 8 (fast on tiny frames)
.mkv   ffv1        yuv444p    lossless
.avi   mjpeg       yuvj420p
.gif   gif         rgb8       3-3-2 palette: pure colours come out exact
====== =========== ========== ===============================================

Keep sizes even (libx264 / yuv420p) and small (32x32, 48x32) so tests are fast.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

CODECS = {
    ".mp4": ("libx264", "yuv420p", {"crf": "12", "preset": "veryfast"}),
    ".mov": ("mpeg4", "yuv420p", {"qscale": "2"}),
    ".webm": ("libvpx-vp9", "yuv420p", {"deadline": "realtime", "cpu-used": "8", "crf": "10", "b": "0"}),
    ".mkv": ("ffv1", "yuv444p", {}),
    ".avi": ("mjpeg", "yuvj420p", {"qscale": "2"}),
    ".gif": ("gif", "rgb8", {}),
}


def moving_square_frames(
    n: int,
    size: tuple[int, int] | int = 32,
    square: int = 8,
    color=(255, 0, 0),
    background=(0, 0, 0),
) -> list[np.ndarray]:
    """``n`` HxWx3 uint8 frames: a ``color`` square moving left to right across ``background``.

    Frame ``i`` has the square's left edge at ``round(i * (W - square) / (n - 1))``.
    """
    w, h = (size, size) if isinstance(size, int) else size
    top = (h - square) // 2
    out = []
    for i in range(n):
        a = np.empty((h, w, 3), np.uint8)
        a[:] = background
        x = round(i * (w - square) / max(1, n - 1))
        a[top : top + square, x : x + square] = color
        out.append(a)
    return out


def indexed_frames(n: int, size: tuple[int, int] | int = 32) -> list[np.ndarray]:
    """``n`` frames whose grey level encodes the index: frame i is uniformly ``i * 255 // (n-1)``."""
    w, h = (size, size) if isinstance(size, int) else size
    return [np.full((h, w, 3), round(i * 255 / max(1, n - 1)), np.uint8) for i in range(n)]


def _open_video_stream(container, suffix: str, width: int, height: int, fps: int, time_base, codec=None):
    name, pix_fmt, options = CODECS[suffix]
    if codec is not None:
        name = codec
    stream = container.add_stream(name, rate=fps, options=dict(options))
    stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
    if time_base is not None:
        stream.time_base = time_base
        stream.codec_context.time_base = time_base
    return stream


def write_video(
    path,
    frames: list[np.ndarray],
    fps: int = 10,
    pts_seconds: list[float] | None = None,
    rotation: int | None = None,
    codec: str | None = None,
    container_options: dict | None = None,
) -> Path:
    """Write ``frames`` (HxWx3 uint8) to ``path``; container and codec from the suffix (see CODECS).

    ``pts_seconds``: explicit presentation time of each frame (variable frame
    rate); the stream then uses a 1/1000 s time base. ``rotation``: display-matrix
    rotation in counter-clockwise degrees (as ``VideoFrame.rotation`` reads it back).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    h, w = frames[0].shape[:2]
    tb = Fraction(1, 1000) if pts_seconds is not None else None
    with av.open(str(path), "w", options=container_options or {}) as container:
        stream = _open_video_stream(container, suffix, w, h, fps, tb, codec)
        if rotation:
            stream.set_display_rotation(rotation)
        for i, a in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="rgb24")
            frame.pts = round(pts_seconds[i] * 1000) if pts_seconds is not None else i
            if tb is not None:
                frame.time_base = tb
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_no_duration_mkv(path, frames: list[np.ndarray], fps: int = 10) -> Path:
    """Matroska written as a live stream: no Duration element, no cues (container.duration is None)."""
    return write_video(path, frames, fps=fps, container_options={"live": "1"})


def write_audio_only(path, seconds: float = 0.5, rate: int = 8000) -> Path:
    """An audio-only file (a sine tone): pcm_s16le in .mkv/.avi/.mov, aac in .mp4, opus in .webm."""
    path = Path(path)
    codec = {".mp4": "aac", ".webm": "libopus"}.get(path.suffix.lower(), "pcm_s16le")
    if codec == "libopus":
        rate = 48000
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        n = int(seconds * rate)
        tone = (np.sin(np.arange(n) * 2 * np.pi * 440 / rate) * 8000).astype(np.int16)
        chunk = 1024
        fmt = stream.codec_context.format.name if stream.codec_context.format else "s16"
        for start in range(0, n, chunk):
            part = tone[start : start + chunk]
            if fmt.startswith("flt"):
                data = (part.astype(np.float32) / 32768.0)[None, :]
            else:
                data = part[None, :]
            frame = av.AudioFrame.from_ndarray(data, format=fmt, layout="mono")
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_zero_frame(path) -> Path:
    """A container with a video stream and no frames at all (AVI/mjpeg: it opens fine, 0 packets)."""
    path = Path(path)
    assert path.suffix.lower() == ".avi", "only AVI keeps an empty video stream readable"
    with av.open(str(path), "w") as container:
        _open_video_stream(container, ".avi", 32, 32, 10, None)
        container.start_encoding()
    return path


def write_truncated(path, keep: float | int = 0.5, frames: list[np.ndarray] | None = None, fps: int = 10) -> Path:
    """Write a real video to ``path`` then cut it: ``keep`` < 1 is a fraction of the bytes, else a byte count.

    An .mp4 from the default muxer keeps its index (moov) at the end, so any cut
    leaves nothing decodable; a cut .mkv/.avi keeps the frames before the cut.
    """
    path = Path(path)
    write_video(path, frames if frames is not None else moving_square_frames(20), fps=fps)
    size = os.path.getsize(path)
    n = int(size * keep) if keep < 1 else int(keep)
    with open(path, "r+b") as fh:
        fh.truncate(n)
    return path


def write_frame_folder(folder, frames: list[np.ndarray], names: list[str] | None = None, fmt: str = "png") -> Path:
    """Save frames as images in ``folder`` (default names ``frame1.png`` .. ``frameN.png``, not zero padded)."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = names or [f"frame{i + 1}.{fmt}" for i in range(len(frames))]
    for a, name in zip(frames, names):
        Image.fromarray(a).save(folder / name)
    return folder


def square_x_centroid(image) -> float:
    """x centroid of the bright pixels (any channel > 128) of a PIL image or array; nan if none."""
    a = np.asarray(image).astype(np.int32)
    mask = a.max(axis=2) > 128
    if not mask.any():
        return float("nan")
    return float(np.nonzero(mask)[1].mean())
