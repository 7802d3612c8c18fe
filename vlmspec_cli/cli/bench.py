"""``vlmspec bench``: parse, build the run, print (tasks/bench.py does the work)."""

from __future__ import annotations

import sys

import click

from vlmspec_cli.cli.common import (decoding_profile, fail, json_line, method_option, model_options,
                                    nonempty_path, print_plan, profile_option, records_sink, set_option,
                                    start_decoding, stdout_guard)
from vlmspec_cli.cli.detail import verbose, verbose_option
from vlmspec_cli.cli.stops import exit_130_on_interrupt
from vlmspec_cli.cli.types import Count, FiniteFloat, Seed

EPILOG_BENCH = """\b
Examples:
  # the profile's method vs target-only
  vlmspec bench examples/mmspec/mmspec.jsonl
  # every method; a rerun resumes (and redraws its own PNG)
  vlmspec bench examples/mmspec/mmspec.jsonl \\
      --methods none,chain,tree,hidden,tabed,twig \\
      --out bench.jsonl --plot bench.png --force
  vlmspec bench examples/mmspec/mmspec.jsonl \\
      --categories "text vqa,multi-turn conversation" --limit 4
  vlmspec bench examples/mmspec/mmspec.jsonl -m none,chain --batch-size 4 \\
      --json > recs.jsonl
  # the real MMSpec split (its repository), on a GPU
  vlmspec bench MMSpec/dataset/MMSpec/test/mmspec.jsonl -p qwen25-vl-7b \\
      --methods none,chain,tree --max-new-tokens 1024 --out qwen-mmspec.jsonl

\b
DATASET is MMSpec's JSONL (id, image, turns, category, topic; images beside
it or in images/) or --chat conversations; tables group by MMSpec's topic
(else category). Exit codes: 0 every sample done, 1 a sample failed or a
lossless method's output differs from target-only at T=0, 2 usage, profile,
model-loading or output error, 130 interrupted, 143 terminated (SIGTERM) (a
rerun with the same --out resumes).
"""


def _list(ctx, param, value):
    """A comma-separated option as a list of its non-empty names (None if not given)."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",")]
    if not all(names):
        fail(f"{param.opts[0]} {value!r}: an empty name in the list (NAME,NAME,...)")
    return names


@click.command("bench", epilog=EPILOG_BENCH)
@click.argument("dataset", metavar="DATASET.jsonl")
@click.option("--methods", "-m", callback=_list, metavar="LIST",
              help="Methods to compare, comma-separated (none,chain,tree,hidden,tabed,twig,...); "
                   "target-only (none) always runs, it is the reference [default: the "
                   "profile's method, or --method's].")
@click.option("--categories", callback=_list, metavar="LIST",
              help="Only these categories (MMSpec's topic, else category; case, _ and - ignored).")
@click.option("--limit", type=Count(min=1),
              help="Only the first N samples (of --categories; a bad line counts as one).")
@click.option("--batch-size", "-b", type=Count(min=1),
              help="Decode B samples of a category together (methods that batch only) "
                   "[profile: generation.batch_size, default 1].")
@profile_option()
@model_options
@method_option("caption", short=False)
@set_option
@click.option("--max-new-tokens", type=Count(min=1), help="Token limit per reply.")
@click.option("--temperature", "-t", type=FiniteFloat(min=0), help="0 = greedy (default); >0 samples.")
@click.option("--seed", type=Seed(), help="Sampling seed, a signed 64-bit integer.")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True), callback=nonempty_path,
              metavar="FILE.jsonl", help="Append one record per sample and method; a rerun "
                                         "skips what is recorded and reports all of it.")
@click.option("--json", "as_json", is_flag=True,
              help="Write the records (one per sample and method) to stdout as JSONL.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=nonempty_path,
              metavar="FILE.png", help="Draw the speedup per category and method, MAT marked.")
@click.option("--force", is_flag=True, help="Overwrite an existing --plot file (only a PNG vlmspec wrote).")
@click.option("--dry-run", is_flag=True, help="Show the profile, methods and samples; load nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or table on stderr (errors still shown).")
@verbose_option
def bench(dataset, methods, categories, limit, batch_size, profile, method, sets, max_new_tokens,
          temperature, seed, device, out, as_json, plot_path, force, dry_run, quiet):
    """Compare drafting methods on a benchmark's workload, per category.

    Every method decodes the same samples in this process, with one loaded target
    shared by all, taking turns per sample (the order rotating) after one untimed
    request each. Reports, per category and overall: MAT (tokens per verification
    round), walltime speedup vs target-only, tokens/s, per-request latency p50/p90,
    samples identical to target-only (T = 0) and acceptance per position.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.tasks.bench import BenchError, make_plan
    from vlmspec_cli.tasks.inputs import InputError

    cli_values = {"method": method, "generation.max_new_tokens": max_new_tokens, "generation.batch_size": batch_size,
                  "sampling.temperature": temperature, "sampling.seed": seed,
                  "target.device": device, "draft.device": device}
    prof = decoding_profile(profile, sets, cli_values, task="caption")
    try:
        plan = make_plan(dataset, prof, methods, categories, limit,
                         prof.generation.rows)   # (a profile's auto: one; bench measures B)
    except (InputError, BenchError) as exc:
        fail(str(exc))
    inputs = [dataset, *[p for s in plan.samples for p in s.image_paths]]
    _check_plot(plot_path, out, inputs, force)
    if dry_run:
        print_plan(prof, "sample(s)", [(f"{dataset}:{it.line} {it.key} [{it.group or '?'}]",
                                        getattr(it, "reason", None)) for it in plan.items],
                   as_json=as_json, extra={"methods": [plan.label(m) for m in plan.methods]},
                   json_rows=[{"input": f"{dataset}:{it.line}", "sample": it.key,
                               "category": it.group, "error": getattr(it, "reason", None)}
                              for it in plan.items])
        return
    if not quiet and verbose():   # else one short line once the models are loaded
        ui.info(f"profile {prof.name}: target {prof.target.model}; methods "
                + ", ".join(plan.label(m) for m in plan.methods))
    emit = stdout_guard(lambda r: click.echo(json_line(r)) if as_json else None,
                        None if out is None else f"its records to --out {out} only")
    with (records_sink(out, inputs, prof=prof) as (sink, _trace),
          exit_130_on_interrupt(sink, emit) as counted):
        run = _run(plan, sink, counted, quiet)
        records = _all_records(plan, sink, run)
    _finish(plan, records, run, plot_path, force, inputs, quiet)


def _check_plot(plot_path, out, inputs, force) -> None:
    """--plot may be written (before any model loads): a new file, or a PNG with --force;
    never an input, never the --out file."""
    if not plot_path:
        return
    from vlmspec_cli.fileio import same_file
    from vlmspec_cli.tasks.output_files import OWN_PNG, OutputRefused, check_output

    if out and same_file(plot_path, out):
        fail(f"--plot {plot_path}: is the --out file too; give two files")
    try:
        check_output(plot_path, f"--plot {plot_path}", force=force, inputs=inputs, **OWN_PNG)
    except OutputRefused as exc:
        fail(str(exc))


def _run(plan, sink, emit, quiet):
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.models.loading import ModelLoadError
    from vlmspec_cli.session import SessionError
    from vlmspec_cli.tasks.bench import build_sessions, plan_keys
    from vlmspec_cli.tasks.bench_run import run_bench

    if sink is not None and plan_keys(plan) <= sink.done_keys():
        with ui.BatchUI(quiet=quiet, label="benchmarking", recorded="record(s) (sample, method)") as events:   # all recorded:
            return run_bench(plan, {}, events, sink=sink, emit=emit)    # nothing to load
    try:
        with ui.Status(quiet, "loading models") as status:
            sessions = build_sessions(plan, on_built=lambda name: status.update(name))
    except (SessionError, ModelLoadError, ValueError) as exc:
        fail(str(exc))
    tokens = len(plan.samples) * plan.profiles[plan.methods[0]].generation.max_new_tokens
    for i, session in enumerate(sessions.values()):
        start_decoding(session, tokens, quiet or i > 0,   # one line: the methods all run
                       methods=", ".join(plan.label(m) for m in plan.methods))
    with ui.BatchUI(quiet=quiet, label="benchmarking", recorded="record(s) (sample, method)") as events:
        return run_bench(plan, sessions, events, sink=sink, emit=emit)


def _all_records(plan, sink, run) -> list[dict]:
    """This run's records and, from a resumed --out, those of the same plan."""
    if sink is None or sink.stream:
        return run.records
    from vlmspec_cli.tasks.bench import plan_keys
    from vlmspec_cli.tasks.records import record_key

    keys = plan_keys(plan)
    return [r for r in sink.records() if r.get("error") is None and record_key(r) in keys]


def _finish(plan, records, run, plot_path, force, inputs, quiet) -> None:
    from vlmspec_cli import ui
    from vlmspec_cli.tasks.bench_report import build_report, report_png
    from vlmspec_cli.tasks.mmspec import groups
    from vlmspec_cli.tasks.output_files import OWN_PNG, OutputRefused, write_checked

    base = plan.profiles[plan.methods[0]]
    report = build_report(records, plan.methods, base.sampling.temperature == 0, plan.methods[0],
                          groups(plan.items))
    if not quiet and report.rows:
        ui.bench_table(report, f"vlmspec bench: {plan.file}")
    if plot_path and report.rows:
        try:
            write_checked(plot_path, report_png(report, f"vlmspec bench: {plan.file}"),
                          f"--plot {plot_path}", force=force, inputs=inputs, **OWN_PNG)
        except OutputRefused as exc:
            fail(str(exc))
        if not quiet:
            ui.info(f"wrote {plot_path}")
    for row in report.mismatches():
        ui.error(f"{row.label}: {row.mismatched} of {row.compared} sample(s) differ from "
                 "target-only greedy decoding")
    sys.exit(1 if run.failures or report.mismatches() else 0)
