"""Build the runtime a profile describes: target, drafter and engine, shared by every
subcommand. Knows nothing of click or rich."""

from __future__ import annotations

from dataclasses import dataclass

from vlmspec_cli.drafters import create_drafter, drafter_names
from vlmspec_cli.runtime.engine import SpeculativeEngine
from vlmspec_cli.runtime.models import LoadedModel, ModelLoadError, check_compatible, load_model
from vlmspec_cli.runtime.verify import SamplingParams

# drafting inputs that later issues add (TABED caption / pooled drafting)
NOT_BUILT_INPUTS = {"caption": "caption drafting (C)", "pooled": "pooled-image drafting (P)"}


class SessionError(Exception):
    """The profile asks for something this runtime cannot do; the message says what."""


@dataclass
class Session:
    profile: object
    target: LoadedModel
    draft: LoadedModel | None
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


def chain_variant(profile) -> str:
    inputs = list(profile.drafting.inputs)
    if len(inputs) != 1:
        raise SessionError(
            f"method 'chain' drafts from one input, but drafting.inputs is {inputs}; "
            "ensembles of several inputs are method 'tabed' (not built yet)"
        )
    if inputs[0] in NOT_BUILT_INPUTS:
        raise SessionError(f"drafting.inputs: {inputs[0]} — {NOT_BUILT_INPUTS[inputs[0]]} is not built yet")
    return inputs[0]


def validate_method(profile) -> None:
    """Checks that need no model: run them before loading anything (and for --dry-run)."""
    if profile.method not in drafter_names():
        import difflib

        near = difflib.get_close_matches(profile.method, drafter_names(), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise SessionError(
            f"unknown method '{profile.method}'{hint}; available: {', '.join(drafter_names())}"
        )
    if profile.method == "chain":
        chain_variant(profile)


def build_session(profile) -> Session:
    validate_method(profile)
    sampling = SamplingParams(profile.sampling.temperature, profile.sampling.top_p)
    target = load_model(profile.target, "target")
    draft = None
    if profile.method == "none":
        drafter = create_drafter("none")
    else:
        variant = chain_variant(profile)
        draft = load_model(profile.draft, "draft")
        check_compatible(target, draft, needs_images=(variant == "multimodal"))
        drafter = create_drafter("chain", draft=draft, sampling=sampling, variant=variant,
                                 image_token=target.adapter.image_token(target))
    engine = SpeculativeEngine(target, drafter, profile.drafting.gamma, sampling)
    return Session(profile, target, draft, engine, sampling)


__all__ = ["Session", "SessionError", "ModelLoadError", "build_session", "validate_method"]
