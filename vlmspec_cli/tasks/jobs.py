"""The one job runner: every task's batch (caption, --chat, describe-video, generate-image,
and each Ray worker's rows) goes inputs → request → decode → record → sink through
:func:`run_jobs`.

What differs between tasks is a :class:`JobKind` (tasks/caption.py's CAPTION for captions,
conversations and videos; tasks/imagegen.py's ImageKind): which jobs are already done,
what a job must check before it decodes, its request, its record and what it writes
besides. What the runner does the same way for every kind:

* **Failures.** Any exception of one job (``Exception``: a bad input, a prompt that does
  not fit, a file it may not write, an error while decoding it) becomes that job's error
  record (the kind's base record with ``error`` set, one reason for the UI) and the
  batch goes on; the exit code says 1 (cli/common.py ``finish_batch``). An
  :class:`~vlmspec_cli.tasks.sink.OutputError` (the ``--out`` or ``--trace`` file cannot be
  written) is not the job's fault and stops the batch; Ctrl-C stops it too.
* **Records** carry ``schema`` (records.SCHEMA) and go, in this order, to the sink
  (appended atomically and fsynced: tasks/sink.py), the events and ``emit``.
* **Resume.** A keyed kind skips the jobs whose resume key has a successful record in the
  sink (and decodes one spelling of an input once); a kind whose outputs are files
  skips a job whose files are all there (``prepare`` says SKIP).
* **--compare.** One untimed warm-up of both sides first, then each decoded job is decoded
  again by the target alone, every other job the target alone first (``decode_job``):
  ``compare`` holds the same four fields in every record and the summary counts them the
  same way (:class:`Tally`).

No click or rich here.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from vlmspec_cli.runtime.request import Request
from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.tasks.inputs import InputError
from vlmspec_cli.tasks.sink import JsonlSink, OutputError

SKIP = object()   # JobKind.prepare: the job's outputs are all there already
# a job decoded alone reports its token count at most this often (and at its end): a
# display redraws about 10 times a second, and rich's update after every round cost a
# fraction of a percent of a run whose rounds are one token each (a useless draft; by
# hand, not recorded)
TOKEN_EVENT_S = 0.05


class JobEvents(Protocol):
    """What a front end hears about a batch (ui.py's BatchUI implements it with rich)."""

    def batch_started(self, total: int, skipped: int) -> None: ...
    def item_started(self, item) -> None: ...
    def item_skipped(self, item) -> None: ...
    def tokens(self, item, generated: int, limit: int) -> None: ...
    def item_done(self, record: dict) -> None: ...
    def item_failed(self, item, reason: str, record: dict) -> None: ...


class JobKind(Protocol):
    """What one task adds to the runner."""

    batches: bool   # may decode generation.batch_size jobs together (SpeculativeEngine.run)

    def pending(self, profile, jobs, done: set) -> tuple[Iterable, int]:
        """The jobs to run given the resume keys ``done`` of the sink, and how many were
        skipped for it."""

    def prepare(self, session, job) -> Any:
        """Before the job decodes: SKIP (its outputs are there), or what ``finish`` needs
        (the files to write); raises when the job cannot run (it fails, nothing decoded)."""

    def request(self, session, job) -> Request:
        """The job's request (loads its inputs; raises for a bad input)."""

    def record(self, session, job) -> dict:
        """The job's base record: every field but the outcome, ``error`` None."""

    def finish(self, session, job, plan, request: Request, result, record: dict) -> None:
        """Fill ``record`` with the outcome (and write the job's own files)."""

    def failure(self, exc: Exception) -> str:
        """The one-line reason a job failed with ``exc``."""


def failure_reason(exc: Exception) -> str:
    """The reason of a job's failure: an input problem's own reason, else the exception."""
    return exc.reason if isinstance(exc, InputError) else f"failed: {type(exc).__name__}: {exc}"


@dataclass
class BatchSummary:
    items: int = 0
    done: int = 0
    skipped: int = 0
    failures: int = 0
    stats: SpecStats = field(default_factory=SpecStats)
    baseline_wall_s: float = 0.0
    baseline_tokens: float = 0.0     # what target-only decoding emitted for the compared inputs
    compared: int = 0
    identical: int = 0        # compared outputs equal to target-only decoding's
    mismatches: int = 0       # ... differing where they must not (greedy, lossless)
    must_match: bool = True   # greedy and lossless: every compared output must be identical
    batch_size: int = 1
    batched_s: float | None = None   # wall time of batched decoding (rows overlap in time)

    @property
    def decode_s(self) -> float:
        """Time spent decoding: the batch's wall time when inputs were decoded together
        (their per-record wall times overlap), else the sum over inputs."""
        return self.batched_s if self.batched_s is not None else self.stats.wall_s

    @property
    def tokens_per_s(self) -> float:
        return self.stats.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def baseline_tokens_per_s(self) -> float | None:
        """Target-only decoding's tokens a second over the compared inputs (--compare)."""
        return self.baseline_tokens / self.baseline_wall_s if self.baseline_wall_s > 0 else None

    @property
    def verdict(self) -> str:
        """--compare's verdict: "6/6 (0 mismatches)"; outputs that may differ (sampled at
        T > 0, or a lossy option) are not mismatches."""
        n, verdict = self.mismatches, f"{self.identical}/{self.compared}"
        if self.must_match:
            return f"{verdict} ({n} mismatch{'' if n == 1 else 'es'})"
        return f"{verdict} (may differ: sampled at T > 0, or lossy)"

    @property
    def speedup(self) -> float | None:
        """Target-only wall time (one input at a time) ÷ decoding wall time, over the
        compared inputs."""
        if not self.compared or self.decode_s <= 0:
            return None
        return self.baseline_wall_s / self.decode_s


class Tally:
    """Where a finished or failed job's record goes, in this order: the summary, the sink,
    the events, ``emit``. The local runner and the Ray driver both deliver through it."""

    def __init__(self, summary: BatchSummary, events: JobEvents, sink: JsonlSink | None,
                 emit: Callable[[dict], None] | None) -> None:
        self.summary, self.events, self.sink, self.emit = summary, events, sink, emit

    def finished(self, record: dict) -> None:
        summary = self.summary
        summary.done += 1
        summary.stats.merge(SpecStats.from_dict(record["stats"]))
        if "compare" in record:
            summary.compared += 1
            compare = record["compare"]
            summary.baseline_wall_s += compare["target_only_wall_s"]
            summary.baseline_tokens += (compare["target_only_tokens_per_s"]
                                        * compare["target_only_wall_s"])
            if record["compare"]["identical"]:
                summary.identical += 1
            elif summary.must_match:
                summary.mismatches += 1
        if self.sink is not None:
            self.sink.append(record)
        self.events.item_done(record)
        if self.emit is not None:
            self.emit(record)

    def failed(self, job, record: dict) -> None:
        """``record``: the job's error record (``error`` set)."""
        self.summary.failures += 1
        if self.sink is not None:
            self.sink.append(record)
        self.events.item_failed(job, record["error"], record)
        if self.emit is not None:
            self.emit(record)


def compare_fields(session, request: Request, result, base=None) -> dict:
    """``compare``: the same request decoded by the target alone (``base``: already
    decoded, before the method's)."""
    if base is None:
        base = session.baseline_engine().generate(request)
    wall, own = base.state.stats.wall_s, result.state.stats.wall_s
    return {
        "target_only_wall_s": round(wall, 4),
        "target_only_tokens_per_s": round(base.state.stats.tokens_per_s, 2),
        # decoded in a batch, a row's wall time overlaps the others': only the summary's
        # batch wall time compares with target-only decoding
        "speedup": (round(wall / own, 4)
                    if own and session.profile.generation.rows == 1 else None),
        # at temperature 0 the outputs must be identical (lossless); at T>0 they are two
        # samples from the same distribution and may differ
        "identical": base.tokens == result.tokens,
    }


def warm_up_compare(session, requests: Iterable[Callable[[], Request]]) -> None:
    """Before ``--compare`` times anything: one short untimed decode of the first request
    that builds, with the method and with target-only. Each side's first decode pays
    one-time start-up costs (allocations, kernel set-up), and the method decodes each input
    first, so without this the first timed input charged them to speculation alone.
    ``requests`` yields request makers that raise for bad inputs, and a request can fail
    to decode (media its model cannot take): the timed loop reports those, and the warm-up
    moves on to the next; a drafter's caption cache is emptied again, so no timed input finds its
    captions made."""
    for make in requests:
        try:
            request = make()
            short = dataclasses.replace(request, max_new_tokens=min(request.max_new_tokens, 8))
            session.engine.generate(short)
            session.baseline_engine().generate(short)
        except Exception:   # this input's own failure: its job reports it; warm on the next
            continue
        captioner = session.engine.drafter.captioner   # (declared on every method)
        if captioner is not None:
            captioner.forget()
        return


def decode_job(session, kind: JobKind, job, plan, compare: bool, events: JobEvents,
               baseline_first: bool = False) -> dict:
    """Decode one job and make its record (raises for the job's failure).
    ``baseline_first`` (--compare, every other job): the target alone decodes the request
    before the method does. Whichever side decodes an input first pays what the second
    finds done (the input's tensors and the caches they pass through, and on a busy
    machine a thread count chosen while the other processes held the cores). With the
    method always first, target-only decoding against itself read 0.83-0.96x beside two
    busy processes (the A/A controls of bench/runs/2026-12-07/final2-useless-2competitors.json
    and useless-drafts-control.json); taking turns, that cost falls on both sides alike."""
    request = kind.request(session, job)
    limit = request.max_new_tokens
    base = session.baseline_engine().generate(request) if compare and baseline_first else None
    result = session.engine.generate(request, progress=token_events(events, job, limit))
    return outcome_record(session, kind, job, plan, request, result, compare, base)


def token_events(events: JobEvents, job, limit: int) -> Callable:
    """The engine's progress callback for a job decoded alone: ``events.tokens`` at its
    first round, then at most every TOKEN_EVENT_S, and when it is done."""
    last: list[float | None] = [None]

    def progress(state) -> None:
        now = time.monotonic()
        if last[0] is None or state.done or now - last[0] >= TOKEN_EVENT_S:
            last[0] = now
            events.tokens(job, len(state.tokens), limit)

    return progress


def outcome_record(session, kind: JobKind, job, plan, request: Request, result,
                   compare: bool, base=None) -> dict:
    record = kind.record(session, job)
    kind.finish(session, job, plan, request, result, record)
    if compare:
        record["compare"] = compare_fields(session, request, result, base)
    return record


def error_record(session, kind: JobKind, job, exc: Exception) -> dict:
    record = kind.record(session, job)
    record["error"] = kind.failure(exc)
    return record


@dataclass(frozen=True)
class _Refused:
    exc: Exception   # why the job cannot run, raised once it has started


def run_jobs(session, kind: JobKind, jobs, events: JobEvents, *, sink: JsonlSink | None = None,
             compare: bool = False, emit: Callable[[dict], None] | None = None) -> BatchSummary:
    """Run every job not yet done (``jobs``: a list, or a plan iterated once as it goes):
    one at a time, or ``generation.batch_size`` together where the kind batches; records
    come out as jobs finish."""
    summary = BatchSummary(items=len(jobs),
                           must_match=session.sampling.greedy and session.lossless)
    todo, summary.skipped = kind.pending(session.profile, jobs,
                                         sink.done_keys() if sink is not None else set())
    events.batch_started(len(todo), summary.skipped)
    tally = Tally(summary, events, sink, emit)
    if kind.batches and session.profile.generation.rows > 1:
        summary.batch_size = session.profile.generation.rows
        summary.batched_s = _run_batched(session, kind, todo, events, compare, tally)
        return summary
    if compare:
        warm_up_compare(session, [lambda j=job: kind.request(session, j)
                                  for job in itertools.islice(todo, 3)])
    for job in todo:
        try:
            plan = kind.prepare(session, job)
        except Exception as exc:
            plan = _Refused(exc)
        if plan is SKIP:
            summary.skipped += 1
            events.item_skipped(job)
            continue
        events.item_started(job)
        try:
            if isinstance(plan, _Refused):
                raise plan.exc
            record = decode_job(session, kind, job, plan, compare, events,
                                baseline_first=summary.compared % 2 == 1)
        except OutputError:  # --out / --trace cannot be written: stop, not the job's fault
            raise
        except Exception as exc:  # one job's failure never stops the batch
            tally.failed(job, error_record(session, kind, job, exc))
            continue
        tally.finished(record)
    return summary


def _run_batched(session, kind: JobKind, todo: list, events: JobEvents, compare: bool,
                 tally: Tally) -> float:
    """Decode the jobs generation.batch_size at a time; returns the wall time spent in the
    batched engine (not counting --compare's target-only runs between rows)."""
    requests: dict[int, Request] = {}
    live: list = []            # admitted, unfinished; the oldest drives the token bar

    def admit(job) -> Request:
        events.item_started(job)
        requests[id(job)] = request = kind.request(session, job)
        live.append(job)
        return request

    def progress(job, state) -> None:
        if live and job is live[0]:
            events.tokens(job, len(state.tokens), state.request.max_new_tokens)

    outcomes = session.batched_engine().run(todo, admit, progress)
    elapsed = 0.0
    while True:
        t0 = time.perf_counter()
        step = next(outcomes, None)
        elapsed += time.perf_counter() - t0
        if step is None:
            return elapsed
        job, outcome = step
        live[:] = [j for j in live if j is not job]
        request = requests.pop(id(job), None)
        if isinstance(outcome, OutputError):
            raise outcome
        if isinstance(outcome, Exception):
            tally.failed(job, error_record(session, kind, job, outcome))
            continue
        try:
            record = outcome_record(session, kind, job, None, request, outcome, compare)
        except Exception as exc:
            tally.failed(job, error_record(session, kind, job, exc))
            continue
        tally.finished(record)
