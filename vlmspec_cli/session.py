"""Build the runtime a profile describes: target, drafter and engine, shared by every
subcommand. Knows nothing of click or rich.

The method's own checks and how it is built live with it (drafters/<name>.py,
``DraftingMethod``); here are the checks every method shares (task, batch size, pruning,
relaxed acceptance) and the target's loading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmspec_cli.companions import SHIPPED_COMPANIONS
from vlmspec_cli.drafters import DraftingMethod, method_class, method_names
from vlmspec_cli.drafters.draft_model import check_image_model
from vlmspec_cli.runtime import limits
from vlmspec_cli.runtime.length.draft_cost import cannot_pay
from vlmspec_cli.runtime.length.draft_length import AutoGamma
from vlmspec_cli.runtime.round.round_policy import AutoLength
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.models.loading import (LoadedModel, ModelLoadError, load_model, missing_offline,
                                        peek_adapter, require_safetensors, use_fast_path)
from vlmspec_cli.runtime.threads import ThreadPlan
from vlmspec_cli.runtime.round.verify import Relaxation, SamplingParams


class SessionError(Exception):
    """The profile asks for something this runtime cannot do; the message says what."""


@dataclass
class Session:
    profile: object
    target: LoadedModel
    draft: LoadedModel | None
    captioner: LoadedModel | None
    engine: SpeculativeEngine
    sampling: SamplingParams
    _baseline: SpeculativeEngine | None = field(default=None, init=False, repr=False)
    compile_reason: str = field(default="", init=False)   # runtime.compile, as decided
    threads: ThreadPlan = field(default_factory=ThreadPlan)   # runtime.threads, resolved
    # the profile's method (drafters/): what its records, summary and warm-up say of it
    method: type[DraftingMethod] | None = None

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = method_class(self.profile.method)

    @property
    def lossless(self) -> bool:
        return bool(self.profile.lossless and self.engine.drafter.lossless)

    def use_batch_size(self, rows: int) -> None:
        """Decode ``rows`` requests together from now on (--batch-size auto, measured:
        tasks/batch_auto.py)."""
        from vlmspec_cli.profile import with_settings

        self.profile = with_settings(self.profile, {"generation.batch_size": rows},
                                     source="--batch-size auto")

    def position_readers(self) -> list[tuple[str, LoadedModel]]:
        """(role, model) of the target and of the models that read its positions."""
        return [("target", self.target), *self.engine.drafter.position_readers(self.profile)]

    def check_fits(self, request, generated: str = "max_new_tokens") -> None:
        """runtime.limits.check_fits against this session's models (raises PromptError)."""
        limits.check_fits(self.target, self.position_readers(), request, generated)

    def check_prompt_fits(self, prompt: str, generated: str = "max_new_tokens") -> None:
        """runtime.limits.check_prompt_fits against this session's models."""
        limits.check_prompt_fits(self.target, self.position_readers(), prompt,
                                 self.profile.generation.max_new_tokens, generated)

    def fast_path_summary(self) -> str:
        """Which models decode on the static-cache fast path and which through
        transformers' forward, and why (for the line a command prints before decoding)."""
        models = [("target", self.target), ("draft", self.draft)]
        fast = [role for role, lm in models if lm is not None and lm.fast is not None]
        slow = [f"{role} ({lm.fast_off_reason})" for role, lm in models
                if lm is not None and lm.fast is None]
        parts = []
        if fast:
            parts.append(f"fast path (static cache): {', '.join(fast)}")
        if slow:
            parts.append(f"transformers' forward: {', '.join(slow)}")
        threads = self.threads.describe()   # with any auto count lowered now, and why
        if threads:
            parts.append(threads)
        if self.compile_reason:
            roles = [role for role, lm in models if lm is not None and lm.fast is not None
                     and lm.fast.compiled is not None]
            state = f"on: {', '.join(roles)}" if roles else "off"
            parts.append(f"compiled steps {state} ({self.compile_reason})")
        return "; ".join(parts)

    def _fast_models(self):
        return [lm for lm in (self.target, self.draft) if lm is not None and lm.fast is not None]

    def _compiled_models(self):
        return [lm for lm in self._fast_models() if lm.fast.compiled is not None]

    def plan_compile(self, expected_tokens: int) -> bool:
        """Decide ``runtime.compile`` for a job of about ``expected_tokens`` tokens (see
        runtime/fast/compiled_step.py ``decide``) and set it on the fast-path models; True when
        their steps will be compiled (``warm_up`` then compiles them). SessionError when
        ``on`` cannot keep its compile cache."""
        from vlmspec_cli.runtime.fast.compiled_step import (cache_dir_problem, decide, draft_pays,
                                                       set_compiled)

        mode, hardware = self.profile.runtime.compile, self.profile.hardware
        on, self.compile_reason = decide(mode, hardware, expected_tokens)
        problem = cache_dir_problem() if on else None
        if problem and mode == "on":
            raise SessionError(f"runtime.compile: on: {problem}")
        if problem:
            on, self.compile_reason = False, f"auto: {problem}"
        if not self._fast_models():
            on, self.compile_reason = False, "needs the fast path, which no model is on"
        p = self.profile
        plain = self.method.plain_draft_steps(p)
        quantized = []
        for role, lm in (("target", self.target), ("draft", self.draft)):
            if lm is None or lm.fast is None:
                continue
            wanted = on and (lm is self.target or draft_pays(mode, hardware, plain))
            if wanted and lm is self.target and self.engine.runs_target:
                # the twig runs the target's layers in parts (trunk.py), not whole steps
                wanted = False
                self.compile_reason += f"; not the target (method {p.method} runs its layers in parts)"
            if wanted and getattr(lm.model, "is_quantized", False):
                # bitsandbytes' layers are not traced into a graph (not tried; kept eager)
                wanted = False
                quantized.append(role)
            set_compiled(lm.fast, wanted)
        if quantized:
            self.compile_reason += f"; not the quantized {' and '.join(quantized)}"
        return bool(self._compiled_models())

    def warm_up(self) -> float:
        """Compile, before decoding, the steps the method will run (its ``compile_plan``:
        for the target, one token and every verification size up to its largest round, a
        tree's with its mask; for the draft, its steps: an ensemble's padded rows, a
        tree's frontier with its mask). Returns the seconds it took."""
        p = self.profile
        layer = getattr(self.engine.drafter, "hidden_layer", None)   # hidden-state drafts
        models = {"target": self.target, "draft": self.draft}
        seconds = 0.0
        for role, up_to, mask, rows in self.method.compile_plan(p):
            lm = models[role]
            if lm is None or lm.fast is None or lm.fast.compiled is None:
                continue
            seconds += lm.fast.compiled.warm_up({up_to}, batch=rows or lm.adapter.decode_rows,
                                                hidden_layer=layer if role == "target" else None,
                                                masks=(mask,))
        if (self.method.plain_draft_steps(p) and self.sampling.greedy and self.draft is not None
                and self.draft in self._compiled_models()):
            seconds += self.draft.fast.compiled.warm_up_chain(self.method.gamma(p))
        return seconds

    def set_threads(self, plan: ThreadPlan) -> None:
        """Run this session's engines (the method's, target-only's) under ``plan``."""
        self.threads = self.engine.threads = plan
        if self._baseline is not None:
            self._baseline.threads = plan

    def baseline_engine(self) -> SpeculativeEngine:
        """Target-only decoding with the same sampling settings (for --compare); built once
        per session, since engines keep no per-request state."""
        if self._baseline is None:
            self._baseline = SpeculativeEngine(self.target, method_class("none")(), 1,
                                               self.sampling)
            self._baseline.threads = self.threads
        return self._baseline

    def batched_engine(self, rows: int | None = None) -> SpeculativeEngine:
        """The engine, decoding generation.batch_size requests together (``run``; the
        methods that batch), with the same drafter; ``rows``: that many instead."""
        self.engine.drafter.check_batch()
        engine = SpeculativeEngine(self.target, self.engine.drafter, self.engine.gamma,
                                   self.sampling, rows or self.profile.generation.rows)
        engine.threads = self.threads
        # drafting.length auto: each row's k by its own length model over the process's
        # costs (round_policy.AutoLength.admit)
        engine.use_policy(self.engine.policy)
        return engine


def _supporting(check) -> list[str]:
    """The methods for which ``check(cls)`` holds (none, the baseline, first)."""
    return [n for n in method_names() if check(method_class(n))]


def tree_methods() -> list[str]:
    """The methods that draft trees (their records have per-token acceptance lengths)."""
    return _supporting(lambda m: m.trees)


def _same_model(a: str, b: str) -> bool:
    """Whether two model names (zoo names, paths, hub ids) name one model."""
    import os

    from vlmspec_cli.runtime.models.loading import ModelLoadError, resolve_model_source

    if a == b:
        return True
    try:
        return os.path.realpath(resolve_model_source(a)) == os.path.realpath(resolve_model_source(b))
    except ModelLoadError:
        return False


def _trained_for(name: str | None) -> str | None:
    """The shipped target a shipped head or twig was trained on (None: not a shipped one)."""
    for target, kinds in SHIPPED_COMPANIONS.items():
        if name and any(_same_model(name, m) for models in kinds.values() for m in models):
            return target
    return None


def shipped_companion(name: str) -> bool:
    """Whether ``name`` is a head or twig shipped with vlmspec (for any target)."""
    return _trained_for(name) is not None


def _shipped_for(target: str) -> dict:
    return next((kinds for t, kinds in SHIPPED_COMPANIONS.items() if _same_model(t, target)), {})


def match_companions(profile) -> tuple[object, list[str]]:
    """``profile`` with the shipped head or twig its method loads replaced by the one
    shipped for its target, where the profile's (often the schema's default, under ``-m
    hidden`` or ``-m twig``) was trained for another shipped target, or set where the
    profile names none (``-m eagle3``: no default head); and a note per replacement. A
    head or twig trained for another target and none shipped for this one is left for
    ``validate_method`` to refuse, as is no head at all."""
    from vlmspec_cli.profile import with_settings

    method = method_class(profile.method)
    notes = []
    for role, name in method.models(profile):
        if name is None:   # only this key: the rest of the method's section is the user's
            shipped = tuple(_shipped_for(profile.target.model).get(role, ()))
            if shipped:
                profile = with_settings(profile, {f"{role}.model": shipped[0]},
                                        source=f"method {profile.method}")
                notes.append(f"{role}.model not set; using {shipped[0]}, trained for target "
                             f"{profile.target.model}")
            continue
        trained = _trained_for(name)
        if trained is None or _same_model(trained, profile.target.model):
            continue
        shipped = tuple(_shipped_for(profile.target.model).get(role, ()))
        settings = method.beside(profile, shipped) if shipped else {}
        if settings:
            profile = with_settings(profile, settings, source=f"method {profile.method}")
            notes.append(f"{role}.model {name} was trained for {trained}; using "
                         f"{shipped[0]}, trained for target {profile.target.model}")
    return profile, notes


def foreign_companions(profile) -> list[str]:
    """The roles (``hidden``, ``twig``, …) of the profile's method whose model is a shipped
    head or twig trained for another target than the profile's (``validate_method``
    refuses them): ``profiles new`` writes null there, for the user's own."""
    return [role for role, name in method_class(profile.method).models(profile)
            if (trained := _trained_for(name)) is not None
            and not _same_model(trained, profile.target.model)]


def method_for_models(profile) -> tuple[object, str]:
    """The default profile's method reads a head or twig trained for its own target (the
    shipped default drafts with its target's hidden-state head): pointed at another target
    (``--model``) for which none is shipped, a command without ``--method`` decodes with
    what the given models allow, as before the default took a head: the first method of the
    task with a draft model where the profile names a draft, else target-only decoding; and
    a line saying so. Unchanged (and "") where the method's models fit the target."""
    from vlmspec_cli.drafters import method_names
    from vlmspec_cli.profile import with_settings

    roles = foreign_companions(profile)
    if not roles:
        return profile, ""
    task = [n for n in method_names() if profile.task in method_class(n).tasks]
    drafting = [n for n in task if method_class(n).drafts and method_class(n).uses_draft]
    name = drafting[0] if drafting and profile.draft.model else \
        next(n for n in task if not method_class(n).drafts)
    old = profile.method
    profile = with_settings(profile, {"method": name}, source="--model")
    using = f"{name} with draft {profile.draft.model}" if method_class(name).uses_draft else name
    return profile, (f"method {old} reads a {roles[0]} model trained for another target, and "
                     f"none is shipped for {profile.target.model}: decoding with {using} "
                     f"(--method picks another)")


def validate_method(profile) -> type[DraftingMethod]:
    """Checks that need no model: run them before loading anything (and for --dry-run).
    Returns the method's class."""
    try:
        method = method_class(profile.method)
    except ValueError as exc:
        raise SessionError(str(exc)) from None
    task = profile.task
    if task not in method.tasks:
        raise SessionError(method.task_error(task, _supporting(lambda m: task in m.tasks)))
    if profile.acceptance == "relaxed" and not (task == "image" and method.relaxes):
        relaxing = _supporting(lambda m: m.relaxes and "image" in m.tasks)
        raise SessionError("acceptance: relaxed (LANTERN) compares VQ image codes: it needs "
                           f"generate-image with method {' or '.join(relaxing)}")
    a = profile.adaptive_tree
    if a.min_depth > a.max_depth or a.min_top_k > a.max_top_k:
        raise SessionError("adaptive_tree: min_depth must be <= max_depth and min_top_k <= max_top_k")
    inputs = list(profile.drafting.inputs)
    if len(set(inputs)) != len(inputs):
        raise SessionError(f"drafting.inputs lists an input twice: {inputs}")
    if profile.prune.active and not method.prunes:
        pruning = " or ".join(f"'{n}'" for n in _supporting(lambda m: m.prunes))
        raise SessionError(f"prune (visual-token pruning) works with method {pruning} only, not "
                           f"'{profile.method}'; remove prune.keep / prune.final_wipe")
    if profile.runtime.compile == "on" and profile.runtime.fast_path == "off":
        raise SessionError("runtime.compile: on compiles the fast path's steps; it needs "
                           "runtime.fast_path auto or on, not off")
    if profile.generation.rows > 1 and task == "image":   # (tree batches captions, not images)
        raise SessionError("generation.batch_size > 1: generate-image decodes "
                           "one image at a time (a guided target already runs two rows per "
                           "image, the prompt's and the guiding one); set "
                           "generation.batch_size: 1")
    if profile.generation.rows > 1 and not method.batches:
        *most, last = _supporting(lambda m: m.batches)
        raise SessionError(f"generation.batch_size > 1 (--batch-size) works with methods "
                           f"{', '.join(most)} and {last}; "
                           f"'{profile.method}' decodes one request at a time (use --batch-size 1)")
    try:
        method.check(profile)
    except ValueError as exc:
        raise SessionError(str(exc)) from None
    for role, name in method.models(profile):   # a shipped head or twig of another target
        trained = _trained_for(name)
        if trained is not None and not _same_model(trained, profile.target.model):
            hint = method.untrained_hint(profile)
            raise SessionError(f"{role}.model {name} was trained for target {trained}, not "
                               f"{profile.target.model}" + (f": {hint}" if hint else ""))
    return method


def build_session(profile, trace=None, target: LoadedModel | None = None) -> Session:
    """Load the models the profile names and build its engine. ``trace``: a callable that
    receives one dict per drafting block of an ensemble (for ``--trace``). ``target``: the
    profile's target, already loaded by an earlier session of the same ``target:`` section
    (calibrate builds one session per configuration around one target); its fast path and
    guidance are set again for this profile."""
    method = validate_method(profile)
    named = [("target", profile.target.model), *method.models(profile)]
    for role, name in named:
        require_safetensors(name, role)  # pickle-only weights: refused before any model loads
    offline = missing_offline(named[1:] if target is not None else named)
    if offline:                          # every one of them, not the target alone
        raise ModelLoadError(offline)
    try:   # what the models' families cannot do: refused from their configs, before loading
        method.check_models(profile, lambda role: peek_adapter(getattr(profile, role), role))
    except ValueError as exc:
        raise SessionError(str(exc)) from None
    sampling = SamplingParams(profile.sampling.temperature, profile.sampling.top_p)
    if target is None:
        target = load_model(profile.target, "target")
    try:
        _prepare_target(profile, target)
        drafter = method.from_profile(profile, target, sampling, trace=trace)
    except ValueError as exc:
        raise SessionError(str(exc)) from None
    engine = SpeculativeEngine(target, drafter, method.gamma(profile), sampling)
    if method.draft_length(profile) == "auto":   # γ per round, up to method.gamma
        auto = AutoGamma(method.gamma(profile), feed_size=drafter.feed_size)
        reason = None if engine.runs_target else cannot_pay(target, drafter.draft)
        if reason:   # e.g. the target drafting for itself on a CPU: the target alone from the start
            auto.rule_out(reason)
        engine.use_policy(AutoLength(auto))
    if profile.acceptance == "relaxed":
        engine.relax = relaxation(target, profile.relaxed.neighbours, profile.relaxed.delta)
    captioner = drafter.captioner.lm if drafter.captioner is not None else None
    # (the captioner decodes with transformers' generate(), not the engine)
    for role, lm in (("target", target), ("draft", drafter.draft)):
        if lm is not None:
            _fast_path(profile, method, lm, role)
    engine.threads = thread_plan(profile)
    return Session(profile, target, drafter.draft, captioner, engine, sampling,
                   threads=engine.threads, method=method)


def thread_plan(profile) -> ThreadPlan:
    """``runtime.threads`` and ``runtime.prefill_threads`` resolved (with
    ``runtime.long_context``, from which prompt length the rounds take the prefill's count):
    a count stands as set; auto is the count ``vlmspec profile`` measured (the hardware
    section), else the process's own count (torch's default or OMP_NUM_THREADS), and
    that only as a ceiling: before each phase it is lowered to the cores other processes
    leave free (runtime/threads.py ``FreeCores``)."""
    def count(wanted, measured):
        return measured if wanted == "auto" else int(wanted)
    r, h = profile.runtime, profile.hardware
    auto = frozenset(phase for phase, wanted in (("prefill", r.prefill_threads), ("decode", r.threads))
                     if wanted == "auto")
    return ThreadPlan(prefill=count(r.prefill_threads, h.prefill_threads),
                      decode=count(r.threads, h.threads),
                      long_context=r.long_context, auto=auto).with_defaults()


def _fast_path(profile, method: type[DraftingMethod], lm: LoadedModel, role: str) -> None:
    """``runtime.fast_path`` for one model, its caches sized for the profile's requests
    (max_new_tokens plus the widest round the method feeds, and one spare) so none
    reallocates."""
    use_fast_path(lm, profile.runtime.fast_path, role)
    if lm.fast is not None:
        lm.fast.headroom = profile.generation.max_new_tokens + method.round_width(profile) + 1


def _prepare_target(profile, target: LoadedModel) -> None:
    """What the task needs of the target: videos read, or images generated (with the
    profile's guidance)."""
    if profile.task == "video" and not target.adapter.takes_videos:
        from vlmspec_cli.runtime.adapters import adapters

        video = sorted({t for a in adapters() if a.takes_videos
                        for t in a.model_types})   # the families whose adapter reads videos
        raise ValueError(f"target '{target.name}' does not take videos (describe-video needs a "
                         f"model of a family that reads videos: model_type {', '.join(video)}; "
                         "e.g. zoo:tinyworld/qwen-video-target)")
    if profile.task == "image":
        check_image_model(target, "target")
        target.adapter = target.adapter.with_guidance(profile.image.cfg)


def relaxation(target: LoadedModel, k: int, delta: float) -> Relaxation:
    """LANTERN's latent proximity sets: each code's k nearest codes by cosine similarity
    of the target's VQ codebook (the decoder's normalised vectors)."""
    codes = target.adapter.codebook(target)
    sim = codes @ codes.T
    sim.fill_diagonal_(-float("inf"))
    k = min(k, codes.shape[0] - 1)
    return Relaxation(sim.topk(k, dim=-1).indices.cpu(), float(delta))


__all__ = ["Session", "SessionError", "ModelLoadError", "build_session", "tree_methods",
           "validate_method"]
