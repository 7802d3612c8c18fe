"""May a command write this file? The one rule every whole-file output follows.

vlmspec never destroys a file. A whole-file output (a PNG, a heatmap, a profile, a plot, a
recipe state file) may be written

- when nothing is there yet, or
- with ``force``, over a file in that output's own format (``ours``: a PNG vlmspec wrote
  over a PNG vlmspec wrote, a vlmspec profile over a vlmspec profile), never over anything
  else (said first, with or without ``force``: --force would not help), and
- never over an input of the same run (the samples, the profile it reads, the recipe).

:func:`refusal` says why not (one phrase, no path: callers name the file or option).
Decide with :func:`refusal` before any work (before models load or images decode), then
write with :func:`write_checked` (fileio.write_new: atomic, and without ``force`` never
replacing a file that appeared meanwhile). Knows nothing of click or rich.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Callable, Iterable

from vlmspec_cli.fileio import same_file, write_new
from vlmspec_cli.png_mark import PNG_MARK, PNG_SIGNATURE
MAX_OWN_BYTES = 1 << 20    # a profile or state file is a few KB; a bigger one is not ours


class OutputRefused(Exception):
    """A file may not be written; the message is one line naming it and why."""


def refusal(path: str | os.PathLike, *, force: bool, ours: Callable[[Path], bool], what: str,
            inputs: Iterable[str | os.PathLike] = (),
            exists_hint: str = "use --force to overwrite",
            foreign_hint: str = "not overwritten, even with --force") -> str | None:
    """Why ``path`` may not be written (e.g. "exists (use --force to overwrite)"), or None.
    ``what`` names the format in messages ("PNG image", "vlmspec profile"); a command
    that owns its file outright (a recipe's state file) passes ``force=True``."""
    p = Path(path)
    if any(same_file(p, i) for i in inputs):
        return "is an input of this run: write the output somewhere else"
    if p.is_dir():
        return "is a directory"
    if not (p.exists() or p.is_symlink()):
        return _folder_problem(p.parent)
    if not p.exists():                   # a link to nothing: not a file of anyone's format
        return f"is a symbolic link to a missing file ({os.readlink(p)}): {foreign_hint}"
    if not p.is_file() or not ours(p):   # said first: --force would not help
        return f"exists and is not a {what}: {foreign_hint}"
    if not force:
        return f"exists ({exists_hint})"
    return None


def _folder_problem(folder: Path) -> str | None:
    """Why a new file cannot be made in ``folder`` (created if missing), or None."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent                 # the nearest folder that exists
    if not folder.is_dir():
        return f"cannot be created: {folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot be created: folder {folder} is not writable"
    return None


def check_output(path: str | os.PathLike, label: str | None = None, **rules) -> None:
    """:func:`refusal` as an exception: ``OutputRefused("LABEL: reason")`` (label: the path,
    or e.g. "--write hw.yaml")."""
    reason = refusal(path, **rules)
    if reason is not None:
        raise OutputRefused(f"{label or path}: {reason}")


def write_checked(path: str | os.PathLike, data: bytes, label: str | None = None, **rules) -> None:
    """Write a whole-file output once its work is done: the rule is checked again (a file
    may have appeared meanwhile), the parent folder created, the write atomic and, without
    ``force``, never over a file (not even one that appears during the write)."""
    check_output(path, label, **rules)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_new(path, data, rules["force"])
    except FileExistsError:
        raise OutputRefused(f"{label or path}: exists (use --force to overwrite)") from None
    except OSError as exc:
        raise OutputRefused(f"{label or path}: cannot write: {exc.strerror or exc}") from None


# Every PNG vlmspec writes (images, heatmaps, plots) says so in a tEXt chunk, Software =
# PNG_MARK (png_mark.py mark_png), and only such a PNG is "ours" to replace with --force: a
# person's photo named as a --plot or an image's file is a PNG too (a PNG signature alone
# let `profile --plot photo.png --force` replace it, saying it was an earlier plot).
_PNG_TEXT_BYTES = 8 << 20    # a text chunk vlmspec writes (a prompt of 1 MiB, escaped) is under this
_PNG_CHUNKS = 64             # chunks read looking for the text, before the image data


def png_text(path: Path) -> dict[str, str] | None:
    """The tEXt chunks before the image data of the PNG at ``path``; None when it is not a
    readable PNG file. Reads chunk headers only (bounded), never the image."""
    out: dict[str, str] = {}
    try:
        with open(path, "rb") as fh:
            if fh.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                return None
            for _ in range(_PNG_CHUNKS):
                head = fh.read(8)
                if len(head) < 8:
                    break
                size, kind = struct.unpack(">I", head[:4])[0], head[4:]
                if kind in (b"IDAT", b"IEND"):
                    break
                if kind != b"tEXt" or size > _PNG_TEXT_BYTES:
                    fh.seek(size + 4, os.SEEK_CUR)
                    continue
                key, _, value = fh.read(size).partition(b"\0")
                fh.seek(4, os.SEEK_CUR)
                out[key.decode("latin-1")] = value.decode("latin-1")
    except OSError:
        return None
    return out


def is_own_png(path: Path) -> bool:
    """A PNG vlmspec wrote (its Software text chunk says so)."""
    text = png_text(path)
    return text is not None and text.get("Software") == PNG_MARK


# the rule of every PNG output (images, heatmaps, plots): refusal(path, force=..., **OWN_PNG)
OWN_PNG = {"ours": is_own_png, "what": "PNG image vlmspec wrote"}


def written_by(path: Path, command: str) -> bool:
    """Whether the file starts with the line vlmspec COMMAND writes first ("# written by
    `vlmspec calibrate`..."): a profile of vlmspec's own, not one a person wrote."""
    mark = f"# written by `vlmspec {command}`".encode()
    try:
        with open(path, "rb") as fh:
            return fh.read(len(mark)) == mark
    except OSError:
        return False


def is_profile(path: Path, required: str | None = None) -> bool:
    """A vlmspec profile: a YAML mapping whose keys are all profile keys (or ``include``),
    with ``required`` among them when given (``hardware`` for a hardware profile)."""
    from vlmspec_cli.profile import profile_keys
    from vlmspec_cli.profile.yaml_file import YamlFileError, load_file

    try:  # a regular UTF-8 file, bounded in size, nesting and aliases
        if path.stat().st_size > MAX_OWN_BYTES:
            return False
        data = load_file(path)
    except (OSError, YamlFileError):
        return False
    if not isinstance(data, dict) or not data:
        return False
    allowed = {k.split(".")[0] for k in profile_keys()} | {"include"}
    return set(map(str, data)) <= allowed and (required is None or required in data)


