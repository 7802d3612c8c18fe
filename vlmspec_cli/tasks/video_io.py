"""Robust video decoding with PyAV: sample a few frames from a video file or a folder of frames.

Engine-free (no click, rich or torch): ``read_video`` returns a :class:`VideoClip`
of PIL RGB frames plus their timestamps, or raises :class:`VideoError`, whose
``str`` is one line ``'<path>: <reason>'``.

How a file is read (memory stays bounded by the frames that are kept):

1. *Packet pass* (demux only, nothing decoded, cheap): the presentation
   timestamps of the video packets give a provisional frame count and times.
   From them the frames to keep are planned (``frames=N`` -> indices,
   ``fps=F`` -> times). A plan of more than ``max_frames`` frames (profile key
   video.max_frames) is a VideoError here, before anything is decoded.
2. *Decode pass*: every frame is decoded once, in presentation order; its
   timestamp (``pts * time_base``, never the nominal rate) is recorded, and
   only the planned frames are converted to RGB, downscaled to ``max_pixels``
   (swscale, Lanczos) and rotated upright. Everything else is dropped at once,
   so a long video is never held in memory at full resolution.
3. The plan is redone from what was actually decoded. If the packets lied
   (truncated or corrupt files, packets without pts, decoders that drop
   frames) and a planned frame was not kept, the file is decoded once more
   keeping exactly the new plan. For an ordinary file this third pass never
   happens.

Duration metadata (``stream.duration``, ``container.duration``,
``stream.frames``) is never used: counts and spans come from decoded frames.
Rotation comes from the display matrix PyAV exposes as ``VideoFrame.rotation``
(counter-clockwise degrees); frames are rotated by that angle so they display
upright. Errors from FFmpeg (``av.error.FFmpegError``) are turned into
``VideoError``; a decode error mid-file ends the decode and keeps what decoded
(a truncated file gives its first frames); nothing decoded is an error.

A directory is a folder of frames: files with ``FRAME_SUFFIXES`` (dotfiles
skipped), natural sort by name, timestamps ``i / folder_fps``. Every file's
header is checked (cheap, ``Image.open``), and every frame must have the first's
size; only the sampled frames are fully decoded, and a file that fails either
step is reported with the folder's path and the file's name.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from vlmspec_cli.tasks.image_header import bomb_problem, dimension_problem
from vlmspec_cli.tasks.inputs import InputError, check_image_size, stat_regular

VIDEO_SUFFIXES = (".mp4", ".webm", ".mkv", ".gif", ".avi", ".mov")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
DEFAULT_FRAMES = 8
# The most frames one video is sampled to (profile key video.max_frames): every kept frame
# is held as an RGB image and then as vision patches, and 256 frames is already more
# than a Qwen2.5-VL context holds at its default resolution (~640 tokens a frame).
DEFAULT_MAX_FRAMES = 256

# Leading bytes of the containers we write or expect: a file that starts like
# a video but cannot be opened is reported as truncated/corrupt, not "not a video".
_MAGIC = (
    (0, b"\x1a\x45\xdf\xa3"),  # matroska / webm (EBML)
    (4, b"ftyp"),  # mp4 / mov
    (4, b"moov"),
    (4, b"mdat"),
    (4, b"wide"),
    (4, b"free"),
    (0, b"RIFF"),  # avi
    (0, b"GIF8"),
)


class VideoError(ValueError):
    """A video could not be read; ``str(exc)`` is one line ``'<path>: <reason>'``."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = " ".join(str(reason).split())  # one line, no stray whitespace
        super().__init__(f"{self.path}: {self.reason}")


@dataclass
class VideoClip:
    source: str
    frames: list = field(default_factory=list)
    timestamps: list = field(default_factory=list)
    duration: float | None = None
    source_frames: int = 0

    @property
    def sample_fps(self) -> float:
        if len(self.timestamps) < 2:
            return 1.0
        span = self.timestamps[-1] - self.timestamps[0]
        return (len(self.timestamps) - 1) / span if span > 0 else 1.0


def clip_from_arrays(frames, fps: float, source: str = "<frames>") -> VideoClip:
    """A clip from frames already in memory ((T, H, W, 3) uint8), sampled at ``fps``: frame i
    shows time i / fps and the clip spans T / fps seconds."""
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    n = len(images)
    return VideoClip(source, images, [i / fps for i in range(n)], duration=n / fps,
                     source_frames=n)


def is_video_path(path) -> bool:
    p = Path(path)
    return p.suffix.lower() in VIDEO_SUFFIXES or p.is_dir()


# ---------------------------------------------------------------- sampling


def uniform_indices(count: int, n: int) -> list[int]:
    """``n`` indices spread over ``range(count)``, first and last included, no duplicates."""
    if count <= 0 or n <= 0:
        return []
    if n >= count:
        return list(range(count))
    return sorted({int(round(x)) for x in np.linspace(0, count - 1, n)})


def indices_by_time(times: list[float], fps: float) -> list[int]:
    """For targets 0, 1/fps, 2/fps, ... (relative to the first frame): the first frame at or after each."""
    if not times:
        return []
    t = np.maximum.accumulate(np.asarray(times, dtype=np.float64) - times[0])  # robust to pts glitches
    step, eps = 1.0 / fps, 1e-6
    targets = np.arange(int(math.floor((t[-1] + eps) / step)) + 1) * step
    idx = np.searchsorted(t, targets - eps, side="left")
    return sorted({int(i) for i in idx if i < len(t)})


def _plan(times: list[float], frames: int | None, fps: float | None) -> list[int]:
    if fps is not None:
        return indices_by_time(times, fps)
    return uniform_indices(len(times), frames)


def _check_plan(path: str, plan, count: int, frames, fps, max_frames: int | None) -> None:
    """VideoError when sampling would keep more than ``max_frames`` frames (raised before
    those frames are decoded)."""
    if max_frames is not None and len(plan) > max_frames:
        how = f"{fps:g} fps" if fps is not None else f"{frames} frames"
        raise VideoError(path, f"sampling at {how} would take {len(plan):,} of its {count:,} "
                               f"frames, more than video.max_frames {max_frames:,} (lower "
                               "--fps / --frames or raise video.max_frames)")


def _check_args(frames, fps, max_pixels, folder_fps, max_frames=None):
    if frames is not None and fps is not None:
        raise ValueError("frames and fps are mutually exclusive")
    if frames is not None and int(frames) < 1:
        raise ValueError("frames must be >= 1")
    if fps is not None and not fps > 0:
        raise ValueError("fps must be > 0")
    if max_pixels is not None and int(max_pixels) < 1:
        raise ValueError("max_pixels must be >= 1")
    if not folder_fps > 0:
        raise ValueError("folder_fps must be > 0")
    if max_frames is not None and int(max_frames) < 1:
        raise ValueError("max_frames must be >= 1")
    return (DEFAULT_FRAMES if frames is None and fps is None else frames), fps


# ---------------------------------------------------------------- geometry


def fit_size(width: int, height: int, max_pixels: int | None) -> tuple[int, int]:
    """Largest size with the same aspect and ``w*h <= max_pixels``; never larger than the input."""
    if not max_pixels or width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    w, h = max(1, int(width * scale)), max(1, int(height * scale))
    while w * h > max_pixels and (w > 1 or h > 1):  # float rounding guard
        if w >= h and w > 1:
            w -= 1
        else:
            h -= 1
    return w, h


def apply_rotation(image: Image.Image, degrees) -> Image.Image:
    """Rotate by ``degrees`` counter-clockwise (display-matrix convention), snapped to 90."""
    if not degrees:
        return image
    quarter = int(round(float(degrees) / 90.0)) % 4
    ops = {1: Image.Transpose.ROTATE_90, 2: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_270}
    return image.transpose(ops[quarter]) if quarter else image


# ---------------------------------------------------------------- files

def _silence_ffmpeg() -> None:
    """FFmpeg's log lines would add noise to the CLI's one line per bad file; set on every read
    because a host program may have turned PyAV logging on since the last one."""
    import av.logging

    av.logging.set_level(av.logging.PANIC)


def _ffmpeg_detail(exc: BaseException) -> str:
    msg = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(msg).splitlines()[0].strip().rstrip(".").lower()


def _looks_like_video(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return False
    return any(head[off : off + len(m)] == m for off, m in _MAGIC)


def _open(path: str):
    import av

    try:
        container = av.open(path, metadata_errors="ignore")
    except (av.error.PermissionError, av.error.FileNotFoundError) as exc:   # not "not a video"
        raise VideoError(path, (exc.strerror or str(exc)).lower()) from None
    except av.error.FFmpegError as exc:
        kind = "truncated or corrupt" if _looks_like_video(path) else "not a video file"
        raise VideoError(path, f"{kind} ({_ffmpeg_detail(exc)})") from None
    except OSError as exc:
        raise VideoError(path, (exc.strerror or str(exc)).lower()) from None
    except Exception as exc:  # PyAV occasionally fails outside FFmpegError on garbage
        raise VideoError(path, f"not a video file ({_ffmpeg_detail(exc)})") from None
    if not container.streams.video:
        audio, other = bool(container.streams.audio), bool(container.streams)
        container.close()
        if audio:
            raise VideoError(path, "no video stream (audio only)")
        if not other:  # FFmpeg opened it but found nothing in it (e.g. an mp4 cut before its index)
            kind = "truncated or corrupt" if _looks_like_video(path) else "not a video file"
            raise VideoError(path, f"{kind} (no streams found)")
        raise VideoError(path, "no video stream")
    stream = container.streams.video[0]
    problem = _frame_problem(stream.codec_context.width, stream.codec_context.height)
    if problem:   # before any frame decodes: 2 frames of 16,000 x 16,000 took 6 GB
        container.close()
        raise VideoError(path, problem)
    return container


def _frame_problem(width: int, height: int) -> str | None:
    """Why frames of ``width`` x ``height`` are not decoded (the image limits: pixels and
    proportion, image_header.dimension_problem), or None; 0 (not declared) passes."""
    if not width or not height:
        return None
    problem = dimension_problem(width, height)
    return None if problem is None else "frames" + problem[len("image"):]


def _packet_times(path: str) -> list[float]:
    """Presentation times (s, relative) of the video packets, without decoding."""
    import av

    container = _open(path)
    pts: list[int] = []
    try:
        with container:
            stream = container.streams.video[0]
            tb = stream.time_base or Fraction(1, 1)
            try:
                for packet in container.demux(stream):
                    if packet.size == 0:
                        continue
                    pts.append(packet.pts if packet.pts is not None else (packet.dts if packet.dts is not None else None))
            except (av.error.FFmpegError, OSError):
                pass
    except (av.error.FFmpegError, OSError):
        pass
    if not pts or any(p is None for p in pts):
        return [float(i) for i in range(len(pts))]  # order only; the decode pass fixes times
    pts.sort()
    return [float((p - pts[0]) * tb) for p in pts]


def _decode(path: str, keep, max_pixels: int | None):
    """Decode every frame once; convert only the indices in ``keep``.

    Returns (relative times of all decoded frames, last frame's duration or None, {index: Image}).
    """
    import av

    container = _open(path)
    times: list[float] = []
    last_duration = None
    kept: dict[int, Image.Image] = {}
    with container:
        stream = container.streams.video[0]
        stream.codec_context.thread_type = "AUTO"
        tb = stream.time_base or Fraction(1, 1)
        rate = stream.average_rate or stream.guessed_rate
        step = float(1 / rate) if rate else 1 / 25
        t0 = None
        try:
            for frame in container.decode(stream):
                pts = frame.pts if frame.pts is not None else frame.dts
                if pts is not None:
                    t = float(pts * (frame.time_base or tb))
                    if t0 is None:
                        t0 = t
                    t -= t0
                else:
                    t = times[-1] + step if times else 0.0
                    if t0 is None:
                        t0 = 0.0
                i = len(times)
                times.append(t)
                if frame.duration:
                    last_duration = float(frame.duration * (frame.time_base or tb))
                if i in keep:
                    problem = _frame_problem(frame.width, frame.height)   # a size change mid-stream
                    if problem:
                        raise VideoError(path, f"frame {i}: {problem}")
                    kept[i] = _to_image(frame, max_pixels)
        except (av.error.FFmpegError, OSError):
            pass  # truncated / corrupt tail: keep what decoded
    if not times:
        raise VideoError(path, "truncated or corrupt (decoded 0 frames)")
    if last_duration is None or last_duration <= 0:
        if len(times) > 1:
            gaps = np.diff(times)
            gaps = gaps[gaps > 0]
            last_duration = float(np.median(gaps)) if gaps.size else None
        else:
            last_duration = float(1 / rate) if rate else None
    return times, last_duration, kept


def _to_image(frame, max_pixels: int | None) -> Image.Image:
    w, h = fit_size(frame.width, frame.height, max_pixels)
    if (w, h) != (frame.width, frame.height):
        image = frame.to_image(width=w, height=h, interpolation="LANCZOS")
    else:
        image = frame.to_image()
    if image.mode != "RGB":
        image = image.convert("RGB")
    return apply_rotation(image, getattr(frame, "rotation", 0))


def _read_file(path: str, frames, fps, max_pixels, max_frames=None) -> VideoClip:
    try:   # a regular, non-empty file, as an image must be (/dev/null said "empty file")
        stat_regular(path)
    except InputError as exc:
        raise VideoError(path, exc.reason) from None
    _silence_ffmpeg()

    guess = _packet_times(path)
    if not guess:
        raise VideoError(path, "video stream has no frames")
    plan = _plan(guess, frames, fps)
    _check_plan(path, plan, len(guess), frames, fps, max_frames)
    times, last_duration, kept = _decode(path, set(plan), max_pixels)
    final = _plan(times, frames, fps)
    if any(i not in kept for i in final):  # the packets lied: decode again, keep the real plan
        _check_plan(path, final, len(times), frames, fps, max_frames)
        wanted = set(final)
        times, last_duration, kept = _decode(path, wanted, max_pixels)
        final = [i for i in _plan(times, frames, fps) if i in kept]
    duration = (times[-1] - times[0] + last_duration) if last_duration is not None else None
    return VideoClip(
        source=path,
        frames=[kept[i] for i in final],
        timestamps=[times[i] for i in final],
        duration=duration,
        source_frames=len(times),
    )


# ---------------------------------------------------------------- folders


def _natural_key(name: str):
    return [(0, int(tok), "") if tok.isdigit() else (1, 0, tok.lower()) for tok in re.split(r"(\d+)", name) if tok]


def _read_folder(path: str, frames, fps, max_pixels, folder_fps, max_frames=None) -> VideoClip:
    try:
        names = [
            e.name
            for e in os.scandir(path)
            if not e.name.startswith(".") and e.is_file() and os.path.splitext(e.name)[1].lower() in FRAME_SUFFIXES
        ]
    except OSError as exc:
        raise VideoError(path, (exc.strerror or str(exc)).lower()) from None
    if not names:
        raise VideoError(path, "folder has no image frames")
    names.sort(key=_natural_key)

    def bad(name, exc):
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # the frame's path out of PIL's message (quoted first: "cannot identify image file ''")
        detail = detail.replace(repr(os.path.join(path, name)), "").replace(os.path.join(path, name), "").strip(" :")
        return VideoError(path, f"unreadable frame {name} ({detail.lower() or type(exc).__name__.lower()})")

    times = [i / folder_fps for i in range(len(names))]
    chosen = _plan(times, frames, fps)
    _check_plan(path, chosen, len(names), frames, fps, max_frames)
    first: tuple[str, tuple[int, int]] | None = None   # a video has one frame size
    for name in names:  # header check of every file: cheap, catches non-images and empty files
        try:
            check_image_size(name, os.path.getsize(os.path.join(path, name)))
            with Image.open(os.path.join(path, name)) as im:
                size = im.size
                problem = dimension_problem(*size)   # before PIL's own bomb check
            if problem:
                raise VideoError(path, f"frame {name}: {problem}")
            first = first or (name, size)
            if size != first[1]:
                raise VideoError(path, f"frames differ in size: {first[0]} is "
                                       f"{first[1][0]}x{first[1][1]}, {name} is {size[0]}x{size[1]} "
                                       "(a folder of frames is one video, of one size)")
        except InputError as exc:
            raise VideoError(path, f"unreadable frame {name} ({exc.reason})") from None
        except VideoError:
            raise
        except Image.DecompressionBombError as exc:   # past twice PIL's bound: not opened
            raise VideoError(path, f"frame {name}: {bomb_problem(exc)}") from None
        except Exception as exc:
            raise bad(name, exc) from None
    images = []
    for i in chosen:
        name = names[i]
        try:
            with Image.open(os.path.join(path, name)) as im:
                im.load()
                image = im.convert("RGB")
        except Exception as exc:
            raise bad(name, exc) from None
        w, h = fit_size(image.width, image.height, max_pixels)
        if (w, h) != image.size:
            image = image.resize((w, h), Image.Resampling.LANCZOS)
        images.append(image)
    return VideoClip(
        source=path,
        frames=images,
        timestamps=[times[i] for i in chosen],
        duration=len(names) / folder_fps,
        source_frames=len(names),
    )


# ---------------------------------------------------------------- entry point


def read_video(
    path,
    frames: int | None = None,
    fps: float | None = None,
    max_pixels: int | None = None,
    folder_fps: float = 2.0,
    max_frames: int | None = DEFAULT_MAX_FRAMES,
) -> VideoClip:
    """Sample frames from a video file or a folder of frames (see the module docstring).
    A video that would be sampled to more than ``max_frames`` frames (None: no cap) is a
    VideoError naming both numbers, raised before any frame is decoded."""
    frames, fps = _check_args(frames, fps, max_pixels, folder_fps, max_frames)
    src = str(path)
    if os.path.isdir(src):
        return _read_folder(src, frames, fps, max_pixels, folder_fps, max_frames)
    return _read_file(src, frames, fps, max_pixels, max_frames)   # stat_regular says why not
