"""Describing videos: inputs → jobs (caption.py runs them: records, resume, exit codes).

An input is a video file (video_io.VIDEO_SUFFIXES), a folder of videos (searched
recursively), a folder of frames (image files and no videos: one input), a glob, or - for
paths on stdin. A job decodes its video when it runs (sampling frames uniformly, or by
time with ``fps``), so a bad file fails alone with one line naming it, and the batch
goes on.
"""

from __future__ import annotations

import os
from typing import Callable, TextIO

from vlmspec_cli.runtime.request import Message
from vlmspec_cli.tasks.caption import Job
from vlmspec_cli.tasks.inputs import REASON_EMPTY_DIR, InputError, InputItem, expand_inputs
from vlmspec_cli.tasks.video_io import (DEFAULT_MAX_FRAMES, FRAME_SUFFIXES, VIDEO_SUFFIXES,
                                        VideoError, read_video)

REASON_NO_VIDEOS = "directory holds no videos and no image frames"


def _is_frame_folder(path: str) -> bool:
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(n.lower().endswith(FRAME_SUFFIXES) for n in names)


def expand_video_inputs(args, stdin: TextIO | None = None) -> list[InputItem]:
    """Like caption's expansion, with video suffixes; a directory without videos that holds
    image files is one input (a folder of frames)."""
    items = []
    for item in expand_inputs(args, stdin=stdin, extensions=VIDEO_SUFFIXES):
        if item.error == REASON_EMPTY_DIR:
            item = InputItem(item.path) if _is_frame_folder(item.path) else InputItem(
                item.path, REASON_NO_VIDEOS)
        items.append(item)
    return items


def video_jobs(items: list[InputItem], prompt: str, frames: int | None, fps: float | None,
               max_pixels: int | None, folder_fps: float,
               max_frames: int | None = DEFAULT_MAX_FRAMES) -> list[Job]:
    def loader(item: InputItem) -> Callable[[], list[Message]]:
        def load() -> list[Message]:
            if item.error:
                raise InputError(item.path, item.error)
            try:
                clip = read_video(item.path, frames=None if fps else frames, fps=fps,
                                  max_pixels=max_pixels, folder_fps=folder_fps,
                                  max_frames=max_frames)
            except VideoError as exc:
                raise InputError(item.path, exc.reason) from None
            return [Message("user", prompt, videos=(clip,))]
        return load

    sampling = (("fps", fps),) if fps else (("frames", frames),)

    def settings(item: InputItem) -> tuple:  # a job's frame sampling is part of its key
        folder = (("folder_fps", folder_fps),) if os.path.isdir(item.path) else ()
        return sampling + (("max_pixels", max_pixels),) + folder

    return [Job(item.path, prompt, loader(item), item.error, settings=settings(item))
            for item in items]
