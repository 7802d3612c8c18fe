"""``vlmspec profiles``: list the profiles, or show one resolved (``profiles show NAME``
too); ``vlmspec profiles new NAME --model DIR``: write a commented profile for a model
(tasks/new_profile.py does the work)."""

from __future__ import annotations

import click

from vlmspec_cli.cli.common import (fail, load_profile, method_option, nonempty_path,
                                    set_option)


class _WithSubcommands(click.Command):
    """``vlmspec profiles`` as it always was (list, NAME, --keys: recipes run it as one
    command with these options), and ``profiles new …`` / ``profiles show NAME`` in front
    of it. A profile named new or show is shown by its path (profiles/new.yaml)."""

    subcommands: dict[str, click.Command] = {}

    def make_context(self, info_name, args, parent=None, **extra):
        if args and args[0] == "show":
            args = args[1:]
        elif args and args[0] in self.subcommands:
            return self.subcommands[args[0]].make_context(f"{info_name} {args[0]}", args[1:],
                                                          parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


EPILOG_NEW = """\b
Examples:
  # -> profiles/mine.yaml; then: vlmspec caption photos/ -p mine
  vlmspec profiles new mine --model ./my-vlm --draft ./my-small-vlm
  vlmspec profiles new mine-head --model ./my-vlm --method hidden \\
      --set hidden.model=./my-head --out mine-head.yaml
  vlmspec profiles new clips --model Qwen/Qwen2.5-VL-7B-Instruct --task video
"""


@click.command("new", epilog=EPILOG_NEW)
@click.argument("name")
@click.option("--model", required=True, metavar="DIR|ID",
              help="The target model: a folder or a hub id; its family (and so the task) "
                   "comes from its config.json.")
@click.option("--draft", metavar="DIR|ID", help="The draft model: a folder or a hub id.")
@method_option()
@click.option("--task", type=click.Choice(["caption", "video", "image"]),
              help="caption, video or image [default: image for a model that generates "
                   "images, else caption].")
@set_option
@click.option("--out", "-o", type=click.Path(dir_okay=False), callback=nonempty_path,
              metavar="FILE.yaml", help="Write here [default: profiles/NAME.yaml, found as "
                                        "-p NAME from this folder].")
@click.option("--force", is_flag=True, help="Replace a profile `profiles new` wrote (never "
                                            "another file).")
def profiles_new(name, model, draft, method, task, sets, out, force):
    """Write a profile NAME for your own model, every key commented (what it is and what
    else it takes): a starting point to edit, loadable as it is with -p."""
    from vlmspec_cli import ui
    from vlmspec_cli.drafters.base import TASK_COMMANDS
    from vlmspec_cli.profile import ProfileError, profile_to_dict
    from vlmspec_cli.profile import load_profile as read_profile
    from vlmspec_cli.tasks.new_profile import (INPUTS, NewProfileError, check_path, new_profile,
                                               out_path, write)
    from vlmspec_cli.tasks.output_files import OutputRefused

    try:
        path = out_path(name, out)
        check_path(path, force)          # before any model config is read
        made = new_profile(name, model, draft, method, task, list(sets))
        replaced = path.exists()
        write(path, made.text, force)
    except (NewProfileError, OutputRefused) as exc:
        fail(str(exc))
    try:                                 # what was written loads as what was made
        same = profile_to_dict(read_profile(str(path))) == profile_to_dict(made.profile)
    except ProfileError as exc:
        same = False
        ui.error(str(exc))
    if not same:
        fail(f"{path}: written, but it does not load as the profile it was made from (a bug)")
    for note in made.notes:
        ui.info(note)
    ref = name if out is None else str(path)
    task = made.profile.task
    ui.info(f"{'replaced' if replaced else 'wrote'} {path}: vlmspec {TASK_COMMANDS[task]} {INPUTS[task]} -p {ref}")
    click.echo(path)


@click.command(cls=_WithSubcommands)
@click.argument("name", required=False, metavar="[NAME|PATH]")
@set_option
@click.option("--keys", is_flag=True,
              help="List every key --set takes (and a profile YAML holds): KEY, what it takes, "
                   "its value in NAME (default: the default profile), tab-separated.")
def profiles(name, sets, keys):
    """List the available profiles, or show one fully resolved (includes, defaults and
    --set applied) as YAML on stdout (`profiles NAME` or `profiles show NAME`); `profiles
    new NAME --model DIR` writes a commented profile for a model.

    \b
    Examples:
      # name, task, description, file
      vlmspec profiles
      # one profile, resolved, as YAML
      vlmspec profiles tinyworld-hidden
      # every --set key: type and value
      vlmspec profiles --keys
      vlmspec profiles --keys tinyworld-video | grep ^video
      # a commented profile for your model (see profiles new --help)
      vlmspec profiles new mine --model ./my-vlm --draft ./my-draft
    """
    from vlmspec_cli import ui
    from vlmspec_cli.profile import key_rows, list_profiles, profile_to_yaml

    if keys:
        prof = load_profile(name, sets, {})
        for key, what, value in key_rows(prof):
            shown = "null" if value is None else (
                "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list)
                else str(value).lower() if isinstance(value, bool)
                else "{...}" if isinstance(value, dict) else str(value))
            click.echo(f"{key}\t{what}\t{' '.join(shown.split())}")
        return
    if name is None and not sets:
        rows = list_profiles()
        ui.profiles_table([(name, _task(path), path, desc) for name, path, desc in rows])
        for row in rows:
            click.echo(row[0])
        return
    prof = load_profile(name, sets, {})
    click.echo(f"# profile from {prof.source}")
    click.echo(profile_to_yaml(prof), nl=False)



def _task(path) -> str:
    """The task a profile file is for (its includes resolved), "?" when it cannot be read
    as a profile (its description then says why)."""
    from vlmspec_cli.profile import ProfileError, load_profile

    try:
        return load_profile(str(path)).task
    except (ProfileError, OSError, ValueError):
        return "?"


profiles.subcommands = {"new": profiles_new}
