"""``vlmspec profiles``: list the profiles, or show one resolved."""

from __future__ import annotations

import click

from vlmspec_cli.cli.common import load_profile, set_option


@click.command()
@click.argument("name", required=False, metavar="[NAME|PATH]")
@set_option
@click.option("--keys", is_flag=True,
              help="List every key --set takes (and a profile YAML holds): KEY, what it takes, "
                   "its value in NAME (default: the default profile), tab-separated.")
def profiles(name, sets, keys):
    """List the available profiles, or show one fully resolved (includes, defaults and
    --set applied) as YAML on stdout.

    \b
    Examples:
      # name, task, description, file
      vlmspec profiles
      # one profile, resolved, as YAML
      vlmspec profiles tinyworld-hidden
      # every --set key: type and value
      vlmspec profiles --keys
      vlmspec profiles --keys tinyworld-video | grep ^video
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
