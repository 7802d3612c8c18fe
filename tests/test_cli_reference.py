"""docs/cli.md is the click command tree as it is: scripts/cli_reference.py regenerates the
page and this test fails when the file differs (an option added, renamed or re-worded
without rerunning the script). And the check can fail: an option added to a copy of a
command, or a command's help changed, makes the page stale."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys

import click

from conftest import ROOT


def _module():
    name = "cli_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "cli_reference.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_the_reference_is_current():
    """In a fresh process, as `python scripts/cli_reference.py --check` runs it: the
    --method helps list the registered methods, which another test in this process may
    have added to."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr


def test_every_command_and_option_is_on_the_page():
    from vlmspec_cli.cli import cli

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    ctx = click.Context(cli, info_name="vlmspec")
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert f"\n## vlmspec {name}\n" in page, name
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert any(f"`{opt}" in page or f", {opt}" in page for opt in param.opts), \
                    (name, param.opts)
    assert "\n## vlmspec profiles new\n" in page


def test_an_added_option_makes_the_page_stale(tmp_path):
    """Mutation: a copy of the tree whose caption takes one option more (and one whose
    bench help says something else) renders another page, and stale() says so."""
    from vlmspec_cli.cli import cli

    module = _module()
    page = tmp_path / "cli.md"
    page.write_text(module.render(cli), encoding="utf-8")
    assert module.stale(page, cli) == ""

    grown = copy.deepcopy(cli)
    grown.commands["caption"].params.append(
        click.Option(["--mutant-option"], is_flag=True, help="An option nobody documented."))
    reason = module.stale(page, grown)
    assert reason and "stale" in reason and "rerun python scripts/cli_reference.py" in reason
    assert "--mutant-option" in module.render(grown)

    reworded = copy.deepcopy(cli)
    reworded.commands["bench"].help = "Something else entirely."
    assert module.stale(page, reworded)
    assert module.stale(tmp_path / "missing.md", cli).endswith(
        "missing (python scripts/cli_reference.py writes it)")
    assert module.stale(page, cli) == ""   # the copies left the real tree alone
