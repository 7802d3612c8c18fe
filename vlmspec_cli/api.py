"""A small Python API: what the CLI decodes, from Python.

    from vlmspec_cli import api

    pipe = api.load()                                   # the default caption profile
    res = pipe.caption("examples/images/scene1.png")    # a path or a PIL image
    print(res.text, res.stats["mean_acceptance_length"])
    pipe.caption(image, "what colour is the circle?", max_new_tokens=16)

    video = api.load("tinyworld-video", max_new_tokens=24)
    video.describe_video("examples/videos/<a clip>")

    # a target you already loaded with transformers, drafted by a vlmspec method
    pipe = api.from_model(model, processor, method="none")

``load`` takes a profile name or path (default: the default caption profile), profile
keys as ``--set`` takes them (``overrides=["drafting.gamma=3"]``) and settings as keyword
arguments: ``max_new_tokens``, ``temperature``, ``top_p``, ``seed``, ``prompt``,
``method``, ``gamma``, ``inputs`` (M, T, C, P or their names), ``device``, or any profile
key with ``__`` for its dots (``tree__depth=4``). A call's own keyword arguments are the
same settings for that call (a pipeline with them is built once, on the same target).
Results are those of ``vlmspec caption`` / ``describe-video`` for the same input and
settings: the same requests, checks and engine. No click or rich here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# keyword arguments -> profile keys (any other: its "__" read as ".")
ALIASES = {"max_new_tokens": "generation.max_new_tokens", "prompt": "generation.prompt",
           "temperature": "sampling.temperature", "top_p": "sampling.top_p",
           "seed": "sampling.seed", "gamma": "drafting.gamma", "inputs": "drafting.inputs",
           "method": "method"}


@dataclass
class Result:
    text: str
    tokens: list[int]
    stats: dict = field(default_factory=dict)   # as a record's "stats" (vLLM's names)


def _keys(settings: dict) -> dict:
    """Keyword settings as dotted profile keys (``device`` sets target and draft)."""
    from vlmspec_cli.drafting_inputs import parse_inputs

    out: dict[str, Any] = {}
    for name, value in settings.items():
        if name == "device":
            out.update({"target.device": value, "draft.device": value})
            continue
        key = ALIASES.get(name, name.replace("__", "."))
        if key == "drafting.inputs" and isinstance(value, str):
            value = parse_inputs(value)
        out[key] = value
    return out


def _labels(settings: dict) -> dict:
    """How a profile error names each keyword setting: as the keyword the caller passed
    (``gama=3``), not as a command line option."""
    out = {}
    for name, value in settings.items():
        keys = (["target.device", "draft.device"] if name == "device"
                else [ALIASES.get(name, name.replace("__", "."))])
        out.update({k: f"keyword argument {name}={value!r}" for k in keys})
    return out


def load(profile: str | Path | None = None, *, overrides=(), **settings) -> "Pipeline":
    """The pipeline of a profile: its models loaded, ready to decode (``overrides``:
    ``KEY=VALUE`` strings as ``--set`` takes them; ``settings``: see the module)."""
    from vlmspec_cli.profile import load_profile

    prof = load_profile(None if profile is None else str(profile), overrides=list(overrides),
                        cli=_keys(settings), labels=_labels(settings))
    return Pipeline.build(prof)


def from_model(model, processor=None, *, tokenizer=None, name: str | None = None,
               profile: str | Path | None = None, overrides=(), **settings) -> "Pipeline":
    """A pipeline around a target already loaded with transformers (``model``, with its
    ``processor`` or ``tokenizer``): the profile's method drafts for it (the default
    caption profile's draft, unless ``method``/``draft__model`` say otherwise; its
    tokenizer is checked against the target's as always)."""
    from vlmspec_cli.profile import load_profile

    target = wrap_model(model, processor, tokenizer=tokenizer, name=name)
    keys = _keys(settings) | {"target.model": target.name}
    prof = load_profile(None if profile is None else str(profile), overrides=list(overrides),
                        cli=keys, labels=_labels(settings))
    return Pipeline.build(prof, target=target)


def wrap_model(model, processor=None, *, tokenizer=None, name: str | None = None):
    """A transformers model as the runtime's ``LoadedModel`` (its family adapter picked by
    ``config.model_type``, its device and dtype read off its weights)."""
    from vlmspec_cli.runtime.adapters import adapter_for
    from vlmspec_cli.runtime.models.loading import LoadedModel

    if processor is not None and not hasattr(processor, "tokenizer"):   # a tokenizer
        tokenizer, processor = tokenizer or processor, None
    tokenizer = tokenizer or getattr(processor, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("wrap_model needs the model's processor or tokenizer")
    weight = next(model.parameters())
    name = name or str(getattr(model, "name_or_path", "") or type(model).__name__)
    return LoadedModel(name, model.eval(), processor, tokenizer, adapter_for(model.config),
                       weight.device, weight.dtype)


class Pipeline:
    """A profile's session (models, method, engine) and what decodes with it."""

    def __init__(self, session) -> None:
        self.session = session
        self.profile = session.profile
        self._derived: dict[tuple, Pipeline] = {}

    @classmethod
    def build(cls, profile, target=None) -> "Pipeline":
        """Load the profile's models (``target``: one already loaded) and, as the CLI does
        before decoding, decide and warm up compiled steps for a job of one request."""
        from vlmspec_cli.session import build_session, match_companions

        try:   # the head or twig shipped for the target, as the CLI's -m takes it
            profile, _ = match_companions(profile)
        except ValueError:   # an unknown method: build_session says so
            pass
        session = build_session(profile, target=target)
        if session.plan_compile(profile.generation.max_new_tokens):
            session.warm_up()
        return cls(session)

    def with_settings(self, **settings) -> "Pipeline":
        """This pipeline with other settings (built once per set, on the same target)."""
        keys = _keys(settings)
        if not keys:
            return self
        key = tuple(sorted((k, repr(v)) for k, v in keys.items()))
        if key not in self._derived:
            from vlmspec_cli.profile import with_settings

            self._derived[key] = Pipeline.build(with_settings(self.profile, keys, "api"),
                                                target=self.session.target)
        return self._derived[key]

    def caption(self, image, prompt: str | None = None, **settings) -> Result:
        """Caption (or answer ``prompt`` about) one image: a path or a PIL image."""
        from vlmspec_cli.runtime.request import Message
        from vlmspec_cli.tasks.caption import Job, image_jobs
        from vlmspec_cli.tasks.inputs import InputItem

        pipe = self.with_settings(**settings)
        pipe._task("caption", "caption")
        prompt = pipe.profile.generation.prompt if prompt is None else prompt
        if isinstance(image, (str, Path)):
            job = image_jobs([InputItem(str(image))], prompt)[0]
        else:
            job = Job("<image>", prompt, lambda: [Message("user", prompt, (image.convert("RGB"),))])
        return pipe._decode(job)

    def describe_video(self, video: str | Path, prompt: str | None = None, **settings) -> Result:
        """Describe one video file (or folder of frames), sampled as the profile's
        ``video:`` section says."""
        from vlmspec_cli.tasks.video import expand_video_inputs, video_jobs

        pipe = self.with_settings(**settings)
        pipe._task("video", "describe_video")
        items = expand_video_inputs([str(video)])
        if len(items) != 1:
            raise ValueError(f"{video}: describe_video takes one video, found {len(items)}")
        v, p = pipe.profile.video, pipe.profile
        job, = video_jobs(items, p.generation.prompt if prompt is None else prompt, v.frames,
                          v.fps, v.max_pixels, v.folder_fps, v.max_frames)
        return pipe._decode(job)

    def _task(self, task: str, call: str) -> None:
        if self.profile.task != task:
            raise ValueError(f"profile '{self.profile.name}' is for task '{self.profile.task}', "
                             f"not '{task}': {call}() needs a {task} profile")

    def _decode(self, job) -> Result:
        """The CLI's request for the job (loaded, checked against the model's positions;
        InputError when it cannot be), decoded by the profile's engine."""
        from vlmspec_cli.tasks.caption import make_request

        result = self.session.engine.generate(make_request(self.session, job))
        return Result(result.text, list(result.tokens), result.state.stats.to_dict())


__all__ = ["Pipeline", "Result", "from_model", "load", "wrap_model"]
