"""Write docs/cli.md, the CLI reference, from the click command tree itself.

    python scripts/cli_reference.py            # (re)write docs/cli.md
    python scripts/cli_reference.py --check    # exit 1, saying so, when docs/cli.md is stale

Every command (``vlmspec``, each subcommand, ``vlmspec profiles new``) gets its usage line,
its help text, its arguments and every visible option with its help, in the order
``--help`` shows them. Nothing is written by hand: tests/test_cli_reference.py regenerates
the page and fails when it differs from the file (an option added, renamed or re-worded
without rerunning this script), and checks that it does fail on such a change.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"

HEADER = """\
# CLI reference

Generated from the command line itself by `python scripts/cli_reference.py`; do not edit
this page by hand (`tests/test_cli_reference.py` fails when it and the commands disagree).
The examples in each command's help run in the suite with `--dry-run`
(`tests/test_help_examples.py`). `vlmspec COMMAND --help` prints the same.
"""


def _escape(text: str) -> str:
    """Markdown-safe help text: code spans (`...`) kept as they are, elsewhere the
    characters markdown would read as markup escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*_\[\]<|])", r"\\\1", parts[i])
    return "".join(parts)


def _help_blocks(text: str | None) -> list[str]:
    """A command's help (or epilog) as markdown: click's ``\\b`` paragraphs (laid out by
    hand: examples, lists) as text blocks, the others as paragraphs."""
    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(text or "")):
        if not para.strip():
            continue
        if para.lstrip().startswith("\b"):
            body = para.split("\b", 1)[1].strip("\n")
            out.append("```text\n" + body + "\n```")
        else:
            out.append(_escape(" ".join(line.strip() for line in para.splitlines())))
    return out


def _command(cmd: click.Command, ctx: click.Context, path: str) -> list[str]:
    lines = [f"## {path}", "", "```text", cmd.get_usage(ctx).strip(), "```", ""]
    for block in _help_blocks(cmd.help):
        lines += [block, ""]
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    if args:
        lines += ["Arguments: " + ", ".join(f"`{a.make_metavar(ctx)}`" for a in args), ""]
    records = [r for r in (p.get_help_record(ctx) for p in cmd.get_params(ctx)
                           if not isinstance(p, click.Argument)) if r]
    if records:
        lines += ["Options:", ""]
        for opts, help_text in records:
            lines.append(f"- `{opts}`" + (f": {_escape(' '.join(help_text.split()))}"
                                          if help_text else ""))
        lines.append("")
    for block in _help_blocks(cmd.epilog):
        lines += [block, ""]
    return lines


def _walk(cmd: click.Command, ctx: click.Context, path: str):
    yield cmd, ctx, path
    children = dict(getattr(cmd, "subcommands", {}) or {})   # `profiles new` (cli/profiles.py)
    if isinstance(cmd, click.Group):
        children.update({name: cmd.get_command(ctx, name) for name in cmd.list_commands(ctx)})
    for name, sub in children.items():
        if sub is None or sub.hidden:
            continue
        sub_ctx = click.Context(sub, info_name=name, parent=ctx, terminal_width=100,
                                max_content_width=100)
        yield from _walk(sub, sub_ctx, f"{path} {name}")


def render(root: click.Command | None = None) -> str:
    """The page for the command tree under ``root`` (default: vlmspec's)."""
    if root is None:
        from vlmspec_cli.cli import cli as root
    ctx = click.Context(root, info_name="vlmspec", terminal_width=100, max_content_width=100)
    commands = list(_walk(root, ctx, "vlmspec"))
    lines = [HEADER, "| command | what it does |", "|---|---|"]
    for cmd, _, path in commands[1:]:
        lines.append(f"| [`{path}`](#{path.replace(' ', '-')}) | "
                     f"{_escape(cmd.get_short_help_str(limit=100))} |")
    lines.append("")
    for cmd, sub_ctx, path in commands:
        lines += _command(cmd, sub_ctx, path)
    return "\n".join(lines).rstrip() + "\n"


def stale(page: Path = PAGE, root: click.Command | None = None) -> str:
    """"" when ``page`` is what ``render(root)`` writes, else a one-line reason."""
    if not page.is_file():
        return f"{page}: missing (python scripts/cli_reference.py writes it)"
    want, have = render(root).splitlines(), page.read_text(encoding="utf-8").splitlines()
    if want == have:
        return ""
    line = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
    return (f"{page}: stale from line {line + 1} ({(want[line] if line < len(want) else 'end')!r}"
            f" expected); rerun python scripts/cli_reference.py")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale")
    args = ap.parse_args(argv)
    if args.check:
        reason = stale()
        if reason:
            print(reason, file=sys.stderr)
        return 1 if reason else 0
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
