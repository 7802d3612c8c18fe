"""Drafting methods as profiles name them, and the registry of them by name.

The engine's side of a drafter is runtime/round/draft.py (``Drafter``: prefill, propose,
accept, …). A ``DraftingMethod`` adds the profile's side, as class attributes and
classmethods that need no model:

- what it supports: ``tasks`` (caption, image, video), ``batches`` (batch_size > 1),
  ``prunes`` (prune:), ``relaxes`` (acceptance: relaxed), ``trees``; whether it
  ``drafts`` at all (``none`` does not) and ``uses_draft`` (a separate draft model);
- ``check(profile)``: its own profile checks, run before any model loads;
  ``check_models(profile, adapter_of)``: those that need the models' families (their
  configs, not their weights), run by the session before anything loads;
- ``models(profile)`` and ``from_profile(profile, target, sampling, trace)``: what it
  loads next to the loaded target, and building itself;
- ``gamma(profile)``: the most tokens one round can accept (the engine's γ), the one
  answer every record, summary, warm-up and hardware profile uses (with
  ``drafting.length: auto`` the ceiling of the γ chosen per round); nothing outside this
  package and the profile reads ``drafting.gamma`` itself (tests/test_structure.py);
  ``round_width(profile)``: the most tokens one round feeds the target (γ + 1 for a
  chain, a tree's nodes + 1), what caches are sized for and a verify step is timed at;
  ``draft_length(profile)``: "auto" when its rounds' γ is chosen per round
  (runtime/length/draft_length.py; a tree's depth; in a batch, per row), "fixed" otherwise
  (no drafting, the hidden-state heads' trees);
- ``describe(profile)`` and ``label(profile)``: the line the CLI prints before decoding
  and the method's name with its shape in a summary;
- ``record_fields(profile, task)``: what a record says of its settings;
- ``drafting_inputs(profile)``, ``draft_rows(profile)``: the inputs it reads requests
  through and the rows its draft model runs per step;
- ``compile_plan(profile)``, ``plain_draft_steps(profile)``: the steps its decoding
  runs (what ``runtime.compile`` compiles before decoding);
- ``searched_first``, ``search_rank``, ``own_probe(profile)``: where ``vlmspec calibrate``
  starts, which families it probes first, and how it replays the profile's own configuration;
- ``beside(profile, shipped)``: what it needs to run from a profile written for another
  method (``vlmspec bench`` runs every method from one profile).

A method is one module of this package with a ``@register("name")`` class; the package
imports every module, so nothing else lists the methods, and nothing outside this package
compares a method's name (tests/test_structure.py).
"""

from __future__ import annotations

from typing import Callable

from vlmspec_cli.runtime.round.draft import Drafter

TASK_COMMANDS = {"caption": "caption", "image": "generate-image", "video": "describe-video"}


class DraftingMethod(Drafter):
    tasks: tuple[str, ...] = ("caption",)
    batches = False
    prunes = False
    relaxes = False
    trees = False         # drafts trees (per-token acceptance lengths: generate-image heatmaps)
    traces = False        # writes --trace's lines (per drafting block); others refuse --trace
    drafts = True         # proposes tokens (False: the target decodes alone)
    uses_draft = True     # drafts with a separate draft model (profile section draft:)
    help = ""             # what --method's help says of it
    searched_first: tuple[str, ...] = ()   # tasks whose calibration starts from it
    # the order ``vlmspec calibrate`` first probes method families in (lower first): the
    # likelier a family wins where it applies, the earlier a short --budget still tries it
    search_rank = 5
    draft = None          # the separate draft model it loaded (runtime.models.LoadedModel)
    captioner = None      # the runtime.models.captioner.Captioner behind drafting input C

    @classmethod
    def check(cls, profile) -> None:
        """Profile checks that need no model; raise ValueError with the user's message."""

    @classmethod
    def check_models(cls, profile, adapter_of) -> None:
        """Checks that need the families of its models but none of their weights, run
        before anything loads; raise ValueError with the user's message. ``adapter_of(role)``:
        the family adapter (runtime/adapters/) of the model in that profile section, read
        from its config, or None where the config is not on this machine. A method with a
        separate draft model refuses the drafting inputs the draft's family cannot build."""
        if cls.uses_draft and profile.task != "image":
            from vlmspec_cli.drafters.inputs import check_family

            check_family(cls.drafting_inputs(profile), adapter_of("draft"), profile.draft.model)

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
    def round_width(cls, profile) -> int:
        """The most tokens one round feeds the target (the session sizes the caches for it,
        ``vlmspec profile`` times the verify step at it): the pending token and up to γ
        proposals for a chain."""
        return cls.gamma(profile) + 1

    def position_readers(self, profile) -> list[tuple[str, object]]:
        """The separate draft reads the target's positions when it is fed the multimodal
        prompt or an image grid; a text, caption or pooled draft reads its own sequence."""
        if self.draft is not None and (profile.task == "image"
                                       or "multimodal" in profile.drafting.inputs):
            return [("draft", self.draft)]
        return []

    @classmethod
    def draft_length(cls, profile) -> str:
        """``drafting.length`` as it applies: a method drafting chains of up to γ or trees
        (γ: their depth, each round's tree cut to the k chosen) takes it as set (in a
        batch, generation.batch_size > 1, each row's k is its own); no drafting is
        fixed."""
        return profile.drafting.length if cls.drafts else "fixed"

    @classmethod
    def describe(cls, profile) -> str:
        """What the CLI adds after "method NAME" (", draft … γ=5"), or ""."""
        return ""

    @classmethod
    def label(cls, profile) -> str:
        """The method with its shape, as a summary names it: "chain (γ=7)", "chain (γ auto ≤ 12)"."""
        return f"{cls.name} ({gamma_text(cls, profile)})"

    @classmethod
    def drafting_inputs(cls, profile) -> list[str]:
        """The drafting inputs it reads requests through ([]: it drafts from the target's
        own states, or not at all)."""
        return list(profile.drafting.inputs)

    @classmethod
    def draft_rows(cls, profile) -> int:
        """Rows its draft model runs per step (an ensemble: one per input)."""
        return 1

    @classmethod
    def record_fields(cls, profile, task: str) -> dict:
        """What a record says of the method's settings, after "method": for captions and
        videos its drafting inputs and γ (then any section of its own); image records
        carry only sections of their own."""
        if task == "image":
            return {}
        return {"drafting_inputs": cls.drafting_inputs(profile), "gamma": cls.gamma(profile),
                "draft_length": cls.draft_length(profile)}

    @classmethod
    def compile_plan(cls, profile) -> list[tuple[str, int, str, int | None]]:
        """The steps its decoding runs, for ``runtime.compile``'s warm-up (Session.warm_up):
        (model role, rows up to, mask kind, rows of the batch or None for the model's
        own). A chain verifies its round's width (γ + 1) rows; its draft decodes one."""
        return [("target", cls.round_width(profile), "causal", None), ("draft", 2, "causal", None)]

    @classmethod
    def plain_draft_steps(cls, profile) -> bool:
        """Its draft model decodes one row with plain causal steps (no per-step masks): a
        greedy chain can then be drafted in one compiled call, and compiling the draft
        can pay (runtime/fast/compiled_step.py ``draft_pays``)."""
        return False

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        """How ``vlmspec calibrate`` replays the profile's own configuration: (whether it
        drafts chains of γ to replay, the draft model's rows per level for the latency
        tables (0: time it), a tree's (depth, top_k, total_tokens) or None)."""
        return False, 0, None

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        """Dotted settings (besides ``method``) that run this method from ``profile``,
        written for another method: ``vlmspec bench`` runs every method from one profile.
        ``shipped``: the models shipped for the profile's target that this method loads
        (companions.py SHIPPED_COMPANIONS: a hidden-state head, a twig)."""
        return {}

    @classmethod
    def untrained_hint(cls, profile) -> str:
        """What to do when ``profile``'s target has no model of this method's trained for
        it (``models``' head or twig was trained for another target): the end of a
        one-line refusal."""
        return ""

    @classmethod
    def task_error(cls, task: str, methods: list[str]) -> str:
        """The message when ``task`` is not among ``tasks`` (``methods``: those it allows)."""
        hint = " (a chain is tree.top_k: 1)" if task == "image" else ""
        return (f"{TASK_COMMANDS[task]} supports methods {', '.join(methods)}, not "
                f"'{cls.name}'{hint}")


def tree_section(profile, policy: bool = False) -> dict:
    """Section tree: as records carry it (image records name its policy too)."""
    t = profile.tree
    out = {"depth": t.depth, "top_k": t.top_k, "total_tokens": t.total_tokens}
    return out | {"policy": t.policy} if policy else out


def method_help(task: str | None) -> str:
    """--method's help for a command (method_catalogue.format_help): every method of the
    task with what it does; no ``task``: every method, with the tasks it serves."""
    from vlmspec_cli.method_catalogue import format_help

    return format_help({n: {"tasks": tuple(_REGISTRY[n].tasks), "help": _REGISTRY[n].help}
                        for n in method_names()}, task)


def first_searched(profile) -> str:
    """The method ``vlmspec calibrate`` searches a task from when the profile's method does
    not draft: the first registered for it whose models the profile has."""
    first = [n for n in method_names() if profile.task in _REGISTRY[n].searched_first]
    usable = [n for n in first if profile.draft.model or not _REGISTRY[n].uses_draft]
    return (usable or first or [profile.method])[0]


def gamma_text(method, profile) -> str:
    """γ as a line names it: "γ=7", or "γ auto ≤ 12" when chosen per round."""
    auto = method.draft_length(profile) == "auto"
    return f"γ auto ≤ {method.gamma(profile)}" if auto else f"γ={method.gamma(profile)}"


def draft_line(profile, method=None) -> str:
    """``describe`` of the methods with a separate draft model drafting chains (``method``:
    its class, whose γ it names; without one, drafting.gamma as set)."""
    gamma = gamma_text(method, profile) if method is not None else f"γ={profile.drafting.gamma}"
    return f", draft {profile.draft.model} {list(profile.drafting.inputs)} {gamma}"


def first_input(profile) -> dict:
    """``beside`` of a method that drafts from one input, from a profile with several (an
    ensemble's): its first."""
    inputs = list(profile.drafting.inputs)
    return {"drafting.inputs": inputs[:1]} if len(inputs) > 1 else {}


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
