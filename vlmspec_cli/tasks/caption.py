"""Captioning / image question answering: inputs → jobs → requests → records.

A job is one image with the batch prompt, or one conversation of a ``--chat`` file
(chat.py) whose next assistant turn the model writes.

The batch never stops on a bad input: each failure becomes an error record (and one
reason for the UI), the rest goes on. Records are appended atomically to the sink, and
inputs already recorded without error are skipped on a rerun: a record's resume key
(:func:`job_key`, the same for local, video and Ray runs) is the job's resolved path, its
prompt and the settings that change its output, so a path spelled another way is the
same input and a run with another model or token limit is not "done". An output error
(tasks/sink.py OutputError: disk full...) is not an input's failure: it stops the batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from vlmspec_cli.tasks.chat import ChatLineError, load_conversation_images, read_chat_file

from vlmspec_cli.runtime.limits import PromptError
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.tasks.inputs import InputError, InputItem, load_image, utf8_name
from vlmspec_cli.tasks.records import record_key
from vlmspec_cli.tasks.sink import JsonlSink, OutputError

TASK = "caption"


class CaptionEvents(Protocol):
    """What a front end hears about a batch (ui.py implements it with rich)."""

    def batch_started(self, total: int, skipped: int) -> None: ...
    def item_started(self, item: Job) -> None: ...
    def item_skipped(self, item: Job) -> None: ...
    def tokens(self, item: Job, generated: int, limit: int) -> None: ...
    def item_done(self, record: dict) -> None: ...
    def item_failed(self, item: Job, reason: str, record: dict) -> None: ...


@dataclass(frozen=True)
class Job:
    """One unit of a batch. ``path`` names it in records and messages (an image path, or
    ``FILE#id`` for a conversation); ``load`` builds its messages (loading images) and
    raises InputError when it cannot. ``source``: the resolved ``path`` (default
    ``os.path.realpath(path)``); ``settings``: input-specific settings that change the
    output (a video's frame sampling); ``files``: the files it reads (no output may be
    one of them; default ``(path,)``)."""

    path: str
    prompt: str
    load: Callable[[], list[Message]]
    error: str | None = None
    source: str | None = None
    settings: tuple[tuple[str, object], ...] = ()
    files: tuple[str, ...] = ()


def input_files(jobs: list[Job]) -> list[str]:
    """Every file the jobs read, once each (for the output checks)."""
    return list(dict.fromkeys(f for job in jobs for f in (job.files or (job.path,))))


def output_settings(profile, job: Job | None = None) -> dict:
    """What besides the input and the prompt changes a job's output: the target, the
    token limit, the sampling, anything lossy, and the job's own settings (if a job)."""
    p, t = profile, profile.target
    settings: dict = {"target": t.model, "max_new_tokens": p.generation.max_new_tokens,
                      "temperature": p.sampling.temperature}
    if t.dtype != "auto" or t.quantize != "none":
        settings |= {"dtype": t.dtype, "quantize": t.quantize}
    if p.sampling.temperature > 0:
        settings |= {"seed": p.sampling.seed, "top_p": p.sampling.top_p}
    settings["lossless"] = p.lossless
    if not p.lossless:
        settings["lossy"] = {"prune": [p.prune.keep, p.prune.layer, p.prune.final_wipe],
                             "int8_threshold": t.int8_threshold, "acceptance": p.acceptance}
    return settings | dict(job.settings if job is not None else ())


def job_identity(profile, job: Job) -> dict:
    """The record fields :func:`records.record_key` reads."""
    return {"task": getattr(profile, "task", TASK),
            "source": utf8_name(job.source if job.source is not None else os.path.realpath(job.path)),
            "prompt": job.prompt, "settings": output_settings(profile, job)}


def job_key(profile, job: Job) -> tuple:
    """The resume key a record of ``job`` under ``profile`` gets."""
    return record_key(job_identity(profile, job))


def jobs_to_do(profile, jobs: list[Job], done: set) -> tuple[list[Job], int]:
    """The jobs whose key is not ``done`` (each key once: a second spelling of an input,
    e.g. a symbolic link to it, is not decoded twice), and how many were skipped."""
    todo, keys = [], set(done)
    for job in jobs:
        key = job_key(profile, job)
        if key not in keys:
            keys.add(key)
            todo.append(job)
    return todo, len(jobs) - len(todo)


def image_jobs(items: list[InputItem], prompt: str) -> list[Job]:
    """One job per item; an image read from stdin (``item.data``) is keyed by its bytes'
    SHA-256, so a rerun with the same image on stdin resumes."""
    def loader(item: InputItem) -> Callable[[], list[Message]]:
        def load() -> list[Message]:
            if item.error:
                raise InputError(item.path, item.error)
            return [Message("user", prompt, (load_image(item.path, data=item.data),))]
        return load

    def source(item: InputItem) -> str | None:
        return None if item.data is None else f"stdin:sha256:{hashlib.sha256(item.data).hexdigest()}"

    return [Job(item.path, prompt, loader(item), item.error, source=source(item)) for item in items]


def chat_jobs(chat_path: str) -> list[Job]:
    """Jobs for every line of a conversation file (raises InputError if the file itself is
    unusable); a bad line becomes a job that fails with its line number."""
    jobs = []
    source = os.path.realpath(chat_path)
    for conv in read_chat_file(chat_path):
        if isinstance(conv, ChatLineError):
            reason = conv.reason.split(": ", 1)[1] if conv.reason.startswith("line ") else conv.reason
            jobs.append(Job(f"{chat_path}:{conv.line}", "", list, reason,
                            source=f"{source}:{conv.line}", files=(chat_path,)))
            continue

        def load(conv=conv) -> list[Message]:
            try:
                images = load_conversation_images(conv)
            except InputError as exc:  # name the image as well as the line
                raise InputError(exc.path, f"{exc.path}: {exc.reason}") from None
            return [Message(t.role, t.text, tuple(ims)) for t, ims in zip(conv.turns, images)]

        images = tuple(p for turn in conv.turns for p in turn.image_paths)
        jobs.append(Job(f"{chat_path}#{conv.key}", conv.turns[-1].text, load,
                        source=f"{source}#{conv.key}", files=(chat_path, *images)))
    return jobs


@dataclass
class BatchSummary:
    items: int = 0
    done: int = 0
    skipped: int = 0
    failures: int = 0
    stats: SpecStats = field(default_factory=SpecStats)
    baseline_wall_s: float = 0.0
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
    def speedup(self) -> float | None:
        """Target-only wall time (one input at a time) ÷ decoding wall time, over the
        compared inputs."""
        if not self.compared or self.decode_s <= 0:
            return None
        return self.baseline_wall_s / self.decode_s


def base_record(session, item: Job, prompt: str) -> dict:
    p = session.profile
    identity = job_identity(p, item) | {"prompt": prompt}
    fields = session.method.record_fields(p, identity["task"])
    return {
        "input": utf8_name(item.path),
        "task": identity["task"],
        "prompt": prompt,
        "source": identity["source"],
        "settings": identity["settings"],
        "output": None,
        "profile": p.name,
        "method": p.method,
        "drafting_inputs": fields.pop("drafting_inputs"),
        "gamma": fields.pop("gamma"),
        "lossless": session.lossless,
        "temperature": p.sampling.temperature,
        "seed": p.sampling.seed,
        "error": None,
    } | fields   # the method's own sections (a tree's shape)


def make_request(session, item: Job) -> Request:
    """The job's decoding request (loads its images; raises InputError for input problems,
    a prompt too long for the model's positions included)."""
    if item.error:
        raise InputError(item.path, item.error)
    p = session.profile
    request = Request(item.load(), max_new_tokens=p.generation.max_new_tokens,
                      seed=p.sampling.seed, request_id=item.path)
    try:
        session.check_fits(request)
    except PromptError as exc:   # too long, or an image placeholder in its text
        raise InputError(item.path, str(exc)) from None
    return request


def result_record(session, item: Job, request: Request, result, compare: bool) -> dict:
    p = session.profile
    record = base_record(session, item, item.prompt)
    record["output"] = result.text
    record["stats"] = result.state.stats.to_dict()
    if request.videos:  # what the target saw of each video
        record["videos"] = [{"frames": len(v.frames), "size": list(v.frames[0].size),
                             "seconds": None if v.duration is None else round(v.duration, 3),
                             "source_frames": v.source_frames} for v in request.videos]
    if compare:
        base = session.baseline_engine().generate(request)
        wall = base.state.stats.wall_s
        record["compare"] = {
            "target_only_wall_s": round(wall, 4),
            "target_only_tokens_per_s": round(base.state.stats.tokens_per_s, 2),
            # decoded in a batch, a row's wall time overlaps the others': only the
            # summary's batch wall time compares with target-only decoding
            "speedup": (round(wall / result.state.stats.wall_s, 4)
                        if result.state.stats.wall_s and p.generation.batch_size == 1 else None),
            # at temperature 0 the outputs must be identical (lossless); at T>0 they are
            # two samples from the same distribution and may differ
            "identical": base.tokens == result.tokens,
        }
    return record


def caption_one(session, item: Job, compare: bool,
                on_tokens: Callable[[int, int], None] | None = None) -> dict:
    """Decode one job; raises InputError for input problems."""
    request = make_request(session, item)
    progress = (lambda st: on_tokens(len(st.tokens), request.max_new_tokens)) if on_tokens else None
    result = session.engine.generate(request, progress=progress)
    return result_record(session, item, request, result, compare)


def warm_up_compare(session, requests) -> None:
    """Before ``--compare`` times anything: one short untimed decode of the first request
    that builds, with the method and with target-only. Each side's first decode pays
    one-time start-up costs (allocations, kernel set-up), and the method decodes each input
    first, so without this the first timed input charged them to speculation alone.
    ``requests`` yields requests or raises for bad inputs, which the timed loop reports;
    a drafter's caption cache is emptied again, so no timed input finds its captions made."""
    for make in requests:
        try:
            request = make()
        except Exception:
            continue
        short = dataclasses.replace(request, max_new_tokens=min(request.max_new_tokens, 8))
        session.engine.generate(short)
        session.baseline_engine().generate(short)
        captioner = getattr(session.engine.drafter, "captioner", None)
        if captioner is not None:
            captioner.forget()
        return


def _failure_reason(exc: Exception) -> str:
    return exc.reason if isinstance(exc, InputError) else f"failed: {type(exc).__name__}: {exc}"


def run_batch(session, items: list[Job], events: CaptionEvents,
              sink: JsonlSink | None = None, compare: bool = False,
              emit: Callable[[dict], None] | None = None) -> BatchSummary:
    """Caption every job not yet in ``sink``: one at a time, or ``generation.batch_size``
    together (SpeculativeEngine.run); records come out as jobs finish."""
    summary = BatchSummary(items=len(items),
                           must_match=session.sampling.greedy and session.lossless)
    done = sink.done_keys() if sink is not None else set()
    todo, summary.skipped = jobs_to_do(session.profile, items, done)
    events.batch_started(len(todo), summary.skipped)

    def failed(item: Job, exc: Exception) -> None:  # one input's failure never stops the batch
        reason = _failure_reason(exc)
        record = base_record(session, item, item.prompt)
        record["error"] = reason
        summary.failures += 1
        if sink is not None:
            sink.append(record)
        events.item_failed(item, reason, record)
        if emit is not None:
            emit(record)

    def finished(record: dict) -> None:
        summary.done += 1
        summary.stats.merge(SpecStats.from_dict(record["stats"]))
        if "compare" in record:
            summary.compared += 1
            summary.baseline_wall_s += record["compare"]["target_only_wall_s"]
            if record["compare"]["identical"]:
                summary.identical += 1
            elif summary.must_match:
                summary.mismatches += 1
        if sink is not None:
            sink.append(record)
        events.item_done(record)
        if emit is not None:
            emit(record)

    if session.profile.generation.batch_size > 1:
        summary.batch_size = session.profile.generation.batch_size
        summary.batched_s = _run_batched(session, todo, events, compare, failed, finished)
        return summary
    if compare:
        warm_up_compare(session, [lambda it=item: make_request(session, it) for item in todo[:3]])
    for item in todo:
        events.item_started(item)
        try:
            record = caption_one(session, item, compare,
                                 on_tokens=lambda n, limit, it=item: events.tokens(it, n, limit))
        except OutputError:  # --trace could not be written: stop, not the input's fault
            raise
        except Exception as exc:
            failed(item, exc)
            continue
        finished(record)
    return summary


def _run_batched(session, todo: list[Job], events: CaptionEvents, compare: bool,
                 failed: Callable, finished: Callable) -> float:
    """Decode the jobs generation.batch_size at a time; returns the wall time spent in the
    batched engine (not counting --compare's target-only runs between rows)."""
    requests: dict[int, Request] = {}
    live: list[Job] = []            # admitted, unfinished; the oldest drives the token bar

    def admit(item: Job) -> Request:
        events.item_started(item)
        requests[id(item)] = request = make_request(session, item)
        live.append(item)
        return request

    def progress(item: Job, state) -> None:
        if live and item is live[0]:
            events.tokens(item, len(state.tokens), state.request.max_new_tokens)

    outcomes = session.batched_engine().run(todo, admit, progress)
    elapsed = 0.0
    while True:
        t0 = time.perf_counter()
        step = next(outcomes, None)
        elapsed += time.perf_counter() - t0
        if step is None:
            return elapsed
        item, outcome = step
        live[:] = [job for job in live if job is not item]
        request = requests.pop(id(item), None)
        if isinstance(outcome, OutputError):
            raise outcome
        if isinstance(outcome, Exception):
            failed(item, outcome)
            continue
        try:
            record = result_record(session, item, request, outcome, compare)
        except Exception as exc:
            failed(item, exc)
            continue
        finished(record)
