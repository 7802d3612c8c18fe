"""The orchestration every decoding command with --out shares (caption, caption --chat,
describe-video): after the command has parsed its options into a profile and jobs, the
--dry-run plan, the --out/--trace sinks (checked before any model loads), the session,
the batch (tasks/jobs.py through tasks/caption.py's ``run_batch``, or a Ray pool), the
records on stdout, the summary and the exit code. click only; rich through ui.py."""

from __future__ import annotations

import contextlib
from typing import Callable

from vlmspec_cli.cli.common import (draft_summary, fail, finish_batch, print_plan, record_printer,
                                    records_sink, start_decoding)
from vlmspec_cli.cli.detail import verbose
from vlmspec_cli.cli.stops import exit_130_on_interrupt


def settle_batch_size(session, items, quiet: bool) -> list[str]:
    """--batch-size auto: measure and set the batch size (tasks/batch_auto.py); what the
    runtime line adds. A session that decodes one request at a time says so in one line."""
    from vlmspec_cli import ui
    from vlmspec_cli.tasks.batch_auto import choose_batch_size
    from vlmspec_cli.tasks.caption import CAPTION

    if session.profile.generation.batch_size != "auto":
        return []
    with ui.Status(quiet, "measuring batch sizes (--batch-size auto)"):
        choice = choose_batch_size(session, lambda job: CAPTION.request(session, job), items)
    session.use_batch_size(choice.rows)
    if choice.alone is not None and not quiet:
        ui.info(choice.line())
    return [choice.label()]


def run_job_command(prof, items, *, noun: str, out: str | None, as_json: bool, compare: bool,
                    dry_run: bool, quiet: bool, about: str = "", trace: str | None = None,
                    check_prompt: bool = True, remote: Callable | None = None,
                    remote_context=contextlib.nullcontext) -> None:
    """Run the command's jobs ``items`` (tasks/caption.py Job) under ``prof`` and exit.

    ``noun``: what --dry-run counts ("input(s)"); ``about``: added to the profile line on
    stderr; ``trace``: the --trace file; ``check_prompt``: every job has the profile's
    prompt, checked against the target's positions before the first job; ``remote``:
    run the batch elsewhere instead of building a session here, as ``remote(events,
    sink, emit) -> BatchSummary`` (Ray), inside ``remote_context()``."""
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.models.loading import ModelLoadError
    from vlmspec_cli.session import SessionError, build_session
    from vlmspec_cli.tasks.caption import input_files, run_batch

    if dry_run:
        print_plan(prof, noun, [(item.path, item.error) for item in items], as_json=as_json)
        return
    if not quiet and verbose():   # else one short line once the models are loaded
        ui.info(f"profile {prof.name}: target {prof.target.model}, method {prof.method}"
                + draft_summary(prof) + about)
    with (records_sink(out, input_files(items), trace, prof) as (sink, trace_sink),
          exit_130_on_interrupt(sink, record_printer(as_json, sink)) as emit):
        session = None
        if remote is None:
            try:
                session = build_session(prof, trace=trace_sink and trace_sink.append)
                if check_prompt:
                    session.check_prompt_fits(prof.generation.prompt)
                extra = [about.removeprefix(", ")] + settle_batch_size(session, items, quiet)
            except (SessionError, ModelLoadError, ValueError) as exc:
                fail(str(exc))
            start_decoding(session, len(items) * prof.generation.max_new_tokens, quiet,
                           extra=" · ".join(x for x in extra if x))
        label = "describing" if noun.startswith("video") else "captioning"
        with remote_context(), ui.BatchUI(quiet=quiet, label=label) as events:
            if remote is not None:
                summary = remote(events, sink, emit)
            else:
                summary = run_batch(session, items, events, sink=sink, compare=compare,
                                    emit=emit)
    finish_batch(prof, summary, quiet)
