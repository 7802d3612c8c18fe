"""Drafting methods as profiles name them, and the registry of them by name.

The engine's side of a drafter is runtime/draft.py (``Drafter``: prefill, propose,
accept, …). A ``DraftingMethod`` adds the profile's side, as class attributes and
classmethods that need no model:

- what it supports: ``tasks`` (caption, image, video), ``batches`` (batch_size > 1),
  ``prunes`` (prune:), ``relaxes`` (acceptance: relaxed);
- ``check(profile)``: its own profile checks, run before any model loads;
- ``from_profile(profile, target, sampling, trace)``: load what it needs next to the
  loaded target and build itself;
- ``gamma(profile)``: the most tokens one round can accept (the engine's γ);
- ``describe(profile)``: the line the CLI prints about it.

A method is one module of this package with a ``@register("name")`` class; the package
imports every module, so nothing else lists the methods.
"""

from __future__ import annotations

from typing import Callable

from vlmspec_cli.runtime.draft import Drafter

TASK_COMMANDS = {"caption": "caption", "image": "generate-image", "video": "describe-video"}


class DraftingMethod(Drafter):
    tasks: tuple[str, ...] = ("caption",)
    batches = False
    prunes = False
    relaxes = False
    trees = False         # drafts trees (per-token acceptance lengths: generate-image heatmaps)
    draft = None          # the separate draft model it loaded (runtime.models.LoadedModel)
    captioner = None      # the runtime.captioner.Captioner behind drafting input C

    @classmethod
    def check(cls, profile) -> None:
        """Profile checks that need no model; raise ValueError with the user's message."""

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "DraftingMethod":
        """Load what the method needs (next to ``target``, already loaded) and build it.
        ``trace``: a callable for per-block records (--trace), if the method has any."""
        raise NotImplementedError

    @classmethod
    def models(cls, profile) -> list[tuple[str, str | None]]:
        """(role, model name) of every model ``from_profile`` loads besides the target, so
        the session can refuse pickle-only weights before anything loads."""
        return []

    @classmethod
    def gamma(cls, profile) -> int:
        return profile.drafting.gamma

    @classmethod
    def describe(cls, profile) -> str:
        """What the CLI adds after "method NAME" (", draft … γ=5"), or ""."""
        return ""

    @classmethod
    def task_error(cls, task: str, methods: list[str]) -> str:
        """The message when ``task`` is not among ``tasks`` (``methods``: those it allows)."""
        hint = " (a chain is tree.top_k: 1)" if task == "image" else ""
        return (f"{TASK_COMMANDS[task]} supports methods {', '.join(methods)}, not "
                f"'{cls.name}'{hint}")


def draft_line(profile) -> str:
    """``describe`` of the methods with a separate draft model drafting chains."""
    return f", draft {profile.draft.model} {list(profile.drafting.inputs)} γ={profile.drafting.gamma}"


def one_input(profile) -> str:
    """The single drafting input of a method that reads the request one way."""
    inputs = list(profile.drafting.inputs)
    if len(inputs) != 1:
        raise ValueError(
            f"method '{profile.method}' drafts from one input, but drafting.inputs is {inputs}; "
            "to ensemble several inputs use method 'tabed'"
        )
    return inputs[0]


_REGISTRY: dict[str, type[DraftingMethod]] = {}


def register(name: str) -> Callable[[type[DraftingMethod]], type[DraftingMethod]]:
    def deco(cls: type[DraftingMethod]) -> type[DraftingMethod]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def method_names() -> list[str]:
    """The registered methods: none (the baseline) first, then in the order their modules
    register them (modules by file name, classes by their place in the file)."""
    return sorted(_REGISTRY, key=lambda n: n != "none")


def method_class(name: str) -> type[DraftingMethod]:
    if name not in _REGISTRY:
        from vlmspec_cli.suggest import did_you_mean

        hint = did_you_mean(name, _REGISTRY)
        raise ValueError(f"unknown method '{name}'{hint}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def create_drafter(name: str, **kwargs) -> DraftingMethod:
    """The method's drafter from keyword settings (tests, benchmarks, calibrate)."""
    return method_class(name)(**kwargs)
