"""``vlmspec describe-video``: parse the options into a profile and jobs (tasks/video.py);
cli/jobs.py runs them."""

from __future__ import annotations

import sys

import click

from vlmspec_cli.cli.common import (decode_options, decoding_profile, fail, method_option,
                                    model_options, parse_inputs, profile_option, set_option)
from vlmspec_cli.cli.jobs import run_job_command
from vlmspec_cli.cli.types import Count, CountOrAuto, FiniteFloat, Utf8Text

DEFAULT_VIDEO_PROFILE = "tinyworld-video"

EPILOG_VIDEO = """\b
Examples:
  # tinyworld, hidden-state draft
  vlmspec describe-video examples/videos/
  # speedup vs the target alone
  vlmspec describe-video clip.mp4 --frames 16 --compare
  # rerun resumes
  vlmspec describe-video clips/ --fps 2 --out desc.jsonl
  find . -name '*.mp4' | vlmspec describe-video - --json | jq \\
      .stats.prefill_share
  # a folder of frames
  vlmspec describe-video frames_dir/ --set video.folder_fps=4
  # a draft that reads the video
  vlmspec describe-video clip.webm -m chain --inputs multimodal
  # hidden-state draft trees
  vlmspec describe-video clip.mkv --set hidden.tree=true
  # four videos decoded together
  vlmspec describe-video clips/ --batch-size 4 --out desc.jsonl

Videos: mp4, webm, mkv, gif, avi, mov (PyAV), or a folder of image frames.
Frames are sampled uniformly (--frames) or by time (--fps). Exit codes: 0 all
videos done, 1 some video failed (the rest were still done and written), 2
usage, profile, model-loading or output error (--out checked before any model
loads), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM),
141 stdout closed by its reader (`| head`).
"""


@click.command("describe-video", epilog=EPILOG_VIDEO)
@click.argument("inputs", nargs=-1, metavar="VIDEOS...")
@click.option("--prompt", type=Utf8Text(), help="Question or instruction for every video [profile: generation.prompt].")
@profile_option(DEFAULT_VIDEO_PROFILE)
@model_options
@method_option("video")
@click.option("--inputs", "drafting_inputs", metavar="LIST",
              help="chain: multimodal or text [profile: drafting.inputs].")
@set_option
@click.option("--frames", type=Count(min=1),
              help="Sample N frames uniformly [profile: video.frames, default 8].")
@click.option("--fps", type=FiniteFloat(min=0, min_open=True),
              help="Sample F frames per second of video time instead of --frames.")
@click.option("--max-pixels", type=Count(min=1),
              help="Downscale frames to at most this many pixels [profile: video.max_pixels].")
@click.option("--batch-size", "-b", type=CountOrAuto(min=1),
              help="Decode B videos together (methods none, chain, and hidden and eagle3 "
                   "chains); each output is the one decoded alone. auto: the largest B that "
                   "fits the memory at hand and still raises the throughput measured on the "
                   "first videos [profile: generation.batch_size, default 1].")
@decode_options("video", "VIDEO")
def describe_video(inputs, prompt, profile, method, drafting_inputs, sets, frames, fps, max_pixels,
                   batch_size, max_new_tokens, temperature, seed, device, fast_path, compile_steps, out, as_json, compare, dry_run, quiet):
    """Describe videos (or answer a question about each), drafted speculatively (by
    default by a head that never reads visual tokens): lossless, output identical to the
    target's.

    VIDEOS are video files, folders (searched recursively; a folder of image frames
    is one video), glob patterns, or - to read paths from stdin. Results go to stdout
    (text or --json); progress, one line per bad file and the summary to stderr.
    """
    from vlmspec_cli.session import SessionError, validate_method
    from vlmspec_cli.tasks.video import expand_video_inputs, video_jobs

    if not inputs:
        raise click.UsageError("no VIDEOS given (files, folders, globs, or - for stdin)")
    if frames and fps:
        raise click.UsageError("give --frames or --fps, not both")
    cli_values = {
        "method": method, "drafting.inputs": parse_inputs(drafting_inputs),
        "generation.prompt": prompt, "generation.max_new_tokens": max_new_tokens,
        "generation.batch_size": batch_size, "sampling.temperature": temperature, "sampling.seed": seed,
        "video.frames": frames, "video.fps": fps, "video.max_pixels": max_pixels,
        "target.device": device, "draft.device": device, "runtime.fast_path": fast_path,
        "runtime.compile": compile_steps,
    }
    prof = decoding_profile(profile or DEFAULT_VIDEO_PROFILE, sets, cli_values)
    if prof.task == "caption":   # your own profile, written for images: its models read videos
        prof = decoding_profile(profile or DEFAULT_VIDEO_PROFILE, sets, cli_values | {"task": "video"})
    elif prof.task != "video":
        fail(f"profile '{prof.name}' is for task '{prof.task}', describe-video needs a caption "
             "or video profile (task: video)")
    if frames and prof.video.fps:   # the command line picks the sampling: a profile's fps
        from vlmspec_cli.profile import with_settings   # gives way (it won, silently)

        prof = with_settings(prof, {"video.fps": None}, source="--frames")
    try:
        validate_method(prof)
    except SessionError as exc:
        fail(str(exc))
    v = prof.video
    items = video_jobs(expand_video_inputs(inputs, stdin=sys.stdin), prof.generation.prompt,
                       v.frames, v.fps, v.max_pixels, v.folder_fps, v.max_frames)
    sampling = f"{v.fps} fps" if v.fps else f"{v.frames} frames"
    run_job_command(prof, items, noun="video(s)", out=out, as_json=as_json, compare=compare,
                    dry_run=dry_run, quiet=quiet, about=f", {sampling} per video")
