"""``vlmspec run``: a recipe of vlmspec steps (cli/recipes.py does the work)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from vlmspec_cli.cli.common import nonempty_path


EPILOG_RUN = """\b
Examples:
  # a shipped recipe by its name, from any folder; a rerun resumes
  vlmspec run caption-folder --var folder=shots/
  vlmspec run recipes/caption-folder.yaml
  vlmspec run recipes/caption-folder.yaml \\
      --var folder=shots/ --var out=shots.jsonl
  # print each step's command
  vlmspec run recipes/calibrate-then-caption.yaml --dry-run
  # ignore the state file
  vlmspec run recipe.yaml --restart

Exit codes: 0 every step done, 1 some step had failed inputs (the other
steps still ran), 2 invalid recipe, or a step's usage, profile or model error
(the recipe stops there).
"""


@click.command("run", epilog=EPILOG_RUN)
@click.argument("recipe", metavar="RECIPE")
@click.option("--var", "var_pairs", multiple=True, metavar="KEY=VALUE",
              help="Set a recipe variable, used as ${KEY} (repeatable; overrides vars:).")
@click.option("--state", type=click.Path(dir_okay=False), metavar="PATH", callback=nonempty_path,
              help="State file of finished steps [default: ./RECIPE-STEM.state.json].")
@click.option("--restart", is_flag=True, help="Ignore the state file: run every step again.")
@click.option("--dry-run", is_flag=True, help="Check the recipe and print each step's command; run nothing.")
def run_recipe(recipe, var_pairs, state, restart, dry_run):
    """Run a recipe: a YAML list of vlmspec steps (see recipes/README.md). RECIPE is a
    file, or the name of a shipped one (caption-folder, calibrate-then-caption).

    The whole recipe is checked first (commands, options, ${vars}); errors name
    the file and line, and nothing runs. Steps run in order. A step that
    finished is recorded in the state file and skipped on a rerun while its
    command line is unchanged and what it wrote is still there; caption steps with
    --out resume on their own, and run again when their inputs changed.
    """
    from vlmspec_cli.cli.recipes import cli_run

    commands = click.get_current_context().find_root().command.commands  # vlmspec's commands
    sys.exit(cli_run(commands, recipe_file(recipe), var_pairs, state, restart, dry_run))


def recipe_file(name: str) -> str:
    """RECIPE as a file: the path given, or a shipped recipe's name (``caption-folder``,
    with or without ``.yaml``) when no such path exists; a usage error otherwise."""
    if os.path.isdir(name):
        raise click.BadParameter(f"'{name}' is a directory, not a recipe file", param_hint="RECIPE")
    if os.path.lexists(name):
        return name
    shipped = shipped_recipes()
    stem = name[:-5] if name.endswith(".yaml") else name
    if os.sep not in name and stem in shipped:
        return str(shipped[stem])
    raise click.BadParameter(f"no file '{name}', nor a shipped recipe of that name (shipped: "
                             f"{', '.join(shipped) or 'none'})", param_hint="RECIPE")


def shipped_recipes() -> dict[str, Path]:
    """The recipes vlmspec ships (the package's recipes/), by name."""
    try:
        from importlib.resources import files
        folder = files("vlmspec_cli.recipes")
        folder = folder if isinstance(folder, Path) else None
    except (ImportError, TypeError, ModuleNotFoundError):
        folder = None
    folder = folder or Path(__file__).resolve().parents[2] / "recipes"   # a source checkout
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}

