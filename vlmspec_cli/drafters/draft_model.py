"""Loading the separate draft model (profile section ``draft:``) and, for drafting input C,
the captioner, for the methods that draft with them (chain, tabed, tree, adt)."""

from __future__ import annotations

from dataclasses import dataclass

from vlmspec_cli.drafters.inputs import check_family
from vlmspec_cli.runtime.models.captioner import Captioner
from vlmspec_cli.runtime.models.loading import (LoadedModel, ModelLoadError, check_compatible, load_model,
                                        load_tokenizer, tokenizer_mismatch)


@dataclass
class DraftModels:
    draft: LoadedModel
    captioner: Captioner | None
    inputs: list[str]          # the drafting inputs it reads requests through
    image_token: str | tuple[str, ...] | None   # the target's placeholder(s) in the prompt
    retokenized: bool = False  # another tokenizer: proposals go through text (retokenized.py)


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
    # read before the draft's weights load where its tokenizer is on this machine
    tokenizer = load_tokenizer(profile.draft, "draft")
    retokenized = tokenizer is not None and _retokenized(profile, target, inputs, tokenizer)
    draft = load_model(profile.draft, "draft")
    if not image:   # checked from its config before loading where it was on this machine
        check_family(inputs, draft.adapter, profile.draft.model)
    if tokenizer is None:
        retokenized = _retokenized(profile, target, inputs, draft.tokenizer)
    if image:
        check_image_model(draft, "draft")
        draft.adapter = draft.adapter.with_guidance(profile.image.cfg)
    check_compatible(target, draft, retokenized=retokenized,
                     needs_images=not video and bool({"multimodal", "pooled"} & set(inputs)))
    if not retokenized:
        fit_vocab(draft, target.vocab_size)
    if video and "multimodal" in inputs:
        _check_video_draft(target, draft)
    captioner = None
    if "caption" in inputs:
        captioner = Captioner(load_model(profile.captioner, "captioner"), profile.captioner.prompt,
                              profile.captioner.max_new_tokens)
    return DraftModels(draft, captioner, inputs, target.adapter.image_token(target), retokenized)


def _retokenized(profile, target: LoadedModel, inputs: list[str], tokenizer) -> bool:
    """Whether the draft's ``tokenizer`` differs from the target's: then only a chain
    reading text can draft (through text, exactly); any other method or input is refused."""
    reason = tokenizer_mismatch(target.tokenizer, tokenizer)
    if reason is None:
        return False
    if profile.method == "chain" and profile.task != "image" and set(inputs) <= {"text", "caption"}:
        return True
    raise ModelLoadError(
        f"draft '{profile.draft.model}' has another tokenizer than target '{target.name}' "
        f"({reason}): its proposals can reach the target only as text, one chain at a time "
        f"(method chain, drafting.inputs [text] or [caption]), not method '{profile.method}' "
        f"with inputs {inputs}. Pick a draft with the target's tokenizer for that.")


def fit_vocab(draft: LoadedModel, vocab_size: int) -> None:
    """Give a draft of the target's tokenizer the target's vocabulary size. A larger head
    (padding rows, extra tokens) is cut to the target's ids: q is then renormalised over
    them, and that q is what the draft samples from and verification reads. A smaller
    embedding table gains rows (the mean embedding) for the target's ids it lacks, so the
    draft can read every committed token; its head still gives those ids q = 0
    (verify.align_vocab)."""
    import torch

    head = draft.model.get_output_embeddings()
    embed = draft.model.get_input_embeddings()
    if head is not None and head.weight.shape[0] > vocab_size:
        head.weight = torch.nn.Parameter(head.weight.detach()[:vocab_size].clone(),
                                         requires_grad=False)
        head.out_features = vocab_size
    if embed.weight.shape[0] < vocab_size:
        old = embed.weight.detach()
        rows = old.mean(0, keepdim=True).expand(vocab_size - old.shape[0], -1)
        grown = torch.nn.Embedding(vocab_size, old.shape[1], device=old.device, dtype=old.dtype)
        grown.weight = torch.nn.Parameter(torch.cat([old, rows]), requires_grad=False)
        draft.model.set_input_embeddings(grown)


def check_image_model(lm: LoadedModel, role: str) -> None:
    if not lm.adapter.generates_images:
        raise ValueError(f"{role} model '{lm.name}' does not generate images (generate-image "
                         "needs a Janus or Emu3 model, e.g. zoo:tinyworld/janus-target)")


def _check_video_draft(target: LoadedModel, draft: LoadedModel) -> None:
    if not draft.adapter.takes_videos:
        raise ValueError(f"drafting input 'multimodal' on a video needs a draft that reads "
                         f"videos; '{draft.name}' does not (use drafting.inputs: [text] or "
                         "method hidden)")
    if draft.adapter.video_token_id(draft) != target.adapter.video_token_id(target):
        raise ValueError("draft and target use different video token ids; the draft must "
                         "come from the target's family and tokenizer")
