"""How a draft model reads a request through each drafting input (TABED §4, §6, App. I.2;
the names and letters are in vlmspec_cli/drafting_inputs.py).

- ``multimodal`` (M): the prompt and the images, as the target reads them.
- ``text`` (T):       each image placeholder replaced by "\\n", no images.
- ``caption`` (C):    each image placeholder replaced by "image: <its caption>\\n", the
                      caption written once per request by the captioner.
- ``pooled`` (P):     the images with the vision tower's patch grid 2×2 average-pooled
                      before the projector (576 → 144 image tokens for LLaVA-1.5).

Every input becomes input embeddings, so an ensemble's rows of different inputs share one
batch.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS

CAPTION_PREFIX = "image: "
POOL = 2


def check_inputs(inputs: list[str], draft, captioner) -> None:
    """Fail before any request if a drafting input cannot be built with these models."""
    for name in inputs:
        if name not in DRAFTING_INPUTS:
            raise ValueError(f"unknown drafting input '{name}' (choose from {DRAFTING_INPUTS})")
        if name == "pooled" and not draft.adapter.takes_images or (
                name == "multimodal" and not (draft.adapter.takes_images
                                              or draft.adapter.takes_videos)):
            raise ValueError(f"drafting input '{name}' needs a draft that reads images; "
                             f"'{draft.name}' is text-only (use 'text' or 'caption')")
        if name == "caption" and captioner is None:
            raise ValueError("drafting input 'caption' needs a captioner (profile key 'captioner.model')")
    if len(set(inputs)) != len(inputs):
        raise ValueError(f"drafting.inputs lists an input twice: {inputs}")


def check_family(inputs: list[str], adapter, name: str) -> None:
    """Refuse the drafting inputs a draft's family cannot build, before it loads.
    ``adapter``: the draft's family adapter (None: not known yet, nothing refused). A family
    whose images take 3-D positions (``embeds_images`` False, the Qwen2-VL family) reads
    them through its own inputs, one drafting input at a time: never pooled, nor
    multimodal beside other rows of an ensemble; a family with a ``pool_refusal`` never
    pools."""
    if adapter is None:
        return
    family = adapter.family or "its family"
    if "pooled" in inputs and adapter.pool_refusal:
        raise ValueError(f"draft '{name}' cannot be drafted through input pooled, which averages "
                         f"a square patch grid: it is {adapter.pool_refusal} (use inputs "
                         "multimodal, text or caption)")
    if adapter.embeds_images:
        return
    if "pooled" in inputs:
        raise ValueError(f"draft '{name}' reads images with 3-D positions, not as embeddings: "
                         f"input pooled cannot average them ({family}; use drafting.inputs "
                         "[multimodal], [text] or [caption])")
    if "multimodal" in inputs and len(inputs) > 1:
        raise ValueError(f"draft '{name}' reads images with 3-D positions, one drafting input "
                         f"at a time: an ensemble of multimodal with {len(inputs) - 1} other "
                         f"input(s) cannot share its rows ({family}; use drafting.inputs "
                         "[multimodal] or [text])")


def replace_images(prompt: str, image_token: str | tuple[str, ...] | None,
                   replacements: list[str]) -> str:
    """Replace the i-th image placeholder by ``replacements[i]``. ``image_token``: the
    target's placeholder, or its placeholders (a family with image and video ones, one kind
    per request): the first the prompt holds is replaced."""
    tokens = (image_token,) if image_token is None or isinstance(image_token, str) else image_token
    image_token = next((t for t in tokens if t and t in prompt), None)
    if image_token is None:
        return prompt
    parts = prompt.split(image_token)
    if len(parts) - 1 != len(replacements):
        raise ValueError(f"prompt has {len(parts) - 1} image placeholders for {len(replacements)} images")
    return parts[0] + "".join(r + rest for r, rest in zip(replacements, parts[1:]))


def image_replacements(drafting_input: str, n_images: int, captions: list[str]) -> list[str]:
    """What each image placeholder becomes for the text-reading inputs (T and C). The zoo
    build trains the draft on exactly these strings."""
    if drafting_input == "text":
        return ["\n"] * n_images
    if drafting_input == "caption":
        return [f"{CAPTION_PREFIX}{c}\n" for c in captions]
    raise ValueError(f"drafting input '{drafting_input}' keeps its images")


def input_prompt(prompt: str, images: list, drafting_input: str, image_token: str | None,
                 captions: list[str]) -> str:
    """The draft's prompt text through ``drafting_input`` (images stay placeholders for M
    and P)."""
    if drafting_input in ("multimodal", "pooled"):
        return prompt
    if drafting_input in ("text", "caption"):
        return replace_images(prompt, image_token,
                              image_replacements(drafting_input, len(images), captions))
    raise ValueError(f"unknown drafting input '{drafting_input}'")


def input_embeds(draft, prompt: str, images: list, drafting_input: str,
                 image_token: str | None, captions: list[str]) -> torch.Tensor:
    """Input embeddings (1, L, H) of one request read through one drafting input."""
    text = input_prompt(prompt, images, drafting_input, image_token, captions)
    with_images = drafting_input in ("multimodal", "pooled") and bool(images)
    return draft.adapter.embed(draft, text, list(images) if with_images else None,
                               pool=POOL if drafting_input == "pooled" else 1)


def visuals(request) -> list:
    """What a request's visual placeholders stand for: its images, or else its videos (the
    text inputs replace either kind by "\n")."""
    return request.images or request.videos


def reads_by_encode(draft, request, drafting_input: str) -> bool:
    """Whether the draft reads the request's visuals through its own inputs (``encode``)
    rather than as embeddings: a video, or an image for a family whose positions are 3-D
    (``embeds_images`` False, the Qwen2-VL family)."""
    return drafting_input == "multimodal" and bool(
        request.videos or (request.images and not draft.adapter.embeds_images))


def prefill_encoded(draft, state, static: bool = True):
    """The draft reads the request's images or videos as the target does (its own adapter
    builds the visual tokens and 3-D positions). Returns (cache, logits (1, V), the
    prompt's attention mask (1, L))."""
    inputs = draft.adapter.encode(draft, state.prompt, state.request.images or None,
                                  videos=state.request.videos)
    cache = draft.adapter.new_cache(draft, static)
    return cache, draft.adapter.prefill(draft, inputs, cache), inputs["attention_mask"]


def prefill_input(draft, state, drafting_input: str, image_token: str | None, captioner=None,
                  static: bool = True, pending=None):
    """Prefill a fresh draft cache with one request read through ``drafting_input``
    (captioning the images first for C, or waiting for ``pending``: the captioning Future
    a ``prepare`` started). Returns (cache, logits of the last position (V,))."""
    if reads_by_encode(draft, state.request, drafting_input):
        cache, logits, _ = prefill_encoded(draft, state, static)
        return cache, logits[0]
    captions: list[str] = []
    if drafting_input == "caption" and state.request.images:
        future = pending if isinstance(pending, Future) else captioner.submit(state.request.images)
        captions, seconds = future.result()
        state.stats.caption_s += seconds
    embeds = input_embeds(draft, state.prompt, visuals(state.request), drafting_input,
                          image_token, captions)
    cache = draft.adapter.new_cache(draft, static)
    return cache, draft.adapter.prefill(draft, {"inputs_embeds": embeds}, cache)[0]
