"""``vlmspec run RECIPE.yaml``: a YAML list of vlmspec subcommands, run in order.

A recipe is checked whole before anything runs (unknown keys, commands and
options, undefined ``${vars}``, bad option values); each error names the file
and the step's line.  Steps then run in-process through their click command.
Exit 1 from a step (some inputs failed, the rest done) lets the recipe go on
and makes its final code 1; any other failure stops it.  After every step that
exits 0, ``<recipe stem>.state.json`` records the step's index and the hash of
its argv, so a rerun skips it while its argv is unchanged.  See recipes/README.md.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import click
import yaml

from vlmspec_cli.profile.yaml_file import YamlFileError, check_events, read_text
from vlmspec_cli.cli.recipe_checks import own_reads_written, profile_problems
from vlmspec_cli.cli.recipe_paths import (missing_reads, reads_fingerprint, resolve_reads,
                                          state_collision, still_done)
from vlmspec_cli.cli.recipe_state import (check_state_path, default_state_path, read_state,
                                          state_owner, write_state)
from vlmspec_cli.suggest import did_you_mean
from vlmspec_cli.tasks.output_files import OutputRefused
from vlmspec_cli.cli.stops import stop_code
from vlmspec_cli.cli.types import IntList

__all__ = ["RecipeError", "Recipe", "Step", "load_recipe", "parse_vars", "run_recipe", "cli_run"]

TOP_KEYS = ("name", "description", "vars", "steps")
_VAR = re.compile(r"\$(?:\$|\{([^}]*)\})")  # $$ is a literal $, ${name} a variable
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_CHECKED_TYPES = (click.types.IntParamType, click.types.FloatParamType,
                  click.types.BoolParamType, click.Choice, IntList)


class RecipeError(Exception):
    """The recipe is invalid; one message per problem, each starting with FILE:LINE."""

    def __init__(self, messages: list[str]):
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass
class Step:
    index: int  # 1-based
    line: int
    command: str
    argv: list[str]

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.command, *self.argv]).encode()).hexdigest()

    def shell(self) -> str:
        return shlex.join(["vlmspec", self.command, *self.argv])


@dataclass
class Recipe:
    path: Path
    name: str
    description: str
    steps: list[Step]


def parse_vars(pairs) -> dict[str, str]:
    """``("k=v", ...)`` from ``--var`` → dict; raises click.BadParameter."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _NAME.match(key.strip()):
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--var")
        out[key.strip()] = value
    return out


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _substitute(value, variables: Mapping[str, Any], used: set, problems: list):
    """Replace ``${name}`` in strings (recursively in lists).  A string that is exactly
    ``${name}`` takes the variable's value as is (a list stays a list, null omits)."""
    if isinstance(value, list):
        return [_substitute(v, variables, used, problems) for v in value]
    if not isinstance(value, str):
        return value
    whole = _VAR.fullmatch(value)
    if whole and whole.group(1) in variables:
        used.add(whole.group(1))
        return variables[whole.group(1)]

    def repl(m):
        name = m.group(1)
        if name is None:
            return "$"
        used.add(name)
        if name not in variables:
            hint = did_you_mean(name, variables, show="${{{}}}".format)
            problems.append(f"undefined variable ${{{name}}}{hint}; "
                            f"define it under 'vars:' or pass --var {name}=VALUE")
        elif isinstance(variables[name], list):
            problems.append(f"variable ${{{name}}} is a list: it can only stand alone, "
                            f"not inside '{value}'")
        else:
            return _text(variables[name])
        return m.group(0)

    return _VAR.sub(repl, value)


def _param_keys(command: click.Command):
    """Recipe keys of a command: {key: (param, option string or None)}.  Arguments answer
    to their name and metavar (``inputs``, ``samples``); options to each long option
    (``max_new_tokens``) and their parameter name (``drafting_inputs``)."""
    keys: dict[str, tuple[click.Parameter, str | None]] = {}
    for p in command.params:
        if isinstance(p, click.Option):
            longs = [o for o in p.opts + p.secondary_opts if o.startswith("--")] or p.opts
            for o in longs:
                keys.setdefault(o.lstrip("-").replace("-", "_"), (p, o))
            if p.name:
                keys.setdefault(p.name, (p, longs[0]))
    for p in command.params:
        if isinstance(p, click.Argument):
            meta = re.sub(r"[^a-z0-9_]", "", (p.metavar or "").lower().replace("...", ""))
            for k in {p.name, meta} - {None, ""}:
                keys[k] = (p, None)  # arguments win: caption's `inputs` are its INPUTS
    return keys


def _step_argv(command: click.Command, name: str, options: dict, err) -> list[str]:
    keys = _param_keys(command)
    positional: dict[str, list[str]] = {}
    argv: list[str] = []
    given = set()
    for raw_key, value in options.items():
        key = str(raw_key).replace("-", "_")
        if key not in keys:
            err(f"unknown option '{raw_key}' for {name}" + did_you_mean(key, keys))
            continue
        param, opt = keys[key]
        given.add(param.name)
        if value is None or isinstance(value, dict) or (
                isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value)):
            if value is not None:
                err(f"option '{raw_key}' of {name}: expected a value or a list of values")
            continue
        values = value if isinstance(value, list) else [value]
        if opt is None:  # positional argument(s)
            if isinstance(value, list) and param.nargs == 1:
                err(f"'{raw_key}' of {name} takes one value, not a list")
            positional[param.name] = [_text(v) for v in values]
            continue
        if getattr(param, "is_flag", False):
            if not isinstance(value, bool):
                err(f"option '{raw_key}' of {name} is a flag: use true or false, not {value!r}")
            elif value:
                argv.append(opt)
            elif opt in param.opts and param.secondary_opts:
                argv.append(param.secondary_opts[0])
            continue
        if isinstance(value, list) and not param.multiple and param.nargs == 1:
            err(f"option '{raw_key}' of {name} takes one value, not a list")
            continue
        if param.nargs > 1 and not param.multiple:  # one option, several values
            if len(values) != param.nargs:
                err(f"option '{raw_key}' of {name} takes {param.nargs} values")
            argv += [opt, *map(_text, values)]
            continue
        for v in values:
            if isinstance(v, bool) and not isinstance(param.type, click.types.BoolParamType):
                err(f"option '{raw_key}' of {name} takes a value, not {_text(v)}")
                continue
            if isinstance(param.type, _CHECKED_TYPES):
                try:
                    param.type.convert(_text(v), param, None)
                except click.BadParameter as exc:
                    err(f"invalid value for '{raw_key}' of {name}: {exc.message}")
            argv += [opt, _text(v)]
    for p in command.params:
        if p.required and p.name not in given:
            err(f"{name} needs '{p.name}'")
    args = [a for p in command.params if p.name in positional for a in positional[p.name]]
    if any(a.startswith("-") and a != "-" for a in args):
        return argv + ["--"] + args
    return args + argv


def _compose(path: Path):
    shown = str(path)
    try:  # a regular UTF-8 file of at most 1 MiB, nesting and aliases bounded
        text = read_text(path, "recipe")
        check_events(text)
    except YamlFileError as exc:
        raise RecipeError([f"{shown}: {exc}"]) from None
    except yaml.YAMLError:
        pass  # the same error again, with its place, from the load below
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        bad = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        hint = " (quote values that hold ${...})" if "${" in bad else ""
        raise RecipeError([f"{shown}{where}: invalid YAML: {exc.problem or exc.context}{hint}"]) from exc
    except yaml.YAMLError as exc:
        raise RecipeError([f"{shown}: invalid YAML: {exc}"]) from exc
    finally:
        loader.dispose()


def _duplicates(node) -> list:
    seen, dups = set(), []
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value != "<<":
            (dups.append(k) if k.value in seen else seen.add(k.value))
    return dups


def _step_options(command: click.Command, options: dict, variables, used: set, err,
                  folder: Path, overrides: set) -> dict:
    """A step's options with ``${vars}`` substituted and the paths it reads resolved next
    to the recipe (a --var value: the current directory's; recipe_paths.resolve_reads)."""
    problems: list[str] = []
    given = {k: _substitute(v, variables, used, problems) for k, v in options.items()}
    for message in dict.fromkeys(problems):
        err(message)
    names = {k: p.name for k, (p, _) in _param_keys(command).items()}
    return resolve_reads(names, options, given, folder, overrides)


def load_recipe(path, commands: Mapping[str, click.Command],
                overrides: Mapping[str, str] | None = None) -> Recipe:
    """Parse and check a recipe; every step's argv resolved.  Raises RecipeError."""
    path = Path(path)
    shown = str(path)
    errors: list[str] = []
    root, data = _compose(path)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        line = root.start_mark.line + 1 if root is not None else 1
        raise RecipeError([f"{shown}:{line}: a recipe is a mapping with a 'steps:' list"])
    nodes = {k.value: (k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    for k in _duplicates(root):
        errors.append(f"{shown}:{k.start_mark.line + 1}: duplicate key '{k.value}'")
    for key in data:
        if key not in TOP_KEYS:
            line = nodes[key][0].start_mark.line + 1 if key in nodes else 1
            errors.append(f"{shown}:{line}: unknown key '{key}'" + did_you_mean(key, TOP_KEYS)
                          + f"; valid keys: {', '.join(TOP_KEYS)}")
    for key in ("name", "description"):
        if data.get(key) is not None and not isinstance(data[key], str):
            errors.append(f"{shown}:{nodes[key][0].start_mark.line + 1}: '{key}' must be a string")
    variables = data.get("vars") or {}
    if not isinstance(variables, dict):
        errors.append(f"{shown}:{nodes['vars'][0].start_mark.line + 1}: 'vars' must be a mapping")
        variables = {}
    for k, v in variables.items():
        if not _NAME.match(str(k)) or isinstance(v, dict) or (
                isinstance(v, list) and any(isinstance(x, (list, dict)) for x in v)):
            errors.append(f"{shown}:{nodes['vars'][0].start_mark.line + 1}: var '{k}': names are "
                          "letters, digits, _ and -; values are scalars or lists of scalars")
    variables = {**variables, **(overrides or {})}
    steps_node = nodes.get("steps", (None, None))[1]
    if not isinstance(steps_node, yaml.SequenceNode) or not steps_node.value:
        line = steps_node.start_mark.line + 1 if steps_node is not None else 1
        raise RecipeError(errors + [f"{shown}:{line}: 'steps' must be a non-empty list of "
                                    "one-key mappings like '- caption: {inputs: [DIR]}'"])
    used: set = set()
    steps: list[Step] = []
    runnable = sorted(n for n in commands if n != "run")
    for index, (node, item) in enumerate(zip(steps_node.value, data["steps"]), start=1):
        line = node.start_mark.line + 1

        def err(message, _where=f"{shown}:{line}: step {index}: "):
            errors.append(_where + message)

        if not isinstance(node, yaml.MappingNode) or len(node.value) != 1:
            err("a step is a one-key mapping, the vlmspec command and its options, "
                "e.g. '- caption: {inputs: [DIR], out: FILE.jsonl}'")
            continue
        (name, options), = item.items()
        name = str(name)
        if name == "run":
            err("'run' cannot be a step (recipes do not nest)")
            continue
        if name not in runnable:
            err(f"unknown command '{name}'" + did_you_mean(name, runnable)
                + f"; commands: {', '.join(runnable)}")
            continue
        opts_node = node.value[0][1]
        if options is None:
            options = {}
        if not isinstance(options, dict):
            err(f"the options of {name} must be a mapping (option: value), not {options!r}")
            continue
        for k in _duplicates(opts_node) if isinstance(opts_node, yaml.MappingNode) else ():
            err(f"duplicate option '{k.value}' for {name}")
        options = _step_options(commands[name], options, variables, used, err, path.parent,
                                set(overrides or {}))
        argv = _step_argv(commands[name], name, options, err)
        steps.append(Step(index, line, name, argv))
    for var in overrides or {}:
        if var not in (data.get("vars") or {}) and var not in used:
            errors.append(f"{shown}: --var {var}: the recipe has no variable '{var}'"
                          + did_you_mean(var, set(data.get("vars") or {}) | used))
    if errors:
        raise RecipeError(errors)
    return Recipe(path, str(data.get("name") or path.stem), str(data.get("description") or ""),
                  steps)


# ----------------------------------------------------------------- running
def _invoke(command: click.Command, step: Step) -> int:
    """Run one step in-process; its exit code (click errors count as usage errors, 2)."""
    try:
        rv = command.main(args=list(step.argv), prog_name=f"vlmspec {step.command}",
                          standalone_mode=False)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        click.echo(exc.code, err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Abort as exc:  # click's form of Ctrl-C outside standalone mode
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KeyboardInterrupt):
            return stop_code(cause)
        raise
    finally:
        sys.stdout.flush()
    return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0


def run_recipe(recipe: Recipe, commands: Mapping[str, click.Command], state_path,
               restart: bool = False) -> int:
    """Run the steps in order, skipping those the state file records with the same argv.
    Returns 0 (all done), 1 (some step had failed inputs) or the stopping step's code."""
    from vlmspec_cli import ui

    state_path = Path(state_path)
    done = {} if restart else read_state(state_path, ui)
    try:
        return _run_steps(recipe, commands, state_path, done, restart, ui)
    except OutputRefused as exc:  # the state file would replace a file that is not one
        ui.error(f"{exc}; recipe stopped")
        return 2


def _run_steps(recipe: Recipe, commands: Mapping[str, click.Command], state_path: Path,
               done: dict, restart: bool, ui) -> int:
    if restart and state_path.exists():
        write_state(state_path, recipe, done)
    final, total = 0, len(recipe.steps)
    for step in recipe.steps:
        label, key = f"step {step.index} ({step.command})", str(step.index)
        command = commands[step.command]
        why = still_done(done.get(key), step.digest, command, step.argv, state_path)
        if why is None:
            ui.info(f"{label}: done in an earlier run, skipped")
            continue
        if key in done:  # recorded with another argv, or its files changed: no longer done
            del done[key]
            write_state(state_path, recipe, done)
            if why:
                ui.info(f"{label}: done in an earlier run, but {why}: running it again")
        ui.info(f"{label} of {total}: {step.shell()}")
        code = _invoke(command, step)
        where = f"{recipe.path}:{step.line}: {label}"
        if code == 0:
            done[key] = {"command": step.command, "argv": step.argv, "argv_sha256": step.digest,
                         "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            reads = reads_fingerprint(command, step.argv, skip=[state_path])
            if reads is not None:
                done[key]["reads_sha256"] = reads
            write_state(state_path, recipe, done)
        elif code == 1:
            final = 1
            ui.warning(f"{where}: some inputs failed (exit 1), the rest were done; continuing")
        else:
            rest = {0: "", 1: f"; step {total} not run"}.get(
                total - step.index, f"; steps {step.index + 1}-{total} not run")
            how = {130: "interrupted", 143: "terminated"}.get(code, f"failed (exit {code})")
            ui.error(f"{where} {how}; recipe stopped{rest}")
            return code
    return final


def cli_run(commands: Mapping[str, click.Command], recipe_path, var_pairs=(), state=None,
            restart: bool = False, dry_run: bool = False) -> int:
    """The body of ``vlmspec run``: validate, then print (--dry-run) or run.  Exit code."""
    from vlmspec_cli import ui

    overrides = parse_vars(var_pairs)
    try:
        recipe = load_recipe(recipe_path, commands, overrides)
    except RecipeError as exc:
        for message in exc.messages:
            ui.error(message)
        return 2
    state_path = Path(state) if state else default_state_path(recipe_path)
    # before any step runs (or is shown): never a path a step reads or writes (the step's
    # output would become the state, or the state its output), never a file not a state
    collision = state_collision(state_path, recipe, commands)
    if collision:
        ui.error(collision)
        return 2
    try:
        check_state_path(state_path, recipe_path)
    except OutputRefused as exc:
        ui.error(str(exc))
        return 2
    owner = state_owner(state_path)
    if owner is not None and not restart and owner != str(recipe.path.resolve()):
        ui.error(f"state file {state_path}: records the steps of {owner}, not of {recipe.path} "
                 "(two recipes of one name share <name>.state.json here); give another "
                 "--state PATH, or --restart to start this recipe's state in it")
        return 2
    # before step 1, and under --dry-run: files a step reads, profiles and methods
    missing = (missing_reads(recipe, commands) + profile_problems(recipe, commands)
               + own_reads_written(recipe, commands))
    if missing:
        for message in missing:
            ui.error(message)
        return 2
    if dry_run:
        done = {} if restart else read_state(state_path, ui)
        for step in recipe.steps:
            why = still_done(done.get(str(step.index)), step.digest, commands[step.command],
                             step.argv, state_path)
            if why is None:
                ui.info(f"step {step.index} ({step.command}): done in an earlier run, "
                        "would be skipped")
            elif why:
                ui.info(f"step {step.index} ({step.command}): done in an earlier run, but "
                        f"{why}: would run again")
            click.echo(step.shell())
        return 0
    return run_recipe(recipe, commands, state_path, restart=restart)
