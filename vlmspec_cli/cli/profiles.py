"""``vlmspec profiles``: list the profiles, or show one resolved."""

from __future__ import annotations

import click

from vlmspec_cli.cli.common import load_profile, set_option


@click.command()
@click.argument("name", required=False, metavar="[NAME|PATH]")
@set_option
def profiles(name, sets):
    """List the available profiles, or show one fully resolved (includes, defaults and
    --set applied) as YAML on stdout."""
    from vlmspec_cli import ui
    from vlmspec_cli.profile import list_profiles, profile_to_yaml

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
