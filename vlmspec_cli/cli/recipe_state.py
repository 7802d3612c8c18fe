"""``vlmspec run``'s state file: which steps of a recipe finished (``<stem>.state.json`` in
the current directory, or ``--state PATH``), read and written so that it never replaces a
file that is not one, nor takes over another recipe's."""

from __future__ import annotations

import json
from pathlib import Path

from vlmspec_cli.fileio import atomic_write_text, same_file
from vlmspec_cli.tasks.output_files import MAX_OWN_BYTES, OutputRefused, check_output

__all__ = ["default_state_path", "is_state_file", "check_state_path", "read_state",
           "state_owner", "write_state"]


def default_state_path(recipe_path) -> Path:
    return Path(f"{Path(recipe_path).stem}.state.json")


def is_state_file(path: Path) -> bool:
    """A state file ``vlmspec run`` wrote: a JSON object with a version and a steps mapping."""
    try:
        if path.stat().st_size > MAX_OWN_BYTES:
            return False
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):   # RecursionError: JSON nested 100k deep
        return False
    return isinstance(state, dict) and "version" in state and isinstance(state.get("steps"), dict)


def check_state_path(state_path: Path, recipe_path) -> None:
    """OutputRefused unless the state file may be (re)written: never the recipe itself,
    never an existing file that is not a state file (a user's data under that name)."""
    label = f"state file {state_path}"
    if same_file(state_path, recipe_path):
        raise OutputRefused(f"{label}: is the recipe itself; give another --state PATH")
    check_output(state_path, label, force=True, ours=is_state_file,
                 what="vlmspec recipe state file",
                 foreign_hint="not overwritten (give another --state PATH)")


def read_state(path: Path, ui) -> dict:
    """The finished steps the state file records. A file that is not a vlmspec recipe
    state is never overwritten (check_state_path refuses it before a run): a warning here."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict) or not isinstance(state.get("steps"), dict):
            raise ValueError("not a JSON object with steps")
        return state["steps"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        why = (exc.strerror if isinstance(exc, OSError) and exc.strerror else
               "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc))
        ui.warning(f"{path}: not a vlmspec recipe state file ({why}); a run would refuse it")
        return {}


def state_owner(path: Path) -> str | None:
    """The recipe a state file records (None: no state file there, or none named)."""
    try:
        state = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError, RecursionError):
        return None
    return state.get("recipe") if isinstance(state, dict) and isinstance(state.get("recipe"), str) else None


def write_state(path: Path, recipe, done: dict) -> None:
    """Replace the state file; checked again at every write (OutputRefused, nothing
    written): a step may have made a file there since the run began."""
    check_state_path(path, recipe.path)
    state = {"version": 1, "recipe": str(recipe.path.resolve()), "steps": done}
    atomic_write_text(path, json.dumps(state, indent=2) + "\n")
