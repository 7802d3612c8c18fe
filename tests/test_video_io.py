"""vlmspec_cli.tasks.video_io: decoding real (tiny) videos written by tests/videofiles.py."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image
from videofiles import (
    indexed_frames,
    moving_square_frames,
    square_x_centroid,
    write_audio_only,
    write_frame_folder,
    write_no_duration_mkv,
    write_truncated,
    write_video,
    write_zero_frame,
)

from vlmspec_cli.tasks import video_io
from vlmspec_cli.tasks.video_io import (
    VideoClip,
    VideoError,
    fit_size,
    indices_by_time,
    is_video_path,
    read_video,
    uniform_indices,
)

RED = (255, 0, 0)


# ------------------------------------------------------------------ containers


@pytest.mark.parametrize("suffix", [".mp4", ".webm", ".mkv", ".gif", ".avi", ".mov"])
def test_each_container_decodes_count_size_and_content(tmp_path, suffix):
    n = 12
    path = write_video(tmp_path / f"clip{suffix}", moving_square_frames(n, (48, 32), color=RED), fps=10)
    clip = read_video(path, frames=6)

    assert isinstance(clip, VideoClip)
    assert clip.source == str(path)
    assert clip.source_frames == n
    assert len(clip.frames) == 6
    # frames=6 over 12 frames: indices round(linspace(0, 11, 6)) = 0 2 4 7 9 11 at 10 fps
    assert clip.timestamps == pytest.approx([0.0, 0.2, 0.4, 0.7, 0.9, 1.1], abs=1e-6)
    assert clip.duration == pytest.approx(1.2, abs=1e-6)
    assert clip.sample_fps == pytest.approx(5 / 1.1)
    for image in clip.frames:
        assert isinstance(image, Image.Image)
        assert image.mode == "RGB"  # GIF palette frames included
        assert image.size == (48, 32)

    # the red square moves left to right: its centroid matches where it was drawn
    xs = [square_x_centroid(im) for im in clip.frames]
    drawn = [round(i * 40 / 11) + 3.5 for i in (0, 2, 4, 7, 9, 11)]
    assert xs == pytest.approx(drawn, abs=1.5)
    assert all(b > a for a, b in zip(xs, xs[1:]))
    # colours: the square is red, the background black (codec error allowed)
    a = np.asarray(clip.frames[3]).astype(int)
    cx = int(round(xs[3]))
    assert a[16, cx, 0] > 200 and a[16, cx, 1] < 80 and a[16, cx, 2] < 80
    assert a[2, 2].max() < 40


def test_default_is_eight_frames_and_short_video_returns_all(tmp_path):
    path = write_video(tmp_path / "c.mkv", indexed_frames(20))
    clip = read_video(path)
    assert len(clip.frames) == 8
    assert clip.timestamps[0] == 0.0 and clip.timestamps[-1] == pytest.approx(1.9)

    short = write_video(tmp_path / "s.mkv", indexed_frames(3))
    clip = read_video(short, frames=10)
    assert clip.source_frames == 3
    assert len(clip.frames) == 3  # no duplicates
    assert clip.timestamps == pytest.approx([0.0, 0.1, 0.2])


# ------------------------------------------------------------------ sampling


def test_uniform_indices():
    assert uniform_indices(12, 6) == [0, 2, 4, 7, 9, 11]
    assert uniform_indices(10, 1) == [0]
    assert uniform_indices(10, 2) == [0, 9]
    assert uniform_indices(3, 8) == [0, 1, 2]
    assert uniform_indices(0, 4) == []


def test_frames_n_picks_uniform_indices_content(tmp_path):
    n = 21
    path = write_video(tmp_path / "grey.mkv", indexed_frames(n))  # ffv1: lossless
    clip = read_video(path, frames=5)
    want = [0, 5, 10, 15, 20]
    assert clip.timestamps == pytest.approx([i / 10 for i in want])
    levels = [int(np.asarray(im)[5, 5, 0]) for im in clip.frames]
    assert levels == pytest.approx([round(i * 255 / (n - 1)) for i in want], abs=3)


def test_indices_by_time_unit():
    t = [0.0, 0.1, 0.2, 0.9, 1.6, 1.7, 3.0, 3.05, 3.6, 4.0]
    assert indices_by_time(t, 1.0) == [0, 4, 6, 9]
    assert indices_by_time(t, 2.0) == [0, 3, 4, 6, 8, 9]
    # relative to the first frame, whatever its absolute time
    assert indices_by_time([x + 7.0 for x in t], 1.0) == [0, 4, 6, 9]


VFR_TIMES = [0.0, 0.1, 0.2, 0.9, 1.6, 1.7, 3.0, 3.05, 3.6, 4.0]


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_fps_on_variable_frame_rate_file_picks_by_time(tmp_path, suffix):
    n = len(VFR_TIMES)
    path = write_video(tmp_path / f"vfr{suffix}", indexed_frames(n), fps=10, pts_seconds=VFR_TIMES)
    clip = read_video(path, fps=2)
    # targets 0, .5, 1, ... 4 s -> first frame at or after each (deduplicated)
    want = [0, 3, 4, 6, 8, 9]
    assert clip.timestamps == pytest.approx([VFR_TIMES[i] for i in want], abs=1e-3)
    assert clip.source_frames == n
    levels = [int(np.asarray(im)[5, 5, 0]) for im in clip.frames]
    assert levels == pytest.approx([round(i * 255 / (n - 1)) for i in want], abs=4)
    # an index-based sampler would have picked evenly spaced indices instead
    assert want != uniform_indices(n, len(want))

    one = read_video(path, fps=1)
    assert one.timestamps == pytest.approx([0.0, 1.6, 3.0, 4.0], abs=1e-3)
    assert one.sample_fps == pytest.approx(3 / 4.0, rel=1e-3)
    # real timestamps, not nominal rate: uniform sampling reports the true times too
    uni = read_video(path, frames=4)
    assert uni.timestamps == pytest.approx([VFR_TIMES[i] for i in uniform_indices(n, 4)], abs=1e-3)


def test_frames_and_fps_are_exclusive(tmp_path):
    path = write_video(tmp_path / "c.mkv", indexed_frames(4))
    with pytest.raises(ValueError, match="exclusive"):
        read_video(path, frames=2, fps=1.0)
    with pytest.raises(ValueError):
        read_video(path, frames=0)


# ------------------------------------------------------------------ robustness


def test_missing_duration_metadata(tmp_path):
    path = write_no_duration_mkv(tmp_path / "live.mkv", moving_square_frames(15, 32), fps=10)
    with av.open(str(path)) as c:  # precondition: nothing to lean on in the metadata
        assert c.duration is None
        assert c.streams.video[0].duration is None
        assert c.streams.video[0].frames == 0
    clip = read_video(path, frames=4)
    assert clip.source_frames == 15
    assert clip.duration == pytest.approx(1.5, abs=1e-6)
    assert clip.timestamps == pytest.approx([0.0, 0.5, 0.9, 1.4], abs=1e-6)
    xs = [square_x_centroid(im) for im in clip.frames]
    assert all(b > a for a, b in zip(xs, xs[1:]))


def test_only_planned_frames_are_converted(tmp_path, monkeypatch):
    path = write_video(tmp_path / "long.mkv", indexed_frames(40))
    calls = []
    real = video_io._to_image
    monkeypatch.setattr(video_io, "_to_image", lambda f, m: calls.append(f.pts) or real(f, m))
    clip = read_video(path, frames=4)
    assert len(clip.frames) == 4
    assert len(calls) == 4  # 36 frames decoded and dropped, never turned into images


def test_replans_when_packets_disagree_with_decoded_frames(tmp_path, monkeypatch):
    path = write_video(tmp_path / "c.mkv", indexed_frames(20))
    # pretend the packet pass saw 7 packets: the first plan is wrong, the result must not be
    monkeypatch.setattr(video_io, "_packet_times", lambda p: [i / 10 for i in range(7)])
    clip = read_video(path, frames=3)
    assert clip.source_frames == 20
    assert clip.timestamps == pytest.approx([0.0, 1.0, 1.9])
    levels = [int(np.asarray(im)[5, 5, 0]) for im in clip.frames]
    assert levels == pytest.approx([0, round(10 * 255 / 19), 255], abs=3)


def test_truncated_file_returns_what_decoded(tmp_path):
    path = write_truncated(tmp_path / "half.mkv", keep=0.5, frames=indexed_frames(20))
    clip = read_video(path, frames=100)
    assert 0 < clip.source_frames < 20
    assert len(clip.frames) == clip.source_frames
    assert clip.timestamps == pytest.approx([i / 10 for i in range(clip.source_frames)])


@pytest.mark.parametrize("rotation, size, corner", [(90, (32, 48), "bottom-left"), (-90, (32, 48), "top-right"), (180, (48, 32), "bottom-right")])
def test_rotation_metadata_is_applied(tmp_path, rotation, size, corner):
    frames = [np.zeros((32, 48, 3), np.uint8) for _ in range(3)]
    for a in frames:
        a[:8, :8] = (0, 255, 0)  # green marker top-left in the stored picture
    path = write_video(tmp_path / f"rot{rotation}.mkv", frames, rotation=rotation)
    with av.open(str(path)) as c:  # precondition: PyAV wrote and reads back the display matrix
        assert next(c.decode(video=0)).rotation == (rotation if rotation != 180 else -180)
    clip = read_video(path, frames=1)
    image = clip.frames[0]
    assert image.size == size
    ys, xs = np.nonzero(np.asarray(image)[:, :, 1] > 200)
    w, h = size
    where = ("top" if ys.mean() < h / 2 else "bottom") + "-" + ("left" if xs.mean() < w / 2 else "right")
    assert where == corner


def test_apply_rotation_helper():
    im = Image.new("RGB", (4, 2))
    im.putpixel((0, 0), (255, 255, 255))
    assert video_io.apply_rotation(im, 0) is im
    r = video_io.apply_rotation(im, 90)  # counter-clockwise: top-left -> bottom-left
    assert r.size == (2, 4) and r.getpixel((0, 3)) == (255, 255, 255)
    r = video_io.apply_rotation(im, -90)  # clockwise: top-left -> top-right
    assert r.size == (2, 4) and r.getpixel((1, 0)) == (255, 255, 255)


# ------------------------------------------------------------------ max_pixels


def test_fit_size():
    assert fit_size(64, 32, None) == (64, 32)
    assert fit_size(64, 32, 10_000) == (64, 32)  # never upscale
    w, h = fit_size(1920, 1080, 448 * 448)
    assert w * h <= 448 * 448 and abs(w / h - 16 / 9) < 0.01 and w * h > 0.97 * 448 * 448


def test_max_pixels_downscales_keeping_aspect(tmp_path):
    path = write_video(tmp_path / "wide.mkv", moving_square_frames(4, (64, 32), square=8, color=RED))
    clip = read_video(path, frames=2, max_pixels=500)
    for im in clip.frames:
        w, h = im.size
        assert w * h <= 500
        assert w * h > 400
        assert w / h == pytest.approx(2.0, rel=0.1)
    big = read_video(path, frames=2, max_pixels=10**6)
    assert big.frames[0].size == (64, 32)
    # the content survives the resize: the square starts left and ends right
    xs = [square_x_centroid(im) / im.width for im in clip.frames]
    assert xs[0] < 0.2 and xs[1] > 0.8


# ------------------------------------------------------------------ folders


def test_folder_of_frames_natural_sort(tmp_path):
    frames = indexed_frames(12)
    folder = write_frame_folder(tmp_path / "frames", frames)  # frame1.png .. frame12.png
    (folder / "notes.txt").write_text("not a frame")
    (folder / ".hidden.png").write_bytes(b"junk")
    assert is_video_path(folder)
    clip = read_video(folder, frames=4, folder_fps=2.0)
    assert clip.source_frames == 12
    assert clip.timestamps == pytest.approx([0.0, 2.0, 3.5, 5.5])  # indices 0 4 7 11 at 2 fps
    assert clip.duration == pytest.approx(6.0)
    levels = [int(np.asarray(im)[0, 0, 0]) for im in clip.frames]
    # lexical sort (frame1, frame10, frame11, frame12, frame2, ...) would break this
    assert levels == [round(i * 255 / 11) for i in (0, 4, 7, 11)]
    by_time = read_video(folder, fps=1.0, folder_fps=4.0)
    assert by_time.timestamps == pytest.approx([0.0, 1.0, 2.0])
    assert video_io._natural_key("frame2.png") < video_io._natural_key("frame10.png")


def test_folder_max_pixels_and_mixed_formats(tmp_path):
    folder = tmp_path / "mix"
    write_frame_folder(folder, moving_square_frames(2, (64, 32)), names=["a1.jpg", "a2.bmp"])
    clip = read_video(folder, frames=2, max_pixels=512)
    assert [im.size for im in clip.frames] == [(32, 16), (32, 16)]
    assert all(im.mode == "RGB" for im in clip.frames)


def test_folder_of_frames_of_different_sizes_is_refused_naming_both(tmp_path):
    folder = write_frame_folder(tmp_path / "mixed", indexed_frames(3, 32) + indexed_frames(1, (40, 24)))
    with pytest.raises(VideoError) as info:
        read_video(folder, frames=2)     # frame4 is not even sampled: a video has one size
    assert str(info.value) == (f"{folder}: frames differ in size: frame1.png is 32x32, frame4.png "
                               "is 40x24 (a folder of frames is one video, of one size)")


def test_folder_with_broken_image(tmp_path):
    folder = write_frame_folder(tmp_path / "broken", indexed_frames(5))
    (folder / "frame3.png").write_bytes(b"this is not a png")
    with pytest.raises(VideoError) as info:
        read_video(folder, frames=2)  # frame3 is not even sampled: still reported
    msg = str(info.value)
    assert str(folder) in msg and "frame3.png" in msg and "\n" not in msg
    assert info.value.path == str(folder)
    assert "''" not in msg and "cannot identify image file)" in msg   # the path out, quotes too


def test_folder_with_truncated_sampled_image(tmp_path):
    folder = write_frame_folder(tmp_path / "cut", [np.random.default_rng(0).integers(0, 255, (48, 48, 3), np.uint8)] * 3)
    data = (folder / "frame1.png").read_bytes()
    (folder / "frame1.png").write_bytes(data[: len(data) // 2])  # header fine, pixels missing
    with pytest.raises(VideoError) as info:
        read_video(folder, frames=3)
    assert "frame1.png" in str(info.value) and str(folder) in str(info.value)


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    with pytest.raises(VideoError, match="folder has no image frames"):
        read_video(tmp_path / "empty")


# ------------------------------------------------------------------ bad inputs


def _bad(tmp_path, kind):
    p = tmp_path
    if kind == "missing":
        return p / "missing.mp4"
    if kind == "empty":
        (p / "empty.mp4").write_bytes(b"")
        return p / "empty.mp4"
    if kind == "text":
        (p / "notes.mp4").write_text("just some text, not a video\n" * 20)
        return p / "notes.mp4"
    if kind == "random":
        (p / "noise.mkv").write_bytes(random.Random(1).randbytes(4096))
        return p / "noise.mkv"
    if kind == "audio_mkv":
        return write_audio_only(p / "tone.mkv")
    if kind == "audio_mp4":
        return write_audio_only(p / "tone.mp4")
    if kind == "zero_frames":
        return write_zero_frame(p / "zero.avi")
    if kind == "truncated_mp4":
        return write_truncated(p / "cut.mp4", keep=0.6)
    if kind == "truncated_mp4_early":
        return write_truncated(p / "cut.mp4", keep=0.1)
    if kind == "truncated_mkv_header":
        return write_truncated(p / "cut.mkv", keep=300)
    if kind == "device":
        return Path("/dev/null")
    if kind == "link_loop":
        os.symlink(p / "b.mp4", p / "a.mp4")
        os.symlink(p / "a.mp4", p / "b.mp4")
        return p / "a.mp4"
    raise AssertionError(kind)


BAD = {
    "missing": "no such file or directory",
    "empty": "empty file",
    "text": "not a video file",
    "random": "not a video file",
    "audio_mkv": "no video stream (audio only)",
    "audio_mp4": "no video stream (audio only)",
    "zero_frames": "video stream has no frames",
    "truncated_mp4": "truncated or corrupt",
    "truncated_mp4_early": "truncated or corrupt",
    "truncated_mkv_header": "truncated or corrupt",
    "device": "not a regular file",          # it said "empty file"
    "link_loop": "too many levels of symbolic links",
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_inputs_raise_one_line_video_error(tmp_path, kind, capfd, caplog):
    path = _bad(tmp_path, kind)
    av.logging.set_level(av.logging.VERBOSE)  # as if the host program had turned FFmpeg logging on
    try:
        with pytest.raises(VideoError) as info:
            read_video(path)
    finally:
        av.logging.set_level(None)
    err = info.value
    msg = str(err)
    assert isinstance(err, ValueError)
    assert msg.startswith(f"{path}: ")
    assert BAD[kind] in err.reason
    assert err.reason == err.reason.lower()
    assert "\n" not in msg and len(msg) < len(str(path)) + 120
    assert err.path == str(path)
    assert os.path.basename(path) in msg
    # ffmpeg's own log lines are silenced: the CLI prints exactly one line per bad file
    assert capfd.readouterr().err == ""
    assert not [r for r in caplog.records if r.name.startswith("libav")]


def test_video_error_flattens_reason():
    err = VideoError("x.mp4", "bad\n  thing")
    assert str(err) == "x.mp4: bad thing"
    assert (err.path, err.reason) == ("x.mp4", "bad thing")


def test_is_video_path(tmp_path):
    assert is_video_path("a/b.MP4") and is_video_path("x.webm") and is_video_path("x.gif")
    assert not is_video_path("x.png") and not is_video_path("x.txt")
    assert is_video_path(tmp_path)
    assert not is_video_path(tmp_path / "nothere")


def test_sample_fps():
    assert VideoClip("x", [], [0.0], 1.0, 1).sample_fps == 1.0
    assert VideoClip("x", [], [0.0, 0.0], None, 2).sample_fps == 1.0
    assert VideoClip("x", [], [1.0, 1.5, 2.0], 1.0, 3).sample_fps == pytest.approx(2.0)
    assert not math.isnan(VideoClip("x", [], [], None, 0).sample_fps)


def test_frames_past_the_image_limits_are_refused_before_decoding(tmp_path, monkeypatch):
    """A video's declared frame size meets the images' limits (pixels, proportion) before
    any frame decodes (2 frames of 16,000 x 16,000 took 6 GB and 30 s; a 4,000 x 16 clip
    failed inside the processor with "ValueError: absolute aspect ratio ..."); a folder's
    frame too (PIL's own bomb bound is 179 M pixels, and its message leaked)."""
    import struct
    import zlib

    wide = write_video(tmp_path / "wide.mp4", [np.zeros((16, 1024, 3), np.uint8)] * 2)
    decoded = []
    monkeypatch.setattr(video_io, "_to_image", lambda *a: decoded.append(a))
    with pytest.raises(VideoError, match=r"frames out of proportion \(1,024 x 16 pixels"):
        read_video(wide)
    assert decoded == []
    assert video_io._frame_problem(16_000, 16_000).startswith("frames too large (16,000 x 16,000")
    assert video_io._frame_problem(0, 0) is None and video_io._frame_problem(640, 480) is None

    def declared_png(path, width, height):   # a header that declares the size, no pixels
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data   # noqa: E731
                                    + struct.pack(">I", zlib.crc32(kind + data)))
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))

    for size, reason in (((9000, 9000), "frame f1.png: image too large (9,000 x 9,000"),
                         ((60000, 60000), "frame f1.png: image too large (3600.0 M pixels, "
                                          "more than the 67.1 M vlmspec decodes")):
        folder = tmp_path / f"frames{size[0]}"
        write_frame_folder(folder, indexed_frames(2), names=["f0.png", "f2.png"])
        declared_png(folder / "f1.png", *size)
        with pytest.raises(VideoError) as info:
            read_video(folder)
        assert reason in info.value.reason and "bomb" not in info.value.reason
