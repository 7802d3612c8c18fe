"""Build the runtime a profile describes: target, drafter and engine, shared by every
subcommand. Knows nothing of click or rich."""

from __future__ import annotations

from dataclasses import dataclass

from vlmspec_cli.drafters import create_drafter, drafter_names
from vlmspec_cli.runtime.batch import BatchDrafter, BatchedEngine
from vlmspec_cli.runtime.captioner import Captioner
from vlmspec_cli.runtime.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.models import (LoadedModel, ModelLoadError, check_compatible,
                                        load_hidden_head, load_model, load_twig,
                                        require_safetensors)
from vlmspec_cli.runtime.verify import Relaxation, SamplingParams

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

    @property
    def lossless(self) -> bool:
        return bool(self.profile.lossless and self.engine.drafter.lossless)

    def baseline_engine(self) -> SpeculativeEngine:
        """Target-only decoding with the same sampling settings (for --compare); built once
        per session, since engines keep no per-request state."""
        if getattr(self, "_baseline", None) is None:
            self._baseline = SpeculativeEngine(self.target, create_drafter("none"), 1, self.sampling)
        return self._baseline

    def batched_engine(self) -> BatchedEngine:
        """generation.batch_size requests decoded together (methods none and chain)."""
        p = self.profile
        drafter = None
        if p.method == "chain":
            d = self.engine.drafter
            drafter = BatchDrafter(self.draft, d.inputs[0], d.image_token, d.captioner)
        return BatchedEngine(self.target, drafter, p.drafting.gamma, self.sampling,
                             p.generation.batch_size)


BATCHED_METHODS = ("none", "chain")
IMAGE_METHODS = ("none", "tree", "adt")       # generate-image: tree-shaped drafts only
TREE_METHODS = ("tree", "adt")
VIDEO_METHODS = ("none", "chain", "hidden")   # describe-video
VIDEO_INPUTS = ("multimodal", "text")         # what a chain draft reads a video through


def chain_variant(profile) -> str:
    inputs = list(profile.drafting.inputs)
    if len(inputs) != 1:
        raise SessionError(
            f"method '{profile.method}' drafts from one input, but drafting.inputs is {inputs}; "
            "to ensemble several inputs use method 'tabed'"
        )
    return inputs[0]


def validate_method(profile) -> None:
    """Checks that need no model: run them before loading anything (and for --dry-run)."""
    if profile.method not in drafter_names():
        from vlmspec_cli.suggest import did_you_mean

        hint = did_you_mean(profile.method, drafter_names())
        raise SessionError(
            f"unknown method '{profile.method}'{hint}; available: {', '.join(drafter_names())}"
        )
    inputs = list(profile.drafting.inputs)
    image = profile.task == "image"
    if image and profile.method not in IMAGE_METHODS:
        raise SessionError(f"generate-image supports methods {', '.join(IMAGE_METHODS)}, not "
                           f"'{profile.method}' (a chain is tree.top_k: 1)")
    video = profile.task == "video"
    if video and profile.method not in VIDEO_METHODS:
        raise SessionError(f"describe-video supports methods {', '.join(VIDEO_METHODS)}, not "
                           f"'{profile.method}'")
    if image and profile.method == "hidden":
        raise SessionError("method 'hidden' drafts text from a target's hidden states; "
                           "generate-image supports none, tree and adt")
    if video and profile.generation.batch_size > 1:
        raise SessionError("describe-video decodes one video at a time (3-D positions differ "
                           "per video); use --batch-size 1")
    if profile.method == "hidden" and not profile.hidden.model:
        raise SessionError("method 'hidden' needs a trained head: set hidden.model")
    if not image and profile.method == "adt":
        raise SessionError("method 'adt' adapts trees to an image-token grid: it is for "
                           "generate-image; use method 'tree' here")
    if profile.acceptance == "relaxed" and not (image and profile.method in TREE_METHODS):
        raise SessionError("acceptance: relaxed (LANTERN) compares VQ image codes: it needs "
                           "generate-image with method tree or adt")
    a = profile.adaptive_tree
    if a.min_depth > a.max_depth or a.min_top_k > a.max_top_k:
        raise SessionError("adaptive_tree: min_depth must be <= max_depth and min_top_k <= max_top_k")
    if profile.method in ("chain", "tree") and not image:
        chain_variant(profile)
    if video and profile.method == "chain" and inputs[0] not in VIDEO_INPUTS:
        raise SessionError(f"describe-video drafts with --inputs {' or '.join(VIDEO_INPUTS)} "
                           f"(the draft reads the video, or the prompt without it), not "
                           f"'{inputs[0]}'")
    if len(set(inputs)) != len(inputs):
        raise SessionError(f"drafting.inputs lists an input twice: {inputs}")
    if profile.method in ("chain", "tabed") and "caption" in inputs and not profile.captioner.model:
        raise SessionError("drafting input 'caption' needs a captioner: set captioner.model")
    if profile.prune.active and profile.method != "twig":
        raise SessionError(f"prune (visual-token pruning) works with method 'twig' only, not "
                           f"'{profile.method}'; remove prune.keep / prune.final_wipe")
    if profile.generation.batch_size > 1 and profile.method not in BATCHED_METHODS:
        raise SessionError(f"generation.batch_size > 1 (--batch-size) works with methods "
                           f"{' and '.join(BATCHED_METHODS)}; '{profile.method}' decodes one "
                           "request at a time (use --batch-size 1)")
    if profile.method == "twig":
        if _no_twig(profile.twig.model) and profile.twig.layers is None:
            raise SessionError("twig.model: none (layer-skip) needs twig.layers: K, the number "
                               "of target layers the draft runs")
        if _no_twig(profile.twig.model) and profile.prune.active:
            raise SessionError("prune needs a twig (its attention ranks the visual tokens); "
                               "set twig.model")


def _no_twig(model: str | None) -> bool:
    return model is None or str(model).lower() == "none"


def _twig_drafter(profile, target, sampling):
    """Self-speculation: the twig (if any) loads next to the target, on its device/dtype."""
    from vlmspec_cli.drafters.twig import PrunePlan

    twig = None if _no_twig(profile.twig.model) else load_twig(profile.twig.model, target)
    layers = profile.twig.layers
    if layers is None:
        layers = getattr(twig.config, "twig_from_layer", None)
        if layers is None:
            raise SessionError(f"twig '{profile.twig.model}' does not say which target layer it "
                               "grows from (config twig_from_layer); set twig.layers: K")
    p = profile.prune
    plan = PrunePlan(keep=p.keep, layer=p.layer, final_wipe=p.final_wipe)
    return create_drafter("twig", target=target, sampling=sampling, layers=int(layers), twig=twig,
                          threshold=profile.twig.threshold, prune=plan)


def build_session(profile, trace=None) -> Session:
    """Load the models the profile names and build its engine. ``trace``: a callable that
    receives one dict per drafting block of an ensemble (for ``--trace``)."""
    validate_method(profile)
    for role, name in _model_names(profile):  # pickle-only weights: refused before any load
        require_safetensors(name, role)
    sampling = SamplingParams(profile.sampling.temperature, profile.sampling.top_p)
    target = load_model(profile.target, "target")
    image = profile.task == "image"
    if profile.task == "video" and not getattr(target.adapter, "takes_videos", False):
        raise SessionError(f"target '{target.name}' does not take videos (describe-video needs a "
                           "Qwen2.5-VL-family model, e.g. zoo:tinyworld/qwen-video-target)")
    if image:
        _check_image_model(target, "target")
        target.adapter = target.adapter.with_guidance(profile.image.cfg)
    draft = captioner_lm = None
    if profile.method == "none":
        drafter = create_drafter("none")
    elif profile.method == "twig":
        try:
            drafter = _twig_drafter(profile, target, sampling)
        except ValueError as exc:
            raise SessionError(str(exc)) from None
    elif profile.method == "hidden":
        drafter = _hidden_drafter(profile, target, sampling)
    else:
        # an image prompt is text: the draft reads it as the target does
        inputs = ["text"] if image else list(profile.drafting.inputs)
        draft = load_model(profile.draft, "draft")
        if image:
            _check_image_model(draft, "draft")
            draft.adapter = draft.adapter.with_guidance(profile.image.cfg)
        video = profile.task == "video"
        check_compatible(target, draft, needs_images=not video and bool({"multimodal", "pooled"} & set(inputs)))
        if video and "multimodal" in inputs:
            _check_video_draft(target, draft)
        captioner = None
        if "caption" in inputs:
            captioner_lm = load_model(profile.captioner, "captioner")
            captioner = Captioner(captioner_lm, profile.captioner.prompt,
                                  profile.captioner.max_new_tokens)
        common = dict(draft=draft, sampling=sampling, captioner=captioner, trace=trace,
                      image_token=target.adapter.image_token(target))
        try:
            if profile.method == "chain":
                drafter = create_drafter("chain", variant=chain_variant(profile), **common)
            elif profile.method in TREE_METHODS:
                t = profile.tree
                variant = "text" if image else chain_variant(profile)
                extra = {}
                if profile.method == "adt":
                    from dataclasses import asdict

                    from vlmspec_cli.runtime.tree_shape import AdtBounds

                    a = asdict(profile.adaptive_tree)
                    bounds = AdtBounds(*(a.pop(k) for k in ("min_depth", "max_depth",
                                                            "min_top_k", "max_top_k")))
                    extra = dict(cols=target.adapter.image_grid(target)[1],
                                 adaptive=dict(a, bounds=bounds))
                drafter = create_drafter(profile.method, variant=variant, depth=t.depth,
                                         top_k=t.top_k, total_tokens=t.total_tokens,
                                         policy=t.policy, per_token=image,
                                         eos_ids=eos_token_ids(target), **extra, **common)
            else:
                e = profile.ensemble
                drafter = create_drafter(profile.method, inputs=inputs, policy=e.policy,
                                         distance=e.distance, window=e.window, grid=e.grid,
                                         temperature=e.temperature, **common)
        except ValueError as exc:
            raise SessionError(str(exc)) from None
    # a tree's depth bounds the tokens a round can accept, as γ bounds a chain's
    gamma = {"tree": profile.tree.depth,
             "hidden": profile.tree.depth if profile.hidden.tree else profile.drafting.gamma,
             "adt": profile.adaptive_tree.max_depth}.get(profile.method, profile.drafting.gamma)
    engine = SpeculativeEngine(target, drafter, gamma, sampling)
    if profile.acceptance == "relaxed":
        engine.relax = relaxation(target, profile.relaxed.neighbours, profile.relaxed.delta)
    return Session(profile, target, draft, captioner_lm, engine, sampling)


def _model_names(profile) -> list[tuple[str, str | None]]:
    """(role, model name) of every model build_session loads for this profile."""
    m, inputs = profile.method, profile.drafting.inputs
    names = [("target", profile.target.model)]
    if m not in ("none", "twig", "hidden"):
        names.append(("draft", profile.draft.model))
    if m in ("chain", "tabed") and "caption" in inputs and profile.task == "caption":
        names.append(("captioner", profile.captioner.model))
    if m == "twig" and not _no_twig(profile.twig.model):
        names.append(("twig", profile.twig.model))
    if m == "hidden":
        names.append(("hidden", profile.hidden.model))
    return names


def _hidden_drafter(profile, target, sampling):
    """HiViS / Sparrow: the head loads next to the target, on its device and dtype."""
    from vlmspec_cli.drafters.hidden import TreeSettings

    head = load_hidden_head(profile.hidden.model, target)
    trained = int(head.config.target_layer)
    layer = profile.hidden.layer
    if layer is not None and int(layer) != trained:
        raise SessionError(f"hidden head '{profile.hidden.model}' was trained on target layer "
                           f"{trained} (hidden_states[{trained}]), but hidden.layer is {layer}; "
                           f"set hidden.layer: {trained} or train a head for layer {layer}")
    t = profile.tree
    tree = (TreeSettings(t.depth, t.top_k, t.total_tokens, static=t.policy == "static")
            if profile.hidden.tree else None)
    try:
        return create_drafter("hidden", target=target, head=head, sampling=sampling,
                              eos_ids=eos_token_ids(target), tree=tree)
    except ValueError as exc:
        raise SessionError(str(exc)) from None


def _check_video_draft(target: LoadedModel, draft: LoadedModel) -> None:
    if not getattr(draft.adapter, "takes_videos", False):
        raise SessionError(f"drafting input 'multimodal' on a video needs a draft that reads "
                           f"videos; '{draft.name}' does not (use drafting.inputs: [text] or "
                           "method hidden)")
    if draft.adapter.video_token_id(draft) != target.adapter.video_token_id(target):
        raise SessionError("draft and target use different video token ids; the draft must "
                           "come from the target's family and tokenizer")


def _check_image_model(lm: LoadedModel, role: str) -> None:
    if not getattr(lm.adapter, "generates_images", False):
        raise SessionError(f"{role} model '{lm.name}' does not generate images (generate-image "
                           "needs a Janus-family model, e.g. zoo:tinyworld/janus-target)")


def relaxation(target: LoadedModel, k: int, delta: float) -> Relaxation:
    """LANTERN's latent proximity sets: each code's k nearest codes by cosine similarity
    of the target's VQ codebook (the decoder's normalised vectors)."""
    codes = target.adapter.codebook(target)
    sim = codes @ codes.T
    sim.fill_diagonal_(-float("inf"))
    k = min(k, codes.shape[0] - 1)
    return Relaxation(sim.topk(k, dim=-1).indices.cpu(), float(delta))


__all__ = ["Session", "SessionError", "ModelLoadError", "build_session", "validate_method"]
