"""``vlmspec bench``'s run: every (sample, method) not yet recorded, methods taking turns.

Before anything is timed, each method decodes one untimed request (start-up costs are no
method's). Then, one sample at a time, every method decodes it in turn, the order
rotating by one from sample to sample, so a change in the machine's load while the
benchmark runs falls on every method alike. A sample that cannot be read or decoded fails
once (one line naming its line in the file), for every method left; the rest go on.

``--batch-size B`` (``generation.batch_size``): the samples decoded B at a time
(SpeculativeEngine.run). They are taken in chunks of up to B of one category (so a category's
wall time is its chunks' own), every method decodes a chunk in turn, the order rotating
from chunk to chunk. A chunk is decoded reply by reply: the first replies of its samples
as one batch, then the second replies of those that have one (each with its own answers
fed back), and so on. A record's ``wall_s`` is then the sample's share of those batches'
wall time (each batch's time split evenly over its rows), so a category's sum is its
batches' time; each reply's ``latency_s`` is its time in its batch.
No click or rich.
"""

from __future__ import annotations

import time
from typing import Callable

from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.tasks.bench import (BenchPlan, BenchRun, Item, decode_sample, error_record,
                                     forget_captions, load_images, reply_request, result_record,
                                     rotated, sample_key, turn_entry)
from vlmspec_cli.tasks.inputs import InputError
from vlmspec_cli.tasks.mmspec import BenchSample, SampleError
from vlmspec_cli.tasks.sink import JsonlSink, OutputError


def warm_up(plan: BenchPlan, sessions: dict, samples: list[BenchSample]) -> None:
    """One untimed request per method before anything is timed: the first reply of the first
    sample that loads (B of them as a batch with --batch-size B)."""
    for sample in samples[:3]:
        try:
            images = load_images(sample)
        except InputError:
            continue
        for name in plan.methods:
            session = sessions[name]
            try:
                request = reply_request(session, sample, images, [])
            except InputError:
                return
            if plan.batch_size > 1:
                rows = list(range(plan.batch_size))
                for _, outcome in session.batched_engine().run(rows, lambda _r: request):
                    if isinstance(outcome, OutputError):
                        raise outcome
            else:
                session.engine.generate(request)
            forget_captions(session)
        return


class Recorder:
    """Where finished and failed samples go: the sink, the display, ``emit``, the run."""

    def __init__(self, plan: BenchPlan, events, sink: JsonlSink | None, emit) -> None:
        self.plan, self.events, self.sink, self.emit = plan, events, sink, emit
        self.run = BenchRun()

    def failed(self, item: BenchSample | SampleError, reason: str) -> None:
        record = error_record(self.plan, item, reason)
        self.run.failures += 1
        if self.sink is not None:
            self.sink.append(record)
        self.events.item_failed(Item(f"{self.plan.file}:{item.line}"), reason, record)
        if self.emit is not None:
            self.emit(record)

    def finished(self, record: dict) -> None:
        self.run.records.append(record)
        if self.sink is not None:
            self.sink.append(record)
        self.events.item_done(record)
        if self.emit is not None:
            self.emit(record)


def sample_reason(item, exc: Exception) -> str:
    reason = exc.reason if isinstance(exc, InputError) else f"failed: {type(exc).__name__}: {exc}"
    return f"sample '{item.key}': {reason}" if isinstance(item, BenchSample) else reason


def run_bench(plan: BenchPlan, sessions: dict, events, sink: JsonlSink | None = None,
              emit: Callable[[dict], None] | None = None) -> BenchRun:
    """Decode every (sample, method) not yet in ``sink``; bad lines fail first, once each."""
    rec = Recorder(plan, events, sink, emit)
    done = sink.done_keys() if sink is not None else set()
    todo = {(s.key, m) for s in plan.samples for m in plan.methods
            if sample_key(plan, s, m) not in done}
    rec.run.skipped = len(plan.samples) * len(plan.methods) - len(todo)
    events.batch_started(len(todo), rec.run.skipped)
    for item in plan.items:
        if isinstance(item, SampleError):
            rec.failed(item, item.reason)
    pending = [s for s in plan.samples if any((s.key, m) in todo for m in plan.methods)]
    if not pending:
        return rec.run
    warm_up(plan, sessions, pending)
    if plan.batch_size > 1:
        run_chunks(plan, sessions, pending, todo, rec)
        return rec.run
    for i, sample in enumerate(pending):
        try:
            images = load_images(sample)
        except InputError as exc:
            rec.failed(sample, sample_reason(sample, exc))
            continue
        for name in [m for m in rotated(plan.methods, i) if (sample.key, m) in todo]:
            events.item_started(Item(f"{sample.key} [{plan.label(name)}]"))
            session = sessions[name]
            try:
                turns, stats = decode_sample(
                    session, sample, images,
                    on_tokens=lambda n, limit: events.tokens(None, n, limit))
            except OutputError:
                raise
            except Exception as exc:   # the sample fails alone, for every method left
                rec.failed(sample, sample_reason(sample, exc))
                break
            finally:
                forget_captions(session)
            rec.finished(result_record(plan, sample, name, session, turns, stats, stats.wall_s))
    return rec.run



def chunks(samples: list[BenchSample], size: int) -> list[list[BenchSample]]:
    """Runs of up to ``size`` samples of one category, categories in order of appearance."""
    by_group: dict[str, list[BenchSample]] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s)
    return [group[i:i + size] for group in by_group.values() for i in range(0, len(group), size)]


class _Chunk:
    """One method's decoding of a chunk: per sample its answers, turn entries, stats and
    share of the wall time, or the exception that failed it."""

    def __init__(self, members: list[BenchSample]) -> None:
        self.members = members
        self.answers = {s.key: [] for s in members}
        self.turns = {s.key: [] for s in members}
        self.stats = {s.key: SpecStats() for s in members}
        self.wall = {s.key: 0.0 for s in members}
        self.failed: dict[str, Exception] = {}

    def live(self, t: int) -> list[BenchSample]:
        return [s for s in self.members if s.key not in self.failed and len(s.replies) > t]


def decode_chunk(session, members: list[BenchSample], images: dict) -> _Chunk:
    """Every reply of the ``members`` (samples), reply by reply, B rows at a time."""
    out = _Chunk(members)
    engine = session.batched_engine()
    for t in range(max(len(s.replies) for s in members)):
        live = out.live(t)
        if not live:
            break
        t0 = time.perf_counter()
        results = list(engine.run(live, lambda s: reply_request(session, s, images[s.key],
                                                                out.answers[s.key])))
        share = (time.perf_counter() - t0) / len(live)
        for sample, outcome in results:
            if isinstance(outcome, OutputError):
                raise outcome
            if isinstance(outcome, Exception):
                out.failed[sample.key] = outcome
                continue
            out.answers[sample.key].append(outcome.text)
            out.turns[sample.key].append(turn_entry(sample.questions[t], outcome))
            out.stats[sample.key].merge(outcome.state.stats)
            out.wall[sample.key] += share
    return out


def run_chunks(plan: BenchPlan, sessions: dict, pending: list[BenchSample], todo: set,
               rec: Recorder) -> None:
    """The samples B at a time, every method per chunk in rotating order."""
    for i, chunk in enumerate(chunks(pending, plan.batch_size)):
        images, bad = {}, set()
        for sample in chunk:
            try:
                images[sample.key] = load_images(sample)
            except InputError as exc:
                bad.add(sample.key)
                rec.failed(sample, sample_reason(sample, exc))
        for name in rotated(plan.methods, i):
            members = [s for s in chunk if s.key not in bad and (s.key, name) in todo]
            if not members:
                continue
            session = sessions[name]
            for sample in members:
                rec.events.item_started(Item(f"{sample.key} [{plan.label(name)}]"))
            result = decode_chunk(session, members, images)
            forget_captions(session)
            for sample in members:
                if sample.key in result.failed:   # failed for every method left
                    bad.add(sample.key)
                    rec.failed(sample, sample_reason(sample, result.failed[sample.key]))
                    continue
                rec.finished(result_record(plan, sample, name, session, result.turns[sample.key],
                                           result.stats[sample.key], result.wall[sample.key]))


__all__ = ["Recorder", "chunks", "decode_chunk", "run_bench", "run_chunks", "warm_up"]
