"""Loading the separate draft model (profile section ``draft:``) and, for drafting input C,
the captioner, for the methods that draft with them (chain, tabed, tree, adt)."""

from __future__ import annotations

from dataclasses import dataclass

from vlmspec_cli.runtime.captioner import Captioner
from vlmspec_cli.runtime.models import LoadedModel, check_compatible, load_model


@dataclass
class DraftModels:
    draft: LoadedModel
    captioner: Captioner | None
    inputs: list[str]          # the drafting inputs it reads requests through
    image_token: str | tuple[str, ...] | None   # the target's placeholder(s) in the prompt


def draft_model_names(profile) -> list[tuple[str, str | None]]:
    """(role, name) of the models :func:`load_draft` loads for this profile."""
    names = [("draft", profile.draft.model)]
    if profile.task != "image" and "caption" in profile.drafting.inputs:
        names.append(("captioner", profile.captioner.model))
    return names


def load_draft(profile, target: LoadedModel) -> DraftModels:
    """The draft (checked against the target for the task) and the captioner if an input
    is C. An image prompt is text: the draft reads it as the target does."""
    image = profile.task == "image"
    video = profile.task == "video"
    inputs = ["text"] if image else list(profile.drafting.inputs)
    draft = load_model(profile.draft, "draft")
    if image:
        check_image_model(draft, "draft")
        draft.adapter = draft.adapter.with_guidance(profile.image.cfg)
    check_compatible(target, draft,
                     needs_images=not video and bool({"multimodal", "pooled"} & set(inputs)))
    if video and "multimodal" in inputs:
        _check_video_draft(target, draft)
    captioner = None
    if "caption" in inputs:
        captioner = Captioner(load_model(profile.captioner, "captioner"), profile.captioner.prompt,
                              profile.captioner.max_new_tokens)
    return DraftModels(draft, captioner, inputs, target.adapter.image_token(target))


def check_image_model(lm: LoadedModel, role: str) -> None:
    if not getattr(lm.adapter, "generates_images", False):
        raise ValueError(f"{role} model '{lm.name}' does not generate images (generate-image "
                         "needs a Janus-family model, e.g. zoo:tinyworld/janus-target)")


def _check_video_draft(target: LoadedModel, draft: LoadedModel) -> None:
    if not getattr(draft.adapter, "takes_videos", False):
        raise ValueError(f"drafting input 'multimodal' on a video needs a draft that reads "
                         f"videos; '{draft.name}' does not (use drafting.inputs: [text] or "
                         "method hidden)")
    if draft.adapter.video_token_id(draft) != target.adapter.video_token_id(target):
        raise ValueError("draft and target use different video token ids; the draft must "
                         "come from the target's family and tokenizer")
