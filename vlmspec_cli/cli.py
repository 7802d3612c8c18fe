"""The ``vlmspec`` command line: parse, build a run, print. No model code here."""

from __future__ import annotations

import json
import sys

import click

from vlmspec_cli import __version__

EPILOG_CAPTION = """\b
Examples:
  vlmspec caption examples/images/                     # embedded tinyworld models
  vlmspec caption a.png b.png --prompt "what colour is the circle?"
  vlmspec caption 'shots/**/*.png' --out captions.jsonl   # rerun resumes
  find . -name '*.png' | vlmspec caption - --json | jq .stats.mean_accept_len
  vlmspec caption img.png --method chain --set drafting.inputs=[text] --compare
  vlmspec caption img.png --profile llava15-7b --dry-run

Exit codes: 0 all inputs done, 1 some input failed (the rest were still
done and written), 2 usage, profile or model-loading error.
"""


def _fail(message: str, code: int = 2):
    from vlmspec_cli import ui

    ui.error(message)
    sys.exit(code)


def _load_profile(profile: str | None, sets: tuple[str, ...], cli: dict):
    from vlmspec_cli.profile import ProfileError, load_profile

    try:
        return load_profile(profile, overrides=list(sets), cli=cli)
    except ProfileError as exc:
        _fail(str(exc))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="vlmspec")
def cli() -> None:
    """Lossless speculative decoding for vision-language models.

    A small draft proposes tokens and the target verifies them in one pass: at
    temperature 0 the output is token-identical to the target's own greedy
    decoding, at T>0 it follows the target's distribution. Runs offline on the
    embedded tinyworld models by default.
    """


profile_option = click.option("--profile", "-p", metavar="NAME|PATH",
                              help="Profile name (see `vlmspec profiles`) or YAML path "
                                   "[default: tinyworld-caption].")
set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                          help="Override a profile key, e.g. --set drafting.gamma=3 (repeatable).")


@cli.command(epilog=EPILOG_CAPTION)
@click.argument("inputs", nargs=-1, metavar="INPUTS...")
@click.option("--prompt", help="Question or instruction for every image [profile: generation.prompt].")
@profile_option
@click.option("--method", "-m", help="Drafting method: none (target only) or chain [profile: method].")
@set_option
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Token limit per input.")
@click.option("--temperature", "-t", type=click.FloatRange(min=0), help="0 = greedy (default); >0 samples.")
@click.option("--seed", type=int, help="Sampling seed (recorded in every record).")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True), metavar="FILE.jsonl",
              help="Append one JSON record per input; a rerun skips inputs already recorded.")
@click.option("--json", "as_json", is_flag=True, help="Write JSONL records to stdout instead of text.")
@click.option("--compare", is_flag=True, help="Also decode with the target alone and report the speedup.")
@click.option("--dry-run", is_flag=True, help="Show the resolved profile and the inputs; load nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr (errors still shown).")
def caption(inputs, prompt, profile, method, sets, max_new_tokens, temperature, seed, device,
            out, as_json, compare, dry_run, quiet):
    """Caption images or answer a question about each one.

    INPUTS are image files, directories (searched recursively), glob patterns,
    or - to read newline-separated paths from stdin. Results go to stdout (text
    or --json), progress and the summary table to stderr.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.profile import profile_to_yaml
    from vlmspec_cli.runtime.models import ModelLoadError
    from vlmspec_cli.runtime.session import SessionError, build_session, validate_method
    from vlmspec_cli.tasks.caption import run_batch
    from vlmspec_cli.tasks.inputs import expand_inputs
    from vlmspec_cli.tasks.records import JsonlSink

    if not inputs:
        raise click.UsageError("no INPUTS given (files, directories, globs, or - for stdin)")
    cli_values = {
        "method": method, "generation.prompt": prompt, "generation.max_new_tokens": max_new_tokens,
        "sampling.temperature": temperature, "sampling.seed": seed,
        "target.device": device, "draft.device": device,
    }
    prof = _load_profile(profile, sets, cli_values)
    try:
        validate_method(prof)
    except SessionError as exc:
        _fail(str(exc))
    items = expand_inputs(inputs, stdin=sys.stdin)
    if dry_run:
        click.echo(f"# profile from {prof.source}")
        click.echo(profile_to_yaml(prof), nl=False)
        click.echo(f"# {len(items)} input(s)")
        for item in items:
            click.echo(f"# {item.path}" + (f"  ({item.error})" if item.error else ""))
        return
    if not quiet:
        ui.info(f"profile {prof.name}: target {prof.target.model}, method {prof.method}"
                + (f", draft {prof.draft.model} {list(prof.drafting.inputs)} γ={prof.drafting.gamma}"
                   if prof.method != "none" else ""))
    try:
        session = build_session(prof)
    except (SessionError, ModelLoadError, ValueError) as exc:
        _fail(str(exc))

    def emit(record: dict) -> None:
        if as_json:
            click.echo(json.dumps(record, ensure_ascii=False))
        elif record["error"] is None:
            click.echo(f"{record['input']}\t{record['output']}")

    sink = JsonlSink(out) if out else None
    try:
        if sink is not None:
            for w in sink.warnings:
                ui.warning(w)
        with ui.BatchUI(quiet=quiet) as events:
            summary = run_batch(session, items, prof.generation.prompt, events, sink=sink,
                                compare=compare, emit=emit)
    finally:
        if sink is not None:
            sink.close()
    if not quiet:
        ui.summary_table(summary, prof.method, prof.drafting.gamma)
    if summary.mismatches:
        ui.error(f"{summary.mismatches} output(s) differ from target-only greedy decoding")
    sys.exit(1 if summary.failures or summary.mismatches else 0)


@cli.command()
@click.argument("name", required=False, metavar="[NAME|PATH]")
@set_option
def profiles(name, sets):
    """List the available profiles, or show one fully resolved (includes, defaults and
    --set applied) as YAML on stdout."""
    from vlmspec_cli import ui
    from vlmspec_cli.profile import list_profiles, profile_to_yaml

    if name is None and not sets:
        rows = list_profiles()
        ui.profiles_table(rows)
        for row in rows:
            click.echo(row[0])
        return
    prof = _load_profile(name, sets, {})
    click.echo(f"# profile from {prof.source}")
    click.echo(profile_to_yaml(prof), nl=False)


def _not_built(command: str, issue: str):
    @cli.command(command, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                 help=f"{issue} (not built yet).", add_help_option=True)
    @click.pass_context
    def _stub(ctx):
        _fail(f"`vlmspec {command}` is not built yet", code=2)

    return _stub


_not_built("generate-image", "Autoregressive image generation with adaptive draft trees (ADT-Tree)")
_not_built("describe-video", "Describe videos with a text-anchored hidden-state draft (HiViS / Sparrow)")
_not_built("profile", "Measure draft/target latency ratios on this hardware and write a YAML profile")
_not_built("calibrate", "Pick the drafting method and tree parameters for this hardware")


def main() -> None:
    cli(prog_name="vlmspec")


if __name__ == "__main__":
    main()
