"""How many positions a model attends over, and whether a request fits in them.

A prompt longer than a model's context does not fail in a forward pass: rotary positions
past the trained range just give garbage, silently. So each request is checked when the
tasks layer builds it, before any decoding: the prompt's tokens (its image and video
tokens included, as the target sees them) + the tokens to generate, against the positions
of the target and of every model that reads the same positions (a draft fed the
multimodal prompt or an image grid, a twig on the target's layers). A hidden-state head
reads text positions only and a text / caption / pooled draft reads a different sequence,
so their limits are not the target's to check.

Two checks come before any tokenizing: a prompt holding the model's image or video
placeholder (``<image>``) is refused (the processor would take it for an image), and a
prompt's characters are checked against the positions first: a token covers at most the
longest token's characters, so a prompt that needs far more tokens than there are
positions (a 50 MB one: tokenizing it took 7.6 GB and 48 s) is refused untokenized.
"""

from __future__ import annotations

from vlmspec_cli.runtime.request import Message, Request

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")


class PromptError(ValueError):
    """A prompt the model cannot take as it is; the message says why."""


class ContextLimitError(PromptError):
    """A request does not fit in a model's positions; the message names both numbers."""


class PlaceholderError(PromptError):
    """A prompt's text holds the model's image or video placeholder."""


def position_limit(model) -> int | None:
    """The positions ``model`` (a LoadedModel, a module with ``.config``, or a config) can
    attend over: its text config's max_position_embeddings (or the family's equivalent);
    None when the config does not say."""
    inner = getattr(model, "model", None)  # a LoadedModel's HF model, a ForCausalLM's body
    config = getattr(inner, "config", None) or getattr(model, "config", model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for cfg in (text, config):
        for key in _POSITION_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def position_limits(readers) -> list[tuple[str, int]]:
    """(role, positions) of ``readers`` ((role, model) pairs: the target and the models
    that read its positions), the smallest first; models whose config names none are left
    out."""
    limits = [(role, position_limit(m)) for role, m in readers]
    return sorted(((role, n) for role, n in limits if n), key=lambda rn: rn[1])


def prompt_tokens(lm, messages: list[Message]) -> int:
    """The positions the conversation takes in ``lm`` (chat template applied, visual
    inputs expanded)."""
    images = [im for m in messages for im in m.images]
    videos = [v for m in messages for v in m.videos]
    return lm.adapter.prompt_length(lm, lm.adapter.prompt_text(lm, messages), images, videos)


def placeholders(lm) -> tuple[str, ...]:
    """The strings the model's processor expands into image or video tokens."""
    token = lm.adapter.image_token(lm)
    tokens = (*(token if isinstance(token, tuple) else (token,)),
              getattr(lm.processor, "video_token", None))
    return tuple(sorted({t for t in tokens if isinstance(t, str) and t}))


def check_text(lm, messages: list[Message]) -> None:
    """Raise PlaceholderError when a message's text holds an image or video placeholder:
    the processor would expand it as one, and every input would fail on the count."""
    for m in messages:
        for token in placeholders(lm):
            if token in m.text:
                raise PlaceholderError(f"prompt holds {token!r}, this model's image or video "
                                       "placeholder, which the processor would take for an "
                                       "image; rephrase it without that text")


def max_token_chars(lm) -> int:
    """The characters of the longest token of ``lm``'s tokenizer (added tokens included),
    kept in ``lm.memo``: no token covers more of a text, so a text of C characters is
    >= C / this many tokens."""
    cached = lm.memo.get("max_token_chars")
    if cached is None:
        cached = max((len(t) for t in lm.tokenizer.get_vocab()), default=1) or 1
        lm.memo["max_token_chars"] = cached
    return cached


def _check_chars(lm, messages: list[Message], new: int, limit: tuple[str, int],
                 generated: str, note: str = "") -> None:
    """Refuse, without tokenizing, a text whose characters alone need more than twice the
    tokens the positions hold (one that is nearer is tokenized, for the exact count)."""
    chars = sum(len(m.text) for m in messages)
    least = -(-chars // max_token_chars(lm))
    role, positions = limit
    if least + new > 2 * positions:
        added = (f"max_new_tokens {new:,}" if generated == "max_new_tokens"
                 else f"{new:,} {generated}")
        raise ContextLimitError(f"prompt is {chars:,} characters{note}: at least {least:,} "
                                f"tokens + {added} > {positions:,} positions of the {role} "
                                "(not tokenized)")


def check_fits(target, readers, request: Request, generated: str = "max_new_tokens") -> None:
    """Raise ContextLimitError when the request's prompt + max_new_tokens exceed the
    positions of ``target`` or of one of ``readers`` ((role, model) pairs, the target's
    included), PlaceholderError when its text holds an image placeholder. ``generated``
    names what max_new_tokens is in the message ("image tokens" for an image grid)."""
    check_text(target, request.messages)
    limits = position_limits(readers)
    if not limits:
        return
    _check_chars(target, request.messages, request.max_new_tokens, limits[0], generated)
    tokens = prompt_tokens(target, request.messages)
    _raise_past(tokens, request.max_new_tokens, limits[0], generated)


def check_prompt_fits(target, readers, prompt: str, max_new_tokens: int,
                      generated: str = "max_new_tokens") -> None:
    """For a prompt shared by every input: raise ContextLimitError when it cannot fit
    even without images (inputs add their image / video tokens to this), PlaceholderError
    when it holds an image placeholder."""
    messages = [Message("user", prompt)]
    check_text(target, messages)
    limits = position_limits(readers)
    if not limits:
        return
    _check_chars(target, messages, max_new_tokens, limits[0], generated, " without images")
    tokens = prompt_tokens(target, messages)
    _raise_past(tokens, max_new_tokens, limits[0], generated, " without images")


def _raise_past(tokens: int, new: int, limit: tuple[str, int], generated: str,
                note: str = "") -> None:
    role, positions = limit
    total = tokens + new
    if total > positions:
        added = (f"max_new_tokens {new:,}" if generated == "max_new_tokens"
                 else f"{new:,} {generated}")
        raise ContextLimitError(f"prompt is {tokens:,} tokens{note} + {added} = {total:,} > "
                                f"{positions:,} positions of the {role}")


__all__ = ["ContextLimitError", "PlaceholderError", "PromptError", "check_fits",
           "check_prompt_fits", "check_text", "max_token_chars", "placeholders",
           "position_limit", "position_limits", "prompt_tokens"]
