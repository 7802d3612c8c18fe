"""The ``vlmspec`` command line: parse, build a run, print. No model code here."""

from __future__ import annotations

import contextlib
import json
import sys

import click

from vlmspec_cli import __version__
from vlmspec_cli.cli_types import FiniteFloat, IntList, Seed

# stdout text lines are two tab-separated columns; a file name or a model output can hold
# any character, so these four are escaped in both columns (one line = one record)
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"})
TSV_HELP = ("backslash, tab, newline and CR in a column are written as \\\\, \\t, \\n "
            "and \\r")


def tsv_field(text) -> str:
    """One column of a stdout text line, escaped (see _TSV_ESCAPES)."""
    return str(text).translate(_TSV_ESCAPES)

from vlmspec_cli.drafting_inputs import parse_inputs as _parse_inputs  # --inputs M,T → names

EPILOG_CAPTION = """\b
Examples:
  vlmspec caption examples/images/                     # embedded tinyworld models
  vlmspec caption a.png b.png --prompt "what colour is the circle?"
  vlmspec caption 'shots/**/*.png' --out captions.jsonl   # rerun resumes
  find . -name '*.png' | vlmspec caption - --json | jq .stats.mean_accept_len
  vlmspec caption img.png --method chain --inputs text --compare
  vlmspec caption imgs/ --method tabed --inputs M,T,C,P --trace weights.jsonl
  vlmspec caption imgs/ --batch-size 8 --out caps.jsonl  # 8 inputs decoded together
  vlmspec caption imgs/ -m tree --set tree.top_k=2 --set tree.total_tokens=16  # draft trees
  vlmspec caption --chat conversations.jsonl --json     # next assistant turn of each
  vlmspec caption imgs/ --profile tinyworld-twig        # self-speculation, no draft model
  vlmspec caption imgs/ -p tinyworld-twig --set prune.keep=3 --set prune.final_wipe=6  # lossy
  vlmspec caption img.png --profile llava15-7b --dry-run
  vlmspec caption shots/ --executor ray --workers 4 --out caps.jsonl  # Ray actor pool

Exit codes: 0 all inputs done, 1 some input failed (the rest were still
done and written), 2 usage, profile, model-loading or output error (--out or
--trace unusable: checked before any model loads), 130 interrupted (Ctrl-C).
"""


def _fail(message: str, code: int = 2):
    from vlmspec_cli import ui

    ui.error(message)
    sys.exit(code)


def _load_profile(profile: str | None, sets: tuple[str, ...], cli: dict, task: str | None = None):
    """The resolved profile (exit 2 on a profile error); with ``task``, it must be for it."""
    from vlmspec_cli.profile import ProfileError, load_profile

    try:
        prof = load_profile(profile, overrides=list(sets), cli=cli)
    except ProfileError as exc:
        _fail(str(exc))
    if task is not None and prof.task != task:
        command = {"caption": "caption", "image": "generate-image", "video": "describe-video"}
        _fail(f"profile '{prof.name}' is for task '{prof.task}', this command needs task "
              f"'{task}' (use it with vlmspec {command.get(prof.task, prof.task)}, or pick a "
              f"profile with task: {task})")
    return prof


class _Group(click.Group):
    """Ctrl-C in any command exits 130 (click's default is "Aborted!" and 1, the code of
    "some input failed")."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _fail("interrupted", 130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="vlmspec")
def cli() -> None:
    """Lossless speculative decoding for vision-language models.

    A small draft proposes tokens and the target verifies them in one pass: at
    temperature 0 the output is token-identical to the target's own greedy
    decoding, at T>0 it follows the target's distribution. Runs offline on the
    embedded tinyworld models by default.
    """


DEFAULT_CAPTION_PROFILE = "tinyworld-caption"   # profile.DEFAULT_PROFILE (not imported: slow)


def profile_option(default: str = DEFAULT_CAPTION_PROFILE):
    """``--profile``; its help names the profile this command uses without one."""
    return click.option("--profile", "-p", metavar="NAME|PATH",
                        help="Profile name (see `vlmspec profiles`) or YAML path "
                             f"[default: {default}].")


set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                          help="Override a profile key, e.g. --set drafting.gamma=3 (repeatable).")


@cli.command(epilog=EPILOG_CAPTION)
@click.argument("inputs", nargs=-1, metavar="INPUTS...")
@click.option("--prompt", help="Question or instruction for every image [profile: generation.prompt].")
@profile_option()
@click.option("--method", "-m", help="none (target only), chain (one drafting input), tree "
                                     "(EAGLE-2 draft trees, profile section tree:), tabed "
                                     "(adaptive ensemble of inputs) or twig (self-speculation "
                                     "on the target's first layers) [profile: method].")
@click.option("--inputs", "drafting_inputs", metavar="LIST",
              help="Drafting inputs, comma-separated: multimodal,text,caption,pooled "
                   "(or letters M,T,C,P) [profile: drafting.inputs].")
@click.option("--chat", "chat_file", type=click.Path(dir_okay=False), metavar="FILE.jsonl",
              help="Conversations (JSONL, one per line; see README) instead of INPUTS: "
                   "write each one's next assistant turn.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, writable=True),
              metavar="FILE.jsonl", help="tabed: append one line per drafting block "
                                         "(weights, drafted, accepted) for plots.")
@set_option
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Token limit per input.")
@click.option("--batch-size", "-b", type=click.IntRange(min=1),
              help="Decode B inputs together (methods none and chain); each output is the one "
                   "decoded alone [profile: generation.batch_size, default 1].")
@click.option("--temperature", "-t", type=FiniteFloat(min=0), help="0 = greedy (default); >0 samples.")
@click.option("--seed", type=Seed(), help="Sampling seed, a signed 64-bit integer (recorded in every record).")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True), metavar="FILE.jsonl",
              help="Append one JSON record per input; a rerun skips inputs already recorded.")
@click.option("--json", "as_json", is_flag=True,
              help=f"Write JSONL records to stdout instead of INPUT<TAB>OUTPUT lines ({TSV_HELP}).")
@click.option("--compare", is_flag=True, help="Also decode with the target alone and report the speedup.")
@click.option("--dry-run", is_flag=True, help="Show the resolved profile and the inputs; load nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr (errors still shown).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: decode here; ray: shard over a Ray actor pool, one session per GPU "
                   "(or --workers CPU actors), same records and resume (needs "
                   "pip install 'vlmspec[ray]'; not with --chat, --compare or --trace).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="ray: actors in the pool (at most one per GPU).")
@click.option("--ray-address", metavar="ADDR",
              help="ray: an existing cluster (auto, ray://HOST:10001); default a local Ray.")
def caption(inputs, prompt, profile, method, drafting_inputs, chat_file, trace_file, sets,
            max_new_tokens, batch_size, temperature, seed, device, out, as_json, compare, dry_run, quiet,
            executor, workers, ray_address):
    """Caption images or answer a question about each one, or continue conversations.

    INPUTS are image files, directories (searched recursively), glob patterns,
    or - to read newline-separated paths from stdin. Results go to stdout (text
    or --json), progress and the summary table to stderr.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.limits import check_prompt_fits
    from vlmspec_cli.runtime.models import ModelLoadError
    from vlmspec_cli.session import SessionError, build_session, validate_method
    from vlmspec_cli.tasks.caption import chat_jobs, image_jobs, input_files, run_batch
    from vlmspec_cli.tasks.inputs import InputError, expand_inputs

    if not inputs and not chat_file:
        raise click.UsageError("no INPUTS given (files, directories, globs, or - for stdin), "
                               "and no --chat FILE")
    if inputs and chat_file:
        raise click.UsageError("give either INPUTS or --chat FILE, not both")
    if executor == "ray" and (chat_file or compare or trace_file):
        raise click.UsageError("--executor ray captions image INPUTS only: drop --chat, "
                               "--compare and --trace, or use --executor local")
    cli_values = {
        "method": method, "drafting.inputs": _parse_inputs(drafting_inputs),
        "generation.prompt": prompt, "generation.max_new_tokens": max_new_tokens,
        "generation.batch_size": batch_size,
        "sampling.temperature": temperature, "sampling.seed": seed,
        "target.device": device, "draft.device": device,
    }
    prof = _load_profile(profile, sets, cli_values, task="caption")
    try:
        validate_method(prof)
    except SessionError as exc:
        _fail(str(exc))
    if chat_file:
        try:
            items = chat_jobs(chat_file)
        except InputError as exc:
            _fail(str(exc))
    else:
        items = image_jobs(expand_inputs(inputs, stdin=sys.stdin), prof.generation.prompt)
    if dry_run:
        _print_plan(prof, "input(s)", [(item.path, item.error) for item in items])
        return
    if not quiet:
        ui.info(f"profile {prof.name}: target {prof.target.model}, method {prof.method}"
                + _draft_summary(prof))
    with (records_sink(out, input_files(items), trace_file) as (sink, trace_sink),
          exit_130_on_interrupt(sink, record_printer(as_json)) as emit):
        try:
            session = (build_session(prof, trace=trace_sink and trace_sink.append)
                       if executor == "local" else None)
            if session is not None and not chat_file:  # the same prompt for every image
                check_prompt_fits(session, prof.generation.prompt)
        except (SessionError, ModelLoadError, ValueError) as exc:
            _fail(str(exc))
        with ui.BatchUI(quiet=quiet) as events:
            if executor == "ray":  # the workers load the models, not this process
                from vlmspec_cli.tasks.ray_executor import RayExecutorError, run_ray
                try:
                    summary = run_ray(prof, items, events, sink=sink, emit=emit,
                                      workers=workers, address=ray_address)
                except RayExecutorError as exc:
                    _fail(str(exc))
            else:
                summary = run_batch(session, items, events, sink=sink, compare=compare,
                                    emit=emit)
    finish_batch(prof, summary, quiet)


@contextlib.contextmanager
def records_sink(out: str | None, inputs: list[str], trace: str | None = None):
    """The --out and --trace sinks (None where not given), checked, locked and repaired
    before any model loads -- exit 2 with one line when vlmspec must not or cannot write
    one (tasks/sink.py), its repair notes shown now -- and closed however the run ends.
    An output error during the batch (disk full) exits 2 too."""
    from vlmspec_cli import ui
    from vlmspec_cli.tasks.sink import OutputError, open_outputs

    try:
        sinks = open_outputs(out, inputs, trace)
    except OutputError as exc:
        _fail(str(exc))
    try:
        for sink in sinks:
            for w in sink.warnings if sink is not None else ():
                ui.warning(w)
        yield sinks
    except OutputError as exc:
        _fail(str(exc))
    finally:
        for sink in sinks:
            if sink is not None:
                sink.close()


@contextlib.contextmanager
def exit_130_on_interrupt(sink, emit):
    """Ctrl-C during a batch: one line saying how much was finished and recorded, exit 130.
    Yields ``emit`` counting the finished inputs."""
    finished = 0

    def counted(record: dict) -> None:
        nonlocal finished
        emit(record)
        finished += 1

    try:
        yield counted
    except KeyboardInterrupt:
        saved = ("" if sink is None else
                 f"; {sink.written} record(s) written to {sink.path} by this run" + (
                     "" if sink.stream else ", a rerun with the same --out resumes"))
        _fail(f"interrupted: {finished} input(s) finished{saved}", 130)


def record_printer(as_json: bool):
    """stdout for each finished record: JSONL, or "input<TAB>output" for the good ones
    (both columns escaped: tsv_field)."""
    def emit(record: dict) -> None:
        if as_json:
            click.echo(json.dumps(record, ensure_ascii=False))
        elif record["error"] is None:
            click.echo(f"{tsv_field(record['input'])}\t{tsv_field(record['output'])}")
    return emit


def finish_batch(prof, summary, quiet: bool) -> None:
    """The summary table, a line if outputs differ from target-only, and the exit code:
    1 if any input failed or differed, else 0."""
    from vlmspec_cli import ui

    if not quiet:
        if prof.method == "tree":
            t = prof.tree
            ui.summary_table(summary, f"tree (depth={t.depth}, top_k={t.top_k}, "
                                      f"total_tokens={t.total_tokens})", None)
        else:
            ui.summary_table(summary, prof.method, prof.drafting.gamma)
    if summary.mismatches:
        ui.error(f"{summary.mismatches} output(s) differ from target-only greedy decoding")
    sys.exit(1 if summary.failures or summary.mismatches else 0)


def _print_plan(prof, noun: str, rows: list[tuple[str, str | None]]) -> None:
    """--dry-run: the resolved profile, then one comment line per planned item."""
    from vlmspec_cli.profile import profile_to_yaml

    click.echo(f"# profile from {prof.source}")
    click.echo(profile_to_yaml(prof), nl=False)
    click.echo(f"# {len(rows)} {noun}")
    for name, error in rows:
        click.echo(f"# {tsv_field(name)}" + (f"  ({tsv_field(error)})" if error else ""))


def _draft_summary(prof) -> str:
    from vlmspec_cli.drafters import method_class

    return method_class(prof.method).describe(prof)


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


EPILOG_PROFILE = """\b
Examples:
  vlmspec profile                                  # default profile, YAML to stdout
  vlmspec profile -p tinyworld-tabed --write hw-cpu.yaml --plot hw-cpu.png
  vlmspec profile --contexts 128,1024 --repeats 30 --tau 3.2 --json

Then put `include: hw-cpu.yaml` in a profile to carry the measured numbers.
"""


@cli.command("profile", epilog=EPILOG_PROFILE)
@profile_option()
@set_option
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft.")
@click.option("--write", "write_path", type=click.Path(dir_okay=False), metavar="FILE.yaml",
              help="Write the hardware profile here (atomically) instead of to stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Draw T vs tokens verified, context length S and batch rows B.")
@click.option("--contexts", type=IntList(min=1), metavar="S,S,...",
              help="Extra context lengths S to time, positive integers [256,512].")
@click.option("--repeats", type=click.IntRange(min=3), default=15, show_default=True,
              help="Timed calls per number (the median is kept).")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--tau", type=FiniteFloat(min=1), help="Also give Eq. 1's speedup for this τ.")
@click.option("--force", is_flag=True, help="Overwrite an existing --write / --plot file (only "
                                            "a hardware profile / a PNG; never the --profile).")
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or table on stderr.")
def profile_cmd(profile, sets, device, write_path, plot_path, contexts, repeats, warmup, tau,
                force, as_json, quiet):
    """Measure this hardware: target and draft step times, the latency ratio T_q/T_p,
    TABED's Remarks 1-3 and Eq. 1's expected speedup, written as a YAML hardware profile.

    Times are medians over --repeats calls after --warmup, with the device synchronised.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.models import ModelLoadError
    from vlmspec_cli.session import SessionError, build_session
    from vlmspec_cli.runtime.limits import check_fits
    from vlmspec_cli.tasks.hwprofile import (check_contexts, check_outputs, hardware_yaml,
                                             run_profile, sample_request, save_outputs)
    from vlmspec_cli.tasks.output_files import OutputRefused

    prof = _load_profile(profile, sets, {"target.device": device, "draft.device": device},
                         task="caption")
    extra = contexts or None
    try:
        check_outputs(write_path, plot_path, prof.source, force)  # before anything loads
        session = build_session(prof)
        check_fits(session, sample_request(prof))
        check_contexts(session.target, extra)
    except (OutputRefused, SessionError, ModelLoadError, ValueError) as exc:
        _fail(str(exc))
    with ui.Status(quiet) as status:
        hardware = run_profile(session, contexts=extra, warmup=warmup, repeats=repeats, tau=tau,
                               progress=status.update)
    if not quiet:
        ui.latency_table(hardware)
    try:
        written = save_outputs(write_path, plot_path, hardware, prof.source, force)
    except OutputRefused as exc:
        _fail(str(exc))
    for path in [] if quiet else written:
        ui.info(f"wrote {path}")
    if as_json:
        click.echo(json.dumps(hardware))
    elif not write_path:
        click.echo(hardware_yaml(hardware, prof.source), nl=False)



EPILOG_CALIBRATE = """\b
Examples:
  vlmspec calibrate examples/images/ --write tuned          # -> profiles/tuned.yaml
  vlmspec calibrate -p mine.yaml shots/*.png --gammas 2,3,4,6 --budget 300
  vlmspec caption shots/ --profile tuned                    # use the winner

Include a `vlmspec profile` hardware YAML in the base profile to make the choice
deterministic (the latency model then comes from it instead of a fresh measurement).
"""


@cli.command("calibrate", epilog=EPILOG_CALIBRATE)
@click.argument("samples", nargs=-1, metavar="SAMPLES...")
@profile_option()
@set_option
@click.option("--gammas", type=IntList(min=1), default="1,2,3,4,5,6,8", show_default=True,
              metavar="G,G,...", help="Draft lengths γ to consider.")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True,
              help="Modelled-best candidates decoded for real (plus the profile's own).")
@click.option("--budget", type=FiniteFloat(min=1), default=120, show_default=True,
              metavar="SECONDS", help="Stop probing / measuring new candidates after this.")
@click.option("--margin", type=FiniteFloat(min=0), default=0.10, show_default=True,
              help="Prefer a measured candidate over the modelled best only when it was "
                   "this much faster (0.10 = 10%); large values keep the modelled choice.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Token limit per sample.")
@click.option("--seed", type=Seed(), help="Sampling seed [profile: sampling.seed].")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps.")
@click.option("--write", "write_name", metavar="NAME|FILE.yaml",
              help="Write the winner as a profile including the base one (NAME -> profiles/NAME.yaml).")
@click.option("--force", is_flag=True, help="Overwrite an existing --write profile (only a vlmspec "
                                            "profile, never the base or one it includes).")
@click.option("--json", "as_json", is_flag=True, help="Print all candidates as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or table on stderr.")
def calibrate_cmd(samples, profile, sets, gammas, top, budget, margin, max_new_tokens, seed, device,
                  write_name, force, as_json, quiet):
    """Pick the drafting method, inputs and γ that decode SAMPLES fastest here.

    Measures acceptance of every drafting variant once, models each γ with the latency
    profile (Eq. 1 with measured verification cost), decodes the best candidates for real
    against target-only decoding, and prints a ranked table.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.limits import check_fits
    from vlmspec_cli.runtime.models import ModelLoadError
    from vlmspec_cli.session import SessionError
    from vlmspec_cli.tasks.calibrate import (as_dicts, calibrate, calibration_session,
                                             check_profile_write, include_for, profile_write_path,
                                             sample_requests, winner_yaml, write_profile)
    from vlmspec_cli.tasks.inputs import expand_inputs
    from vlmspec_cli.tasks.output_files import OutputRefused

    if not samples:
        raise click.UsageError("no SAMPLES given (images, directories or globs)")
    gamma_list = list(gammas)
    prof = _load_profile(profile, sets, {"generation.max_new_tokens": max_new_tokens,
                                         "sampling.seed": seed, "target.device": device,
                                         "draft.device": device}, task="caption")
    items = expand_inputs(samples, stdin=sys.stdin)
    inputs = [item.path for item in items]
    path = profile_write_path(write_name) if write_name else None
    if path is not None:
        try:
            check_profile_write(path, prof.source, force=force, inputs=inputs)  # before any work
        except OutputRefused as exc:
            _fail(str(exc))
    requests, errors = sample_requests(prof, items)
    for line in errors:
        ui.error(line)
    if not requests:
        _fail("no usable samples")
    try:
        session, captioner, note = calibration_session(prof)
        for request in requests:  # the samples share the prompt: one too long, all are
            check_fits(session, request)
    except (SessionError, ModelLoadError, ValueError) as exc:
        _fail(str(exc))
    if note:
        ui.warning(note)
    gamma_list = sorted(set(gamma_list) | {prof.drafting.gamma})  # the profile's own γ too
    with ui.Status(quiet) as status:
        candidates, winner = calibrate(session, requests, gammas=gamma_list, captioner=captioner,
                                       top=top, budget_s=budget, margin=margin,
                                       progress=status.update)
    if not quiet:
        ui.calibration_table(candidates, winner)
    if path is not None:
        text = winner_yaml(winner, prof.source, path.stem, include_for(profile, prof.source, path),
                           candidates)
        try:
            write_profile(path, text, force=force, inputs=inputs)
        except OutputRefused as exc:
            _fail(str(exc))
        if not quiet:
            ui.info(f"wrote {path}: {winner.label}")
    if as_json:
        click.echo(json.dumps({"winner": winner.label, "candidates": as_dicts(candidates)}))
    else:
        click.echo(winner.label)
    sys.exit(1 if errors else 0)


EPILOG_RUN = """\b
Examples:
  vlmspec run recipes/caption-folder.yaml                   # rerun resumes
  vlmspec run recipes/caption-folder.yaml --var folder=shots/ --var out=shots.jsonl
  vlmspec run recipes/calibrate-then-caption.yaml --dry-run # print each step's command
  vlmspec run recipe.yaml --restart                         # ignore the state file

Exit codes: 0 every step done, 1 some step had failed inputs (the other
steps still ran), 2 invalid recipe, or a step's usage, profile or model error
(the recipe stops there).
"""


@cli.command("run", epilog=EPILOG_RUN)
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False), metavar="RECIPE.yaml")
@click.option("--var", "var_pairs", multiple=True, metavar="KEY=VALUE",
              help="Set a recipe variable, used as ${KEY} (repeatable; overrides vars:).")
@click.option("--state", type=click.Path(dir_okay=False), metavar="PATH",
              help="State file of finished steps [default: ./RECIPE-STEM.state.json].")
@click.option("--restart", is_flag=True, help="Ignore the state file: run every step again.")
@click.option("--dry-run", is_flag=True, help="Check the recipe and print each step's command; run nothing.")
def run_recipe(recipe, var_pairs, state, restart, dry_run):
    """Run a recipe: a YAML list of vlmspec steps (see recipes/README.md).

    The whole recipe is checked first (commands, options, ${vars}); errors name
    the file and line, and nothing runs. Steps run in order. A step that
    finished is recorded in the state file and skipped on a rerun while its
    command line is unchanged; caption steps with --out resume on their own.
    """
    from vlmspec_cli.recipes import cli_run

    sys.exit(cli_run(cli.commands, recipe, var_pairs, state, restart, dry_run))


from vlmspec_cli.cli_image import generate_image  # noqa: E402  (uses the helpers above)
from vlmspec_cli.cli_video import describe_video  # noqa: E402

cli.add_command(generate_image)
cli.add_command(describe_video)


def main() -> None:
    cli(prog_name="vlmspec")


if __name__ == "__main__":
    main()
