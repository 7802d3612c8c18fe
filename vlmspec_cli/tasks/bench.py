"""``vlmspec bench``: drafting methods side by side on one workload (MMSpec's format).

Every method decodes the same samples in the same process, each in a session of its own
built around ONE loaded target (``build_session(profile, target=...)``); a method the
profile was not written for takes what it needs from its own declaration
(``DraftingMethod.beside``). This module holds the plan (checked before any model
loads), the sessions, how one sample is decoded and its records; tasks/bench_run.py runs
the plan (methods taking turns, --batch-size) and tasks/bench_report.py makes the tables.

A sample is a conversation (tasks/mmspec.py): each reply is one request, the image comes
with the first question and each method's own answers are fed back before the next one.
One record per sample and method (``--out``, resumable: its key is the sample's file, id
and content, the output settings, the method with a hash of its whole profile, and the
batch size). No click or rich.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Callable

from vlmspec_cli.companions import SHIPPED_COMPANIONS
from vlmspec_cli.drafters import method_class
from vlmspec_cli.profile import profile_to_dict, with_settings
from vlmspec_cli.runtime.limits import PromptError
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.session import ModelLoadError, SessionError, validate_method
from vlmspec_cli.tasks.caption import output_settings
from vlmspec_cli.tasks.inputs import InputError, load_image, utf8_name
from vlmspec_cli.tasks.mmspec import BenchSample, SampleError
from vlmspec_cli.tasks.records import SCHEMA, record_key

TASK = "bench"


@dataclass(frozen=True)
class Item:
    """What the progress display names: a sample under a method, or a failed line."""

    path: str


@dataclass
class BenchPlan:
    file: str                                  # the workload file, as given
    items: list[BenchSample | SampleError]     # selected (--categories, --limit)
    methods: list[str]                         # target-only (none) first
    profiles: dict[str, object]                # each method's profile
    batch_size: int = 1
    _configs: dict = field(default_factory=dict, repr=False)

    def config(self, name: str) -> dict:
        """``method_config`` of a method, computed once."""
        if name not in self._configs:
            self._configs[name] = method_config(self.profiles[name], name)
        return self._configs[name]

    @property
    def samples(self) -> list[BenchSample]:
        return [it for it in self.items if isinstance(it, BenchSample)]

    def label(self, name: str) -> str:
        return method_class(name).label(self.profiles[name])


@dataclass
class BenchRun:
    records: list[dict] = field(default_factory=list)   # this run's, error-free
    failures: int = 0
    skipped: int = 0        # (sample, method) pairs already recorded


class BenchError(ValueError):
    """The benchmark cannot start as asked; ``str()`` is the one line to show."""


def make_plan(path: str, base, methods: list[str] | None, categories: list[str] | None,
              limit: int | None, batch_size: int = 1) -> BenchPlan:
    """Everything checked before any model loads: the file read (InputError when unusable),
    the categories known, the method names known and each method's profile valid
    (BenchError naming what is wrong)."""
    from vlmspec_cli.tasks.mmspec import groups, read_bench_file, select, unknown_categories

    items = read_bench_file(path)
    missing = unknown_categories(items, categories or [])
    if missing:
        raise BenchError(f"--categories: no sample of category '{missing[0]}' in {path} "
                         f"(its categories: {', '.join(groups(items)) or 'none'})")
    try:
        names = method_names(base, methods)
        profiles = method_profiles(base, names, batch_size)
    except (ValueError, SessionError) as exc:
        raise BenchError(str(exc)) from None
    return BenchPlan(path, select(items, categories, limit), names, profiles, batch_size)


def method_names(base, methods: list[str] | None) -> list[str]:
    """The methods to compare: target-only (the reference of every comparison) first,
    then ``methods`` (default: the profile's own) without repeats. ValueError naming an
    unknown one (with a suggestion)."""
    names = list(dict.fromkeys(methods or [base.method]))
    for name in names:
        method_class(name)
    reference = [n for n in _names() if not method_class(n).drafts][:1]
    return list(dict.fromkeys(reference + names))


def _names() -> list[str]:
    from vlmspec_cli.drafters import method_names as registered

    return registered()


def method_profiles(base, names: list[str], batch_size: int = 1) -> dict[str, object]:
    """Each method's profile: ``base`` itself for its own method, else ``base`` with
    ``method`` and what the method needs beside another's profile (DraftingMethod.beside:
    the head or twig shipped for this target, TABED's second input); every one checked
    before anything loads (SessionError: one line naming the method). A head or twig the
    profile names that is no shipped one (``--set hidden.model=HEAD``: the user's own) is
    kept, not replaced by the shipped one."""
    shipped = SHIPPED_COMPANIONS.get(base.target.model, {})
    out = {}
    for name in names:
        settings = {"generation.batch_size": batch_size}
        if name != base.method:
            cls = method_class(name)
            own = _users_own(with_settings(base, {"method": name}, source=f"method {name}"))
            ships = () if own else tuple(shipped.get(name, ()))
            settings |= {"method": name, **cls.beside(base, ships)}
        try:
            profile = with_settings(base, settings, source=f"method {name}")
            validate_method(profile)
        except (SessionError, ValueError) as exc:   # named once ("method adt: method 'adt' …")
            said = str(exc)
            raise SessionError(said if f"'{name}'" in said else f"method {name}: {said}") from None
        out[name] = profile
    return out


def _users_own(profile) -> bool:
    """Whether the profile's method loads a head or twig named by the user (set, and not
    one shipped for any target)."""
    from vlmspec_cli.session import shipped_companion

    return any(model is not None and not shipped_companion(model)
               for _, model in method_class(profile.method).models(profile))


def build_sessions(plan: BenchPlan, on_built: Callable[[str], None] | None = None) -> dict:
    """One session per method around one loaded target (the first session loads it)."""
    from vlmspec_cli.session import build_session   # looked up now: tests stand in for it

    sessions, target = {}, None
    for name in plan.methods:
        try:
            session = build_session(plan.profiles[name], target=target)
        except (SessionError, ModelLoadError, ValueError) as exc:
            raise SessionError(f"method {name}: {exc}") from None
        sessions[name], target = session, session.target
        if on_built is not None:
            on_built(name)
    return sessions


# -- records -------------------------------------------------------------------------------

def method_config(profile, name: str) -> dict:
    """What a record says of the method, and a hash of its whole profile: another head,
    twig, draft, γ or thread count is another measurement to a rerun."""
    cls = method_class(name)
    whole = {k: v for k, v in profile_to_dict(profile).items() if k not in ("name", "description")}
    digest = hashlib.sha256(json.dumps(whole, sort_keys=True, default=str).encode()).hexdigest()
    return {"name": name, "label": cls.label(profile), "describe": cls.describe(profile).lstrip(", "),
            **cls.record_fields(profile, "caption"), "profile_sha256": digest}


def identity(plan: BenchPlan, sample: BenchSample, name: str) -> dict:
    """The record fields records.record_key reads."""
    profile = plan.profiles[name]
    method = plan.config(name)
    return {"task": TASK, "source": f"{utf8_name(os.path.realpath(plan.file))}#{sample.key}",
            "prompt": "\n".join(sample.questions),
            "settings": output_settings(profile) | {"method": method, "sample": sample.digest,
                                                    "batch_size": plan.batch_size}}


def sample_key(plan: BenchPlan, sample: BenchSample, name: str) -> tuple:
    return record_key(identity(plan, sample, name))


def plan_keys(plan: BenchPlan) -> set:
    return {sample_key(plan, s, m) for s in plan.samples for m in plan.methods}


def base_record(plan: BenchPlan, sample: BenchSample, name: str, session) -> dict:
    ident = identity(plan, sample, name)
    profile = plan.profiles[name]
    return {"input": f"{utf8_name(plan.file)}#{sample.key}", "task": TASK, "schema": SCHEMA,
            "prompt": ident["prompt"], "source": ident["source"], "settings": ident["settings"],
            "sample": sample.key, "line": sample.line, "category": sample.group,
            "method": name, "label": plan.label(name),
            "lossless": bool(session.lossless if session is not None else profile.lossless),
            "temperature": profile.sampling.temperature, "seed": profile.sampling.seed,
            "batch_size": plan.batch_size, "output": None, "error": None}


def error_record(plan: BenchPlan, item: BenchSample | SampleError, reason: str) -> dict:
    """A sample that failed (for every method): never counted as done, so a rerun tries it."""
    return {"input": f"{utf8_name(plan.file)}:{item.line}", "task": TASK, "schema": SCHEMA,
            "prompt": "",
            "source": f"{utf8_name(os.path.realpath(plan.file))}#{item.key}", "settings": {},
            "sample": item.key, "line": item.line, "category": item.group, "method": None,
            "output": None, "error": reason}


def tokens_digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode("ascii")).hexdigest()


def turn_entry(question: str, result, latency_s: float | None = None) -> dict:
    """One reply's part of a record: what was asked and answered, its tokens' hash (compared
    with target-only's), its latency (its own wall time; in a batch, its time in it)."""
    st = result.state.stats
    return {"prompt": question, "output": result.text, "new_tokens": len(result.tokens),
            "latency_s": round(st.wall_s if latency_s is None else latency_s, 6),
            "prefill_s": round(st.prefill_s, 6),
            "mean_acceptance_length": round(st.mean_accept_len, 4),
            "tokens_sha256": tokens_digest(result.tokens)}


def result_record(plan, sample, name, session, turns: list[dict], stats: SpecStats,
                  wall_s: float) -> dict:
    """``wall_s``: the sample's decoding time (alone: its replies' wall times summed; in a
    batch: its share of the batches' wall time), what speedups and tokens/s divide."""
    record = base_record(plan, sample, name, session)
    record |= {"output": turns[-1]["output"], "turns": turns, "new_tokens": stats.new_tokens,
               "wall_s": round(wall_s, 6), "stats": stats.to_dict()}
    return record


# -- one sample ------------------------------------------------------------------------------

def load_images(sample: BenchSample) -> list[tuple]:
    """Each turn's images, loaded once for every method (InputError naming the image)."""
    out = []
    for turn in sample.turns:
        images = []
        for path in turn.image_paths:
            try:
                images.append(load_image(path))
            except InputError as exc:
                raise InputError(sample.key, f"{exc.path}: {exc.reason}") from None
        out.append(tuple(images))
    return out


def reply_messages(sample: BenchSample, images: list[tuple], answers: list[str]) -> list[Message]:
    """The conversation up to the model's next reply, ``answers`` (its earlier replies) fed
    back as the assistant's turns."""
    out: list[Message] = []
    for idx, turn in enumerate(sample.turns):
        out.append(Message(turn.role, turn.text, images[idx]))
        if idx in sample.replies:
            done = sample.replies.index(idx)
            if done == len(answers):
                return out
            out.append(Message("assistant", answers[done]))
    raise IndexError(f"sample {sample.key} has {len(sample.replies)} replies")


def reply_request(session, sample: BenchSample, images, answers: list[str]) -> Request:
    """The request for the next reply (InputError when it cannot fit the positions)."""
    p = session.profile
    request = Request(reply_messages(sample, images, answers),
                      max_new_tokens=p.generation.max_new_tokens, seed=p.sampling.seed,
                      request_id=f"{sample.key}#{len(answers) + 1}")
    try:
        session.check_fits(request)
    except PromptError as exc:
        raise InputError(sample.key, f"turn {len(answers) + 1}: {exc}") from None
    return request


def decode_sample(session, sample: BenchSample, images, on_tokens=None) -> tuple[list, SpecStats]:
    """Every reply of ``sample`` in turn: (turn entries, their merged stats)."""
    answers, turns, stats = [], [], SpecStats()
    for question in sample.questions:
        request = reply_request(session, sample, images, answers)
        progress = (lambda st: on_tokens(len(st.tokens), request.max_new_tokens)) if on_tokens else None
        result = session.engine.generate(request, progress=progress)
        answers.append(result.text)
        turns.append(turn_entry(question, result))
        stats.merge(result.state.stats)
    return turns, stats


def rotated(methods: list[str], i: int) -> list[str]:
    """The methods in the order sample (or chunk) ``i`` runs them: rotated by one each time."""
    k = i % len(methods)
    return methods[k:] + methods[:k]


def forget_captions(session) -> None:
    """A caption-drafting input's cache emptied: no timed request finds its captions made."""
    captioner = session.engine.drafter.captioner   # (declared on every method)
    if captioner is not None:
        captioner.forget()


__all__ = ["BenchError", "BenchPlan", "BenchRun", "Item", "TASK", "build_sessions", "make_plan",
           "method_names", "method_profiles", "plan_keys"]
