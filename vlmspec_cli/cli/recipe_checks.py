"""What ``vlmspec run`` checks of a recipe's profiles before step 1 (and under --dry-run):
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

from vlmspec_cli.cli.recipe_paths import parsed_step, step_paths


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
