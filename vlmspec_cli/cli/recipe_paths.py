"""The files a recipe's steps read and write, so that ``vlmspec run`` never keeps its state
in one of them (a caption step's ``--out``, a PNG that generate-image writes into its
``--out-dir``): the state would replace the step's output, or the step the state.

Each step is argv for a vlmspec command. Its values are parsed by that command's own
click parser (nothing converted, no file opened), and a parameter the step leaves out
counts with its default (generate-image writes into ``images/`` unless told otherwise).
The parameters' click types say which values are paths, so a new command's options are
covered without a list to maintain:

- a ``click.Path`` or ``click.File`` value, or a plain string one (INPUTS, ``--profile``,
  calibrate's ``--write``: any string a step is given may name a file; ``-`` is stdin or
  stdout, no file), is a path as given;
- a ``click.Path`` that only takes folders (``file_okay=False``: generate-image's
  ``--out-dir``) covers every file inside it too, since the step names the files it
  writes there (by prompt);
- ``DERIVED_PATHS``: the files a command makes of a value beyond the value itself
  (``--profile tuned`` reads, ``calibrate --write tuned`` writes, profiles/tuned.yaml;
  ``caption --executor ray --out caps.jsonl`` keeps shards in caps.jsonl.shards/).

A state path collides with a step's path when both name one file (links, ``..`` and
relative paths resolved; the same inode where both exist), when it lies inside such a
folder, or when it is a folder above one of the step's paths.  Knows click, not rich.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import click

from vlmspec_cli.fileio import same_file

__all__ = ["StepPath", "DERIVED_PATHS", "step_paths", "path_params", "state_collision",
           "READ_PARAMS", "resolve_reads", "missing_reads", "reads_fingerprint", "still_done"]


def _profile_file(name: str, given: Mapping) -> list[tuple[Path, bool]]:
    """``--profile NAME|PATH``: the profile file it reads (none: no such profile yet)."""
    from vlmspec_cli.profile import ProfileError, resolve_profile_path

    try:
        return [(resolve_profile_path(name), False)]
    except (ProfileError, OSError):  # OSError: e.g. a name too long to be a file's
        return []


def _written_profile(name: str, given: Mapping) -> list[tuple[Path, bool]]:
    """``calibrate --write NAME|FILE.yaml``: the profile file it writes."""
    from vlmspec_cli.tasks.calibrate_io import profile_write_path

    return [(profile_write_path(name), False)]


def _ray_shards(out: str, given: Mapping) -> list[tuple[Path, bool]]:
    """``caption --executor ray --out FILE``: the folder of the actors' shards."""
    if given.get("executor") != "ray":
        return []
    from vlmspec_cli.tasks.ray_executor import shard_dir_for

    return [(shard_dir_for(out), True)]


# (command, parameter name) -> what else the command makes of a value: [(path, folder)],
# given the step's other values; command "*" is every command. A table, since no click
# type says it; the value itself counts as a path anyway.
DERIVED_PATHS: dict[tuple[str, str], Callable[[str, Mapping], list[tuple[Path, bool]]]] = {
    ("*", "profile"): _profile_file,
    ("profiles", "name"): _profile_file,
    ("calibrate", "write_name"): _written_profile,
    ("caption", "out"): _ray_shards,
}


@dataclass(frozen=True)
class StepPath:
    """One path a step reads or writes: ``option`` as the user wrote it (``--out``,
    ``INPUTS``), ``value`` as given, ``path`` the file or folder (what the command makes
    of a value may differ from it), ``folder``: every file inside counts too."""
    option: str
    value: str
    path: str
    folder: bool = False
    name: str = ""      # the parameter's name ("" for a loose argument word)


def _label(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        return (param.metavar or param.name or "").upper().replace(".", "") or "ARGUMENT"
    longs = [o for o in param.opts if o.startswith("--")]
    return max(longs or param.opts, key=len)


def path_params(command: click.Command) -> dict[str, tuple[click.Parameter, bool]]:
    """The parameters of ``command`` whose values are paths: {name: (param, folder)}."""
    out = {}
    for param in command.params:
        if isinstance(param, click.Option) and (param.is_flag or param.count):
            continue
        kind = param.type
        if isinstance(kind, click.Path):
            out[param.name] = (param, not kind.file_okay)
        elif isinstance(kind, (click.File, click.types.StringParamType)):
            out[param.name] = (param, False)
    return out


def parsed_step(command: click.Command, argv: list[str]) -> tuple[click.Context, dict]:
    """The step's raw values by parameter name, as its command's parser reads argv."""
    ctx = click.Context(command, info_name=command.name, resilient_parsing=True)
    try:
        values, _, _ = command.make_parser(ctx).parse_args(list(argv))
    except click.ClickException:  # load_recipe built this argv, so this is not expected:
        values = {"": [a for a in argv if not a.startswith("-")]}  # every word may be a path
    return ctx, values


def _strings(value) -> list[str]:
    """The values that can name a file: not "-" (stdin, stdout), nor "", nor with a NUL."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, str) and v not in ("", "-") and "\0" not in v]


def step_paths(command: click.Command, argv: list[str]) -> Iterator[StepPath]:
    """Every path the step ``command argv`` reads or writes (see the module's rules)."""
    ctx, values = parsed_step(command, argv)
    for word in _strings(values.get("", [])):
        yield StepPath("ARGUMENT", word, word)
    for name, (param, folder) in path_params(command).items():
        given = values.get(name)
        if given is None:
            given = param.get_default(ctx, call=True)
        derive = DERIVED_PATHS.get((command.name, name)) or DERIVED_PATHS.get(("*", name))
        for value in _strings(given):
            yield StepPath(_label(param), value, value, folder, name)
            for path, inside in derive(value, values) if derive else ():
                if not same_file(path, value):
                    yield StepPath(_label(param), value, os.fspath(path), inside, name)


def _ancestors(path: str | os.PathLike) -> list[Path]:
    return list(Path(os.path.realpath(path)).parents)


def _relation(state: Path, used: StepPath) -> str | None:
    """How the state path collides with ``used``, as a phrase, or None."""
    if same_file(state, used.path):
        return "is"
    if used.folder and any(same_file(folder, used.path) for folder in _ancestors(state)):
        return "is inside"
    if any(same_file(folder, state) for folder in _ancestors(used.path)):
        return "is a folder above"
    return None


def state_collision(state_path: str | os.PathLike, recipe, commands: Mapping[str, click.Command]
                    ) -> str | None:
    """Why ``state_path`` may not hold ``recipe``'s state, in one line naming the step and
    its path; None when no step reads or writes it."""
    state = Path(state_path)
    for step in recipe.steps:
        for used in step_paths(commands[step.command], step.argv):
            how = _relation(state, used)
            if how is None:
                continue
            what = f"{used.option} {used.value}"
            if used.path != used.value:
                what += f" ({'folder' if used.folder else 'file'} {used.path})"
            kind = ("a folder that step writes or reads files in" if how == "is inside"
                    else "a path that step reads or writes")
            return (f"state file {state}: {how} {what} of step {step.index} ({step.command}, "
                    f"{recipe.path}:{step.line}), {kind}: give another --state PATH")
    return None


# ------------------------------------------------------------ what a step reads
# The parameters whose values a step reads (by parameter name): a relative one written in
# the recipe is looked up next to the recipe file first (as a profile's include: is), then
# in the current directory; what a step writes (--out, --write, --plot, --trace,
# --out-dir) stays relative to the current directory, and so does every value that takes
# a --var (the user typed it there). ``profile`` and ``name`` are profile names or files.
READ_PARAMS = ("inputs", "samples", "dataset", "chat_file", "prompts_file", "profile", "name",
               "heads", "twigs")
_PROFILE_PARAMS = ("profile", "name")
# the reads that must exist before a recipe runs (a calibrate SAMPLE may be a prompt, a
# profile a name, a head a hub id: those are their commands' to check)
CHECKED_READS = ("inputs", "dataset", "chat_file", "prompts_file")
_GLOB = re.compile(r"[*?[]")
_VAR_NAMES = re.compile(r"\$\{([^}]*)\}")


def _next_to(folder: Path, value, profile: bool):
    """``value`` as a path next to the recipe when something is there (a file for a
    profile, else a file, folder or glob match), relative to the current directory when
    it lies below it, else absolute; else ``value`` as given."""
    if not isinstance(value, str) or value in ("", "-") or "\0" in value or os.path.isabs(value):
        return value
    here = folder / value
    found = (here.is_file() if profile else
             os.path.lexists(here) or (_GLOB.search(value) and glob.glob(str(here), recursive=True)))
    if not found:
        return value
    # as the current directory names it (imgs, examples/images), else absolute
    rel = os.path.relpath(here)
    return os.path.abspath(here) if rel == ".." or rel.startswith(".." + os.sep) else rel


def resolve_reads(param_names: Mapping[str, str], raw: Mapping, options: Mapping, folder: Path,
                  overrides: set) -> dict:
    """A step's ``options`` (recipe key -> value, ``${vars}`` substituted from ``raw``) with
    the paths it reads resolved against the recipe's ``folder`` (see READ_PARAMS);
    ``param_names``: recipe key -> parameter name; ``overrides``: the --var names."""
    folder = Path(os.path.abspath(folder))
    out = dict(options)
    for key, value in options.items():
        name = param_names.get(str(key).replace("-", "_"))
        if name not in READ_PARAMS:
            continue
        profile = name in _PROFILE_PARAMS

        def resolved(word, value):
            if isinstance(word, str) and set(_VAR_NAMES.findall(word)) & overrides:
                return value   # a --var value: the current directory's
            if isinstance(value, list):
                return [_next_to(folder, v, profile) for v in value]
            return _next_to(folder, value, profile)

        given = raw.get(key)
        if isinstance(given, list) and isinstance(value, list) and len(given) == len(value):
            out[key] = [resolved(w, v) for w, v in zip(given, value)]
        else:   # one word ("${list_var}" included)
            out[key] = resolved(given, value)
    return out


def _within(path: str, used: StepPath) -> bool:
    real, other = os.path.abspath(path), os.path.abspath(used.path)
    return real == other or (used.folder and real.startswith(other.rstrip(os.sep) + os.sep))


def missing_reads(recipe, commands: Mapping[str, click.Command]) -> list[str]:
    """One line per step whose paths of a kind it reads (CHECKED_READS) are none of them
    there, nor named by an earlier step (written by it, like a caption step's --out):
    checked before step 1, so a recipe does not run for minutes and then stop on a typo."""
    problems, earlier = [], []
    for step in recipe.steps:
        command = commands[step.command]
        ctx, values = parsed_step(command, step.argv)
        for name in CHECKED_READS:
            param = next((p for p in command.params if p.name == name), None)
            if param is None:
                continue
            raw = values.get(name) or []
            if "" in (raw if isinstance(raw, (list, tuple)) else [raw]):   # a --var left empty
                problems.append(f"{recipe.path}:{step.line}: step {step.index} ({step.command}): "
                                f"{_label(param)} '': an empty path names no file")
                continue
            given = _strings(raw)
            missing = [value for value in given
                       if not (_GLOB.search(value) or os.path.lexists(value)
                               or any(_within(value, used) for used in earlier))]
            # a step with one input there runs (the missing ones fail alone, exit 1, as
            # on the command line); one with none there could only fail
            for value in missing[:1] if missing == given else []:
                problems.append(f"{recipe.path}:{step.line}: step {step.index} ({step.command}): "
                                f"{_label(param)} {value}: no such file or directory (a path "
                                "written in a recipe is looked up next to the recipe, then in "
                                "the current directory; a --var value in the current directory)")
        earlier += list(step_paths(command, step.argv))
    return problems


# ------------------------------------------------------------ whether a done step still is
# What a step writes (by parameter name): a step the state file records as done runs again
# when one of them is gone (a user deleted captions.jsonl; the rerun said "done" and left
# nothing). A default counts (generate-image writes into images/).
WRITE_PARAMS = ("out", "write_name", "write_path", "plot_path", "trace_file", "out_dir")
# The commands whose --out records what is done, so that a rerun skips it by itself: a step
# of theirs also runs again when what it reads changed since it finished (images added to
# its folder were never captioned: the step was "done"); rerunning it decodes only those.
RESUMING = ("caption", "describe-video")
_MAX_ENTRIES = 200_000        # files a fingerprint looks at, at most (then: changed)


def missing_writes(command: click.Command, argv: list[str]) -> str | None:
    """The first file or folder the step writes that is not there (as "--out caps.jsonl")."""
    ctx, values = parsed_step(command, argv)
    for name, (param, _) in path_params(command).items():
        if name not in WRITE_PARAMS:
            continue
        given = values.get(name)
        if given is None:
            given = param.get_default(ctx, call=True)
        derive = DERIVED_PATHS.get((command.name, name))
        for value in _strings(given):
            made = [path for path, _ in derive(value, values)] if derive else []
            if not all(os.path.lexists(p) for p in made or [value]):
                return f"{_label(param)} {value}"
    return None


def reads_fingerprint(command: click.Command, argv: list[str], skip=()) -> str | None:
    """A hash of what a RESUMING step reads (CHECKED_READS: the files its inputs expand to
    and its other files, with sizes and modification times; ``skip``: paths left out, the state file), to tell
    at a rerun whether it changed; None for other commands."""
    if command.name not in RESUMING:
        return None
    _, values = parsed_step(command, argv)
    left_out = {os.path.abspath(p) for p in skip}
    seen: list[str] = []
    for name in CHECKED_READS:
        words = _strings(values.get(name) or [])
        tops = (_decoded(command.name, words) if name == "inputs" else
                [top for value in words for top in (
                    sorted(glob.glob(value, recursive=True)) if _GLOB.search(value) else [value])])
        for top in tops:
            seen += _entries(top, left_out, _MAX_ENTRIES - len(seen))
            if len(seen) >= _MAX_ENTRIES:
                return "too many files"
    return hashlib.sha256("\n".join(seen).encode("utf-8", "surrogateescape")).hexdigest()


def _decoded(command_name: str, words: list[str]) -> list[str]:
    """The inputs the command itself takes from its arguments, by its own expansion
    (caption: image files; describe-video: videos, or a folder of frames as one input), so
    that a file of another kind written into an input folder (a later step's JSONL, a
    plot) changes nothing: walking the folders made such a step rerun at every ``run``."""
    if command_name == "describe-video":
        from vlmspec_cli.tasks.video import expand_video_inputs as expand
    else:
        from vlmspec_cli.tasks.inputs import expand_inputs as expand
    return [item.path for item in expand([w for w in words if w != "-"])]


def _entries(top: str, left_out: set, room: int) -> list[str]:
    """"path size mtime_ns" of ``top`` (a file) or of every file below it (a folder)."""
    def entry(path: str) -> str:
        try:
            st = os.stat(path)
            return f"{path}\t{st.st_size}\t{st.st_mtime_ns}"
        except OSError:
            return f"{path}\tmissing"
    if not os.path.isdir(top):
        return [] if os.path.abspath(top) in left_out else [entry(top)]
    out = []
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.abspath(path) not in left_out:
                out.append(entry(path))
        if len(out) >= room:
            break
    return out


def still_done(entry, digest: str, command: click.Command, argv: list[str], state_path
               ) -> str | None:
    """None when the state's ``entry`` says the step (``digest``: of its argv) is done and
    still is: the same argv, what it wrote still there, what a RESUMING step reads
    unchanged. Else why not, as a phrase ("" when never done, or done with another argv)."""
    if not isinstance(entry, dict) or entry.get("argv_sha256") != digest:
        return ""
    gone = missing_writes(command, argv)
    if gone is not None:
        return f"{gone} is not there"
    now = reads_fingerprint(command, argv, skip=[state_path])
    if now is not None and now != entry.get("reads_sha256"):
        return "what it reads changed since (it skips what it recorded)"
    return None
