"""What the engine needs from a model family: inputs, image tokens, cached forwards."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from vlmspec_cli.runtime.static_cache import StaticKVCache


@dataclass
class TextStack:
    """The decoder under a model's LM head, as parts that can be run layer by layer
    (self-speculation runs the first K layers and the rest separately)."""

    embed: Any          # token embedding
    layers: Any         # ModuleList of decoder layers
    norm: Any           # final norm before the head
    rotary: Any         # rotary embedding: (hidden, position_ids) -> (cos, sin)
    head: Any           # lm_head
    config: Any         # the text config


class ModelAdapter:
    model_types: tuple[str, ...] = ()
    model_class: Any = None
    takes_images: bool = False
    takes_videos: bool = False   # encode reads videos (describe-video's targets, a video draft)
    generates_images: bool = False   # decodes image tokens (generate-image: guided.py)
    embeds_images: bool = True   # prompt_embeds can put image features in place (a draft's M input)
    splits_layers: bool = True   # its layers may run in parts (the twig's trunk, runtime/fast/trunk.py)
    quant_skip_modules: tuple[str, ...] = ("lm_head",)   # kept unquantized (bitsandbytes)
    decode_rows: int = 1   # rows one request decodes (the image model: cond + uncond)
    family: str | None = None          # how refusals name the family (None: "its family")
    pool_refusal: str | None = None    # why pooled drafting (input P) cannot serve it, or None

    def supports(self, config) -> bool:
        return config.model_type in self.model_types

    # -- prompts ---------------------------------------------------------------------
    def image_token(self, lm) -> str | None:
        for holder in (lm.processor, lm.tokenizer):
            token = getattr(holder, "image_token", None)
            if isinstance(token, str):
                return token
        return None

    def image_token_id(self, lm) -> int | None:
        return None

    def visual_mask(self, lm, ids: torch.Tensor) -> torch.Tensor:
        """Which of the prompt ``ids`` (L,) hold visual features (image or video tokens)."""
        image = self.image_token_id(lm)
        if image is None:
            return torch.zeros_like(ids, dtype=torch.bool)
        return ids == image

    def stop_token_ids(self, lm) -> set[int]:
        """The tokens that end a generation: the tokenizer's EOS and the generation config's."""
        gen_eos = getattr(lm.model.generation_config, "eos_token_id", None)
        ids = set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) | {lm.tokenizer.eos_token_id}
        return {int(i) for i in ids if i is not None}

    def prompt_text(self, lm, messages, add_generation_prompt: bool = True) -> str:
        """Render a conversation (objects with role, text, images) with the chat template."""
        chat = []
        for m in messages:
            content = ([{"type": "image"} for _ in m.images]
                       + [{"type": "video"} for _ in getattr(m, "videos", ())]
                       + [{"type": "text", "text": m.text}])
            chat.append({"role": m.role, "content": content})
        holder = lm.processor if getattr(lm.processor, "chat_template", None) else lm.tokenizer
        if getattr(holder, "chat_template", None):
            return holder.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        # No chat template (a plain LM): a minimal USER/ASSISTANT transcript.
        image = self.image_token(lm) or "<image>"
        parts = []
        for m in messages:
            head = "USER: " if m.role == "user" else "ASSISTANT: "
            parts.append(head + "".join(f"{image}\n" for _ in m.images) + m.text)
        return " ".join(parts) + (" ASSISTANT:" if add_generation_prompt else "")

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        """Token ids (and pixel inputs) for one request, batch dimension 1, on lm.device."""
        # special tokens (BOS) as the model's processor would add them for the target
        enc = lm.tokenizer(prompt, return_tensors="pt")
        return {"input_ids": enc["input_ids"].to(lm.device)}

    def prompt_length(self, lm, prompt: str, images: list | None, videos: list | None = None) -> int:
        """How many positions the rendered ``prompt`` takes with its images and videos
        expanded to the tokens the model sees (what ``encode`` gives; families whose
        visual inputs are costly to build count them without building them)."""
        extra = {"videos": videos} if videos else {}
        return int(self.encode(lm, prompt, images or None, **extra)["input_ids"].shape[-1])

    def embed(self, lm, prompt: str, images: list | None, pool: int = 1) -> torch.Tensor:
        """The prompt as input embeddings (1, L, H): what ``encode`` feeds the model, with
        image features already in place (so rows of different kinds can share a batch)."""
        return self.prompt_embeds(lm, prompt, images, pool)[0]

    def prompt_embeds(self, lm, prompt: str, images: list | None,
                      pool: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``embed`` and a bool mask (L,) of the positions that hold image features."""
        ids = self.encode(lm, prompt, None)["input_ids"]
        embeds = lm.model.get_input_embeddings()(ids)
        return embeds, torch.zeros(ids.shape[1], dtype=torch.bool, device=ids.device)

    def text_stack(self, lm) -> TextStack:
        """Llama-style decoders (Llama, Qwen2, Mistral …) directly under the head, or under
        a multimodal wrapper's ``language_model``. Families with other position schemes
        (Qwen2-VL's 3-D rope) override this or are not supported by layer-wise methods."""
        inner = lm.model.model
        text = getattr(inner, "language_model", inner)
        missing = [a for a in ("embed_tokens", "layers", "norm", "rotary_emb") if not hasattr(text, a)]
        if missing:
            raise ValueError(f"model '{lm.name}' has no Llama-style decoder stack (no {missing[0]}); "
                             "layer-wise methods (twig) cannot run on it")
        return TextStack(text.embed_tokens, text.layers, text.norm, text.rotary_emb,
                         lm.model.get_output_embeddings(), text.config)

    # -- forwards --------------------------------------------------------------------
    # With ``lm.fast`` (runtime/fast/fast_decoder.py) caches are ``StaticKVCache``s: the prompt
    # is prefilled by the model's own forward and copied in, every later forward runs on
    # the fast path. Without it, transformers' ``DynamicCache`` and forward throughout.
    def new_cache(self, lm, static: bool = True):
        """A cache for one request: static on the fast path; ``static=False`` where a
        transformers cache is wanted (a request prefilled alone before it joins a ragged
        batch, runtime/fast/ragged.py; the twig's split trunk)."""
        if static and lm.fast is not None:
            return lm.fast.new_cache()
        return _dynamic_cache(lm.model.config)

    def fast_prompt_embeds(self, lm, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The prompt's input embeddings (1, L, H) where a prompt of token ids can run on the
        fast path as it stands: one row, positions 0..L-1. None sends it through the model's
        own forward. Families add what their forward builds from pixels (llava.py); rows
        given as embeddings (drafting inputs) never get here (``_embedding_rows``)."""
        if set(inputs) == {"input_ids"} and inputs["input_ids"].shape[0] == 1:
            return lm.fast.embed(inputs["input_ids"])
        return None

    def row_positions(self, positions: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        """The position ids of a batch's fed tokens (runtime/fast/ragged.py), from each
        row's 1-D positions (B, t) and its prompt's rope offset (B,): the 1-D positions
        themselves (the offset is 0 but for 3-D families, qwen2_vl.py)."""
        return positions

    @torch.inference_mode()
    def _fast_prefill(self, lm, inputs: dict, cache, layer=None):
        """The prompt through the fast path straight into a static cache: (last logits
        (1, V), the chosen layer's states or None), or None where it must take the model's
        own forward. The same layers, kernels and causal mask as the decoding steps, and
        no copy of a transformers cache: the logits and cache equal the forward's
        (tests/test_fast_path.py). Left-padded rows (the ensemble's drafting inputs) run
        with their padding mask and positions. Not with compiled steps, whose buckets are
        for steps."""
        if not isinstance(cache, StaticKVCache) or lm.fast.compiled is not None:
            return None
        rows = _embedding_rows(inputs)
        embeds = rows["inputs_embeds"] if rows else self.fast_prompt_embeds(lm, inputs)
        if embeds is None or (embeds.shape[0] != cache.batch and cache.capacity):
            return None
        cache.set_batch(embeds.shape[0])
        hidden, chosen = lm.fast.run(embeds, cache, attention_mask=rows.get("attention_mask"),
                                     position_ids=rows.get("position_ids"), hidden_layer=layer)
        return lm.fast.logits(hidden[:, -1:])[:, -1], chosen

    def _model_forward(self, lm, inputs: dict, cache, **kwargs):
        """The model's own forward; a static cache gets the result copied in."""
        if not isinstance(cache, StaticKVCache):
            return lm.model(**inputs, **cache_arg(lm.model, cache), use_cache=True, **kwargs)
        eager = _dynamic_cache(lm.model.config)
        out = lm.model(**inputs, **cache_arg(lm.model, eager), use_cache=True, **kwargs)
        cache.load(eager)
        return out

    @torch.inference_mode()
    def prefill(self, lm, inputs: dict[str, torch.Tensor], cache) -> torch.Tensor:
        """Run the prompt; returns logits of the last position, shape (B, V)."""
        fast = self._fast_prefill(lm, inputs, cache)
        if fast is not None:
            return fast[0]
        return self._model_forward(lm, inputs, cache, logits_to_keep=1).logits[:, -1, :]

    @torch.inference_mode()
    def extend(self, lm, input_ids: torch.Tensor, cache, **extra) -> torch.Tensor:
        """Feed new tokens (B, n) after the cached ones; returns logits (B, n, V).
        ``extra``: attention_mask / position_ids for left-padded batches and trees."""
        if isinstance(cache, StaticKVCache):
            hidden, _ = lm.fast.run(lm.fast.embed(input_ids), cache, **extra)
            return lm.fast.logits(hidden)
        return lm.model(input_ids=input_ids, **cache_arg(lm.model, cache), use_cache=True,
                        **extra).logits

    def greedy_chain(self, lm, first: torch.Tensor, cache, steps: int) -> torch.Tensor | None:
        """``steps`` greedy proposals in one compiled call (runtime/fast/compiled_step.py):
        ``first`` (1, 1) is the first, each next one the argmax after feeding the one
        before; the cache gains ``steps - 1`` tokens. None where there is no such call (not
        compiled, or a family whose logits are not the plain head's): the caller loops."""
        if (isinstance(cache, StaticKVCache) and lm.fast.compiled is not None and steps > 1
                and type(self).extend is ModelAdapter.extend):
            return lm.fast.compiled.greedy_chain(first, cache, steps)
        return None

    # hidden-state drafters (HiViS/Sparrow) read one layer of the target's hidden states
    # from the same forwards: hidden_states[layer] (0 = embeddings, -1 = the last layer;
    # transformers v5 gives that one after the final norm); EAGLE-3 reads a tuple of
    # layers, concatenated (``pick_layers``)
    @torch.inference_mode()
    def prefill_hidden(self, lm, inputs: dict[str, torch.Tensor], cache,
                       layer) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefill`` plus the chosen layer's hidden states of every prompt position,
        (B, V) and (B, L, H)."""
        fast = self._fast_prefill(lm, inputs, cache, layer)
        if fast is not None:
            return fast
        out = self._model_forward(lm, inputs, cache, logits_to_keep=1, output_hidden_states=True)
        return out.logits[:, -1, :], pick_layers(out.hidden_states, layer)

    @torch.inference_mode()
    def extend_hidden(self, lm, input_ids: torch.Tensor, cache, layer,
                      **extra) -> tuple[torch.Tensor, torch.Tensor]:
        """``extend`` plus the chosen layer's hidden states, (B, n, V) and (B, n, H)."""
        if isinstance(cache, StaticKVCache):
            hidden, chosen = lm.fast.run(lm.fast.embed(input_ids), cache, hidden_layer=layer,
                                         **extra)
            return lm.fast.logits(hidden), chosen
        out = lm.model(input_ids=input_ids, **cache_arg(lm.model, cache), use_cache=True,
                       output_hidden_states=True, **extra)
        return out.logits, pick_layers(out.hidden_states, layer)


def pick_layers(states, layer) -> torch.Tensor:
    """hidden_states[layer], or (a tuple of layers: EAGLE-3's low, mid and high) those
    entries concatenated on the feature axis, in the order given."""
    if isinstance(layer, int):
        return states[layer]
    return torch.cat([states[i] for i in layer], dim=-1)


def _dynamic_cache(config):
    """transformers' DynamicCache; imported when first needed (importing transformers takes
    a second that profile checks and --dry-run need not pay)."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


@functools.lru_cache(maxsize=None)
def _cache_keyword(forward) -> str:
    try:
        parameters = inspect.signature(forward).parameters   # through its decorators
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def cache_arg(module, cache) -> dict:
    """The keyword argument that hands ``cache`` to ``module``'s forward: ``cache=`` where
    the installed transformers names it so (5.24, for one: ``past_key_values`` still works there
    but warns, deprecated until its removal in 5.40), ``past_key_values=`` before (5.17)."""
    return {_cache_keyword(type(module).forward): cache}


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def truncate_cache(cache, length: int) -> None:
    """Roll a KV cache back to its first ``length`` positions (transformers v5: crop takes
    the negative number of positions to drop)."""
    extra = cache_length(cache) - length
    if extra < 0:
        raise ValueError(f"cannot grow a cache by truncation ({cache_length(cache)} -> {length})")
    if extra:
        cache.crop(-extra)


def keep_branch(cache, prefix: int, slots: list[int]) -> None:
    """Keep the first ``prefix`` cached positions and then only ``slots`` (ascending, all
    past the prefix), which move down to follow it: a tree round's accepted branch is not
    contiguous in the cache. In place on a static cache; an index_select along the
    sequence of every layer of a transformers cache."""
    if isinstance(cache, StaticKVCache):
        cache.keep_positions(prefix, slots)
        return
    index = torch.cat([torch.arange(prefix), torch.tensor(slots, dtype=torch.long)])
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False) or layer.keys is None or not layer.keys.numel():
            continue
        index = index.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


def _embedding_rows(inputs: dict) -> dict:
    """Rows given as embeddings (the drafters' prompts), which the fast path takes as they
    are: alone (no padding, positions 0..L-1), or left-padded with their padding mask and
    1-D positions per row; else {}."""
    if set(inputs) == {"inputs_embeds"}:
        return inputs
    if set(inputs) != {"inputs_embeds", "attention_mask", "position_ids"}:
        return {}
    return inputs if inputs["position_ids"].dim() == 2 else {}
