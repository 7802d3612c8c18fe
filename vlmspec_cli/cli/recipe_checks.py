"""What ``vlmspec run`` checks of a recipe's steps before step 1 (and under --dry-run): a step
that would write one of the files it reads (``caption a.png --out a.png``: the step's own
command refuses it when it runs, after the steps before it; ``own_reads_written``), and
each step's ``profile``, its ``set`` overrides and its method(s), as the step's command
would load them. Without it a recipe's ``set: [drafting.gama=3]``, ``method: chian`` or
``profile: nope`` passed --dry-run and stopped the recipe at that step, after the steps
before it had run (a profile step takes minutes). A profile an earlier step writes
(``calibrate --write NAME``) is not there yet: that step's overrides are checked against
the defaults, whose keys and types are every profile's. Knows click, not rich.
"""

from __future__ import annotations

import os
from typing import Mapping

import click

from vlmspec_cli.cli.recipe_paths import (READ_PARAMS, WRITE_PARAMS, StepPath, parsed_step,
                                          step_paths)
from vlmspec_cli.fileio import same_file


def profile_problems(recipe, commands: Mapping[str, click.Command]) -> list[str]:
    """One line per step whose profile, overrides or method its command would refuse."""
    from vlmspec_cli.profile import ProfileError, load_profile

    problems, written = [], []
    for step in recipe.steps:
        command = commands[step.command]
        names = {p.name for p in command.params}
        where = f"{recipe.path}:{step.line}: step {step.index} ({step.command}): "
        if "sets" in names:
            _, values = parsed_step(command, step.argv)
            profile = values.get("profile") if "profile" in names else None
            if profile is not None and _later(profile, written):
                profile = None   # an earlier step writes it: its keys are checked alone
            try:
                loaded = load_profile(profile, list(values.get("sets") or ()))
            except ProfileError as exc:
                problems.append(where + str(exc))
                loaded = None
            methods = [values["method"]] if values.get("method") else []
            methods += [m.strip() for m in str(values.get("methods") or "").split(",") if m.strip()]
            if loaded is not None and not methods:
                methods = [loaded.method]
            problems += [where + m for m in _unknown_methods(methods)]
        written += [p.path for p in step_paths(command, step.argv)]
    return problems


def _later(profile: str, written: list[str]) -> bool:
    """The profile is not there, and an earlier step names its file (it writes it)."""
    from vlmspec_cli.profile import ProfileError, resolve_profile_path
    from vlmspec_cli.tasks.calibrate_io import profile_write_path

    try:
        resolve_profile_path(profile)
        return False
    except (ProfileError, OSError):
        pass
    try:
        target = os.path.abspath(profile_write_path(profile))
    except (ValueError, OSError):
        return False
    return any(os.path.abspath(p) == target for p in written)


def _unknown_methods(methods: list[str]) -> list[str]:
    if not methods:
        return []
    from vlmspec_cli.drafters.base import method_class

    out = []
    for name in methods:
        try:
            method_class(name)
        except ValueError as exc:
            out.append(str(exc))
    return out


def own_reads_written(recipe, commands: Mapping[str, click.Command]) -> list[str]:
    """One line per step that writes (an output option: ``--out``, ``--trace`` ...) a file
    it also reads (an input, its profile) or the recipe itself, as its command would refuse
    when it runs."""
    problems = []
    for step in recipe.steps:
        paths = list(step_paths(commands[step.command], step.argv))
        writes = [u for u in paths if u.name in WRITE_PARAMS and not u.folder]
        reads = [u for u in paths if u.name in READ_PARAMS or u.name == ""]
        reads.append(StepPath("the recipe", str(recipe.path), str(recipe.path)))
        hit = next(((w, r) for w in writes for r in reads if same_file(w.path, r.path)), None)
        if hit is not None:
            (w, r), where = hit, f"{recipe.path}:{step.line}: step {step.index} ({step.command})"
            problems.append(f"{where}: {w.option} {w.value} is also what it reads ({r.option} "
                            f"{r.value}); vlmspec never writes to its inputs")
    return problems
