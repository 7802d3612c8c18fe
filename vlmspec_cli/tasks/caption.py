"""Captioning / image question answering: inputs → jobs → requests → records.

A job is one image with the batch prompt, or one conversation of a ``--chat`` file
(chat.py) whose next assistant turn the model writes.

The batch never stops on a bad input: each failure becomes an error record (and one
reason for the UI), the rest goes on. Records are appended atomically to the sink, and
inputs already recorded without error are skipped on a rerun.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from vlmspec_cli.tasks.chat import ChatLineError, load_conversation_images, read_chat_file

from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.tasks.inputs import InputError, InputItem, load_image
from vlmspec_cli.tasks.records import JsonlSink, record_key

TASK = "caption"


class CaptionEvents(Protocol):
    """What a front end hears about a batch (ui.py implements it with rich)."""

    def batch_started(self, total: int, skipped: int) -> None: ...
    def item_started(self, item: Job) -> None: ...
    def tokens(self, item: Job, generated: int, limit: int) -> None: ...
    def item_done(self, record: dict) -> None: ...
    def item_failed(self, item: Job, reason: str, record: dict) -> None: ...


@dataclass(frozen=True)
class Job:
    """One unit of a batch. ``path`` names it in records and messages (an image path, or
    ``FILE#id`` for a conversation); ``load`` builds its messages (loading images) and
    raises InputError when it cannot."""

    path: str
    prompt: str
    load: Callable[[], list[Message]]
    error: str | None = None


def image_jobs(items: list[InputItem], prompt: str) -> list[Job]:
    def loader(item: InputItem) -> Callable[[], list[Message]]:
        def load() -> list[Message]:
            if item.error:
                raise InputError(item.path, item.error)
            return [Message("user", prompt, (load_image(item.path),))]
        return load

    return [Job(item.path, prompt, loader(item), item.error) for item in items]


def chat_jobs(chat_path: str) -> list[Job]:
    """Jobs for every line of a conversation file (raises InputError if the file itself is
    unusable); a bad line becomes a job that fails with its line number."""
    jobs = []
    for conv in read_chat_file(chat_path):
        if isinstance(conv, ChatLineError):
            reason = conv.reason.split(": ", 1)[1] if conv.reason.startswith("line ") else conv.reason
            jobs.append(Job(f"{chat_path}:{conv.line}", "", list, reason))
            continue

        def load(conv=conv) -> list[Message]:
            try:
                images = load_conversation_images(conv)
            except InputError as exc:  # name the image as well as the line
                raise InputError(exc.path, f"{exc.path}: {exc.reason}") from None
            return [Message(t.role, t.text, tuple(ims)) for t, ims in zip(conv.turns, images)]

        jobs.append(Job(f"{chat_path}#{conv.key}", conv.turns[-1].text, load))
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
    mismatches: int = 0

    @property
    def speedup(self) -> float | None:
        """Target-only wall time ÷ speculative wall time, over the compared inputs."""
        if not self.compared or self.stats.wall_s <= 0:
            return None
        return self.baseline_wall_s / self.stats.wall_s


def base_record(session, item: Job, prompt: str) -> dict:
    p = session.profile
    return {
        "input": item.path,
        "task": TASK,
        "prompt": prompt,
        "output": None,
        "profile": p.name,
        "method": p.method,
        "drafting_inputs": list(p.drafting.inputs) if p.method not in ("none", "twig") else [],
        "gamma": p.drafting.gamma if p.method != "none" else 0,
        "lossless": session.lossless,
        "temperature": p.sampling.temperature,
        "seed": p.sampling.seed,
        "error": None,
    }


def caption_one(session, item: Job, compare: bool,
                on_tokens: Callable[[int, int], None] | None = None) -> dict:
    """Decode one job; raises InputError for input problems."""
    if item.error:
        raise InputError(item.path, item.error)
    prompt = item.prompt
    p = session.profile
    request = Request(item.load(), max_new_tokens=p.generation.max_new_tokens,
                      seed=p.sampling.seed, request_id=item.path)
    progress = (lambda st: on_tokens(len(st.tokens), request.max_new_tokens)) if on_tokens else None
    result = session.engine.generate(request, progress=progress)
    record = base_record(session, item, prompt)
    record["output"] = result.text
    record["stats"] = result.state.stats.to_dict()
    if compare:
        base = session.baseline_engine().generate(request)
        wall = base.state.stats.wall_s
        record["compare"] = {
            "target_only_wall_s": round(wall, 4),
            "target_only_tokens_per_s": round(base.state.stats.tokens_per_s, 2),
            "speedup": round(wall / result.state.stats.wall_s, 4) if result.state.stats.wall_s else None,
            # at temperature 0 the outputs must be identical (lossless); at T>0 they are
            # two samples from the same distribution and may differ
            "identical": base.tokens == result.tokens,
        }
    return record


def run_batch(session, items: list[Job], events: CaptionEvents,
              sink: JsonlSink | None = None, compare: bool = False,
              emit: Callable[[dict], None] | None = None) -> BatchSummary:
    summary = BatchSummary(items=len(items))
    done = sink.done_keys() if sink is not None else set()
    todo = []
    for item in items:
        if record_key({"task": TASK, "input": item.path, "prompt": item.prompt}) in done:
            summary.skipped += 1
        else:
            todo.append(item)
    events.batch_started(len(todo), summary.skipped)
    for item in todo:
        events.item_started(item)
        try:
            record = caption_one(session, item, compare,
                                 on_tokens=lambda n, limit, it=item: events.tokens(it, n, limit))
        except Exception as exc:  # one input's failure never stops the batch
            reason = exc.reason if isinstance(exc, InputError) else f"failed: {type(exc).__name__}: {exc}"
            record = base_record(session, item, item.prompt)
            record["error"] = reason
            summary.failures += 1
            if sink is not None:
                sink.append(record)
            events.item_failed(item, reason, record)
            if emit is not None:
                emit(record)
            continue
        summary.done += 1
        summary.stats.merge(SpecStats.from_dict(record["stats"]))
        if "compare" in record:
            summary.compared += 1
            summary.baseline_wall_s += record["compare"]["target_only_wall_s"]
            if session.sampling.greedy and not record["compare"]["identical"]:
                summary.mismatches += 1
        if sink is not None:
            sink.append(record)
        events.item_done(record)
        if emit is not None:
            emit(record)
    return summary
