"""Captions, image questions, conversations and videos: their jobs for the job runner.

A job is one image with the batch prompt, one conversation of a ``--chat`` file (chat.py)
whose next assistant turn the model writes, or one video (tasks/video.py makes those).
:data:`CAPTION` is their kind for tasks/jobs.py, which runs every batch (failures,
records, the sink, --compare). Inputs already recorded without error are skipped on a
rerun: a record's resume key (:func:`job_key`, the same for local, video and Ray runs)
is the job's resolved path, its prompt and the settings that change its output, so a
path spelled another way is the same input and a run with another model or token limit
is not "done".
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable

from vlmspec_cli.tasks.chat import (ChatLineError, conversation_digest, load_conversation_images,
                                    read_chat_file)

from vlmspec_cli.runtime.limits import PromptError
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.tasks.inputs import InputError, InputItem, load_image, utf8_name
from vlmspec_cli.tasks.jobs import BatchSummary, JobEvents, failure_reason, run_jobs
from vlmspec_cli.tasks.records import SCHEMA, record_key
from vlmspec_cli.tasks.sink import JsonlSink

TASK = "caption"


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
    unusable); a bad line becomes a job that fails with its line number.

    A conversation's resume key covers all of it (chat.conversation_digest: every turn and
    its images' bytes, in the job's settings as ``conversation``): an edited conversation
    is decoded again. Its source is ``FILE#id``, or without an id ``FILE#sha256:…`` (its
    content, not its line: a line inserted above it does not make it new)."""
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
        digest = conversation_digest(conv)
        # without an id its key is "NAME:LINE": shown as FILE:LINE, not FILE#NAME:LINE
        unnamed = conv.key == f"{os.path.basename(chat_path)}:{conv.line}"
        shown = f"{chat_path}:{conv.line}" if unnamed else f"{chat_path}#{conv.key}"
        jobs.append(Job(shown, conv.turns[-1].text, load,
                        source=f"{source}#{digest if unnamed else conv.key}",
                        settings=(("conversation", digest),), files=(chat_path, *images)))
    return jobs


def base_record(session, item: Job, prompt: str) -> dict:
    p = session.profile
    identity = job_identity(p, item) | {"prompt": prompt}
    fields = session.method.record_fields(p, identity["task"])
    return {
        "input": utf8_name(item.path),
        "task": identity["task"],
        "schema": SCHEMA,
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



class CaptionKind:
    """Captions, conversations and videos for the job runner: resumed by key, batched
    where the method batches, the output text and what the target saw of each video."""

    batches = True

    def pending(self, profile, jobs: list[Job], done: set) -> tuple[list[Job], int]:
        return jobs_to_do(profile, jobs, done)

    def prepare(self, session, job: Job) -> None:
        return None

    def request(self, session, job: Job) -> Request:
        return make_request(session, job)

    def record(self, session, job: Job) -> dict:
        return base_record(session, job, job.prompt)

    def finish(self, session, job: Job, plan, request: Request, result, record: dict) -> None:
        record["output"] = result.text
        record["stats"] = result.state.stats.to_dict()
        if request.videos:  # what the target saw of each video
            record["videos"] = [{"frames": len(v.frames), "size": list(v.frames[0].size),
                                 "seconds": None if v.duration is None else round(v.duration, 3),
                                 "source_frames": v.source_frames} for v in request.videos]

    def failure(self, exc: Exception) -> str:
        return failure_reason(exc)


CAPTION = CaptionKind()


def run_batch(session, items: list[Job], events: JobEvents, sink: JsonlSink | None = None,
              compare: bool = False, emit: Callable[[dict], None] | None = None) -> BatchSummary:
    """Caption (converse, describe) every job not yet in ``sink`` (tasks/jobs.py)."""
    return run_jobs(session, CAPTION, items, events, sink=sink, compare=compare, emit=emit)
