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

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import click

from vlmspec_cli.fileio import same_file

__all__ = ["StepPath", "DERIVED_PATHS", "step_paths", "path_params", "state_collision"]


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


def _parsed(command: click.Command, argv: list[str]) -> tuple[click.Context, dict]:
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
    ctx, values = _parsed(command, argv)
    for word in _strings(values.get("", [])):
        yield StepPath("ARGUMENT", word, word)
    for name, (param, folder) in path_params(command).items():
        given = values.get(name)
        if given is None:
            given = param.get_default(ctx, call=True)
        derive = DERIVED_PATHS.get((command.name, name)) or DERIVED_PATHS.get(("*", name))
        for value in _strings(given):
            yield StepPath(_label(param), value, value, folder)
            for path, inside in derive(value, values) if derive else ():
                if not same_file(path, value):
                    yield StepPath(_label(param), value, os.fspath(path), inside)


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
