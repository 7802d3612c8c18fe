"""``vlmspec calibrate``'s inputs and output: the sample requests of each task, the base
profile it searches from, and the profile it writes (checked before any work, written
atomically, never over the base profile, one it includes, an input, or a file that is not
a vlmspec profile)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.fileio import same_file
from vlmspec_cli.tasks.output_files import (OutputRefused, check_output, is_profile, write_checked,
                                            written_by)


# ------------------------------------------------------------------ samples
def sample_requests(profile, items, target=None) -> tuple[list[Request], list[str]]:
    """One request per usable sample, and the one-line error of each unusable one. SAMPLES
    are images (caption: expanded input items), videos or frame folders (video: items of
    tasks/video.expand_video_inputs) or prompts (image: strings; ``target`` sets the grid)."""
    if profile.task == "image":
        return _prompt_requests(profile, items, target.adapter.num_image_tokens(target))
    from vlmspec_cli.tasks.inputs import InputError, load_image

    requests, errors = [], []
    for item in items:
        try:
            if item.error:
                raise InputError(item.path, item.error)
            messages = (_video_messages(profile, item) if profile.task == "video" else
                        [Message("user", profile.generation.prompt, (load_image(item.path),))])
        except InputError as exc:
            errors.append(str(exc))
            continue
        requests.append(Request(messages, max_new_tokens=profile.generation.max_new_tokens,
                                seed=profile.sampling.seed, request_id=item.path))
    return requests, errors


def _prompt_requests(profile, prompts, n: int) -> tuple[list[Request], list[str]]:
    """An image profile's samples: prompts, refused as generate-image refuses them (an
    empty one), and one that names a file or folder (SAMPLES are images for a caption
    profile: an image folder given with an image profile was calibrated on as text)."""
    requests, errors = [], []
    for i, prompt in enumerate(prompts, 1):
        if not prompt.strip():
            errors.append(f"prompt {i}: empty prompt")
        elif os.path.lexists(prompt):
            errors.append(f"prompt {i}: '{prompt}' names a file or folder; an image "
                          "profile calibrates on prompts (text)")
        else:
            requests.append(Request([Message("user", prompt.strip())], max_new_tokens=n,
                                    seed=profile.sampling.seed, request_id=prompt.strip()))
    return requests, errors


def _video_messages(profile, item) -> list[Message]:
    from vlmspec_cli.tasks.video import video_jobs

    v = profile.video
    job, = video_jobs([item], profile.generation.prompt, v.frames, v.fps, v.max_pixels,
                      v.folder_fps, v.max_frames)
    return job.load()


def search_base(profile):
    """(the profile calibrate searches from, why caption drafting is left out or None).
    Calibrating needs a drafting method: method none is searched from its task's first."""
    from vlmspec_cli.runtime.models.loading import ModelLoadError, load_model

    from vlmspec_cli.drafters import method_class
    from vlmspec_cli.drafters.base import first_searched

    if not method_class(profile.method).drafts:
        profile.method = first_searched(profile)
    note = None
    if profile.task == "caption" and profile.captioner.model:
        try:
            load_model(profile.captioner, "captioner")
        except ModelLoadError as exc:
            note = f"caption drafting left out: {exc}"
    elif profile.task == "caption":
        note = "caption drafting left out: the profile names no captioner"
    return profile, note


# ------------------------------------------------------------------ the written profile
def pinned_settings(profile, sets) -> dict:
    """The ``--set KEY=VALUE`` keys a calibration ran with, as the loaded ``profile`` holds
    them (typed, checked), for the written profile: a path that exists here is written
    absolute (a profile's relative paths resolve against the profile's own folder)."""
    out = {}
    for item in sets:
        key = str(item).partition("=")[0].strip()
        value = profile
        for part in key.split("."):
            value = getattr(value, part)
        if dataclasses.is_dataclass(value):     # a whole section
            value = dataclasses.asdict(value)
        if isinstance(value, str) and value and not os.path.isabs(value) and os.path.exists(value):
            value = os.path.abspath(value)
        out[key] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def profile_write_path(name: str) -> Path:
    """``--write NAME`` -> profiles/NAME.yaml; FILE.yaml or a path as given."""
    if name.endswith((".yaml", ".yml")) or os.sep in name or "/" in name:
        return Path(name)
    return Path("profiles") / f"{name}.yaml"


def include_for(base_source: str, path: Path) -> str:
    """How the written profile names its base: a shipped profile by name (found from any
    folder), any other by its path relative to the new file (absolute when that climbs out
    of its folder). A base given by name from ./profiles or $VLMSPEC_PROFILES was written
    as its name, which the new file then found only where that folder was searched: run
    from another directory, it said "include 'mybase' not found"."""
    from vlmspec_cli.profile import is_shipped_profile

    if is_shipped_profile(base_source):
        return Path(base_source).stem
    rel = os.path.relpath(base_source, path.parent.resolve())
    return base_source if rel.startswith("..") else rel


def _profile_rules(force: bool, inputs) -> dict:
    return dict(force=force, ours=is_calibrated, what="profile written by `vlmspec calibrate`",
                inputs=list(inputs))


def is_calibrated(path: Path) -> bool:
    """A profile `vlmspec calibrate` wrote: --force replaces that, never one a person wrote."""
    return written_by(path, "calibrate") and is_profile(path)


def check_profile_write(path: Path, base_source: str, *, force: bool, inputs=()) -> None:
    """Before anything is measured: OutputRefused (one line) unless the calibrated profile
    may be written to ``path``. Never the base profile, nor a profile it includes, nor under
    the name of one (``--write tinyworld-caption`` would shadow the include and loop), even
    with ``force``; never over an input (``inputs``: the samples); an existing file only
    with ``force``, and only if it is a vlmspec profile."""
    from vlmspec_cli.profile import include_chain

    label = f"--write {path}"
    chain = include_chain(base_source)
    if same_file(path, chain[0]):
        raise OutputRefused(f"{label}: is the base profile, which the new profile includes: "
                            "pick another name")
    for included in chain:
        if same_file(path, included) or path.stem == included.stem:
            raise OutputRefused(f"{label}: would shadow profile '{included.stem}' ({included}), "
                                "which the new profile includes: pick another name")
    check_output(path, label, **_profile_rules(force, inputs))


def write_profile(path: Path, text: str, *, force: bool, inputs=()) -> None:
    """Write the calibrated profile (checked again, atomic, the folder created)."""
    write_checked(path, text.encode("utf-8"), f"--write {path}", **_profile_rules(force, inputs))


# ------------------------------------------------------------------ the winner, written
def _nested(settings: dict) -> dict:
    out: dict = {}
    for key, value in settings.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def winner_yaml(winner, base_source: str, name: str, include: str,
                table: list, task: str = "caption", pinned: dict | None = None) -> str:
    """A profile that includes the base one and sets the winner's settings, and the task
    it was calibrated for. ``pinned``: dotted settings the calibration ran with on top of
    the base (``--set``), written too (the winner's own settings take precedence), so the
    profile decodes what was calibrated."""
    import yaml

    data: dict = {"include": include, "name": name,
                  "description": f"calibrated from {base_source}: {winner.label}",
                  "task": task, **_nested({**(pinned or {}), **winner.settings})}
    lines = ["# written by `vlmspec calibrate`; candidates (τ model, predicted, measured):"]
    for c in table[:12]:
        measured = f"{c.speedup:.2f}x" if c.speedup is not None else "-"
        lines.append(f"#   {c.label:<40} τ≈{c.tau_model:.2f}  pred {c.predicted:.2f}x  meas {measured}")
    from vlmspec_cli.drafters import method_class

    if not method_class(winner.method).drafts:
        lines.append("# target-only decoding was measured fastest here: method none")
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
