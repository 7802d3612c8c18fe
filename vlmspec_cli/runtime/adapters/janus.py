"""Janus family (JanusForConditionalGeneration), image-generation mode: the prompt is text,
the output is a grid of VQ codes that the model's VQ decoder turns into pixels.

Every forward runs two rows, conditional and unconditional, and returns the
classifier-free-guided logits (what Janus ``generate(generation_mode="image")`` samples
from, ClassifierFreeGuidanceLogitsProcessor):

    l = l_uncond + s * (l_cond - l_uncond)

so the engine, drafters and verification see one distribution per position, exactly as
for a text model. The unconditional row is the prompt with every token other than BOS and
BOI replaced by the pad token (as Janus ``generate`` builds it); both rows have the same
length, so they share positions, masks and cache lengths, and a cache crop or
index_select applies to both at once.

Image tokens are embedded with the generation embeddings + aligner and read out with the
generation head; the text LM head is never used here.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, JanusForConditionalGeneration

from vlmspec_cli.runtime.adapters.base import cache_arg
from vlmspec_cli.runtime.adapters.guided import GuidedImageAdapter
from vlmspec_cli.runtime.static_cache import StaticKVCache


class JanusAdapter(GuidedImageAdapter):
    model_types = ("janus",)
    model_class = JanusForConditionalGeneration
    quant_skip_modules = ("vision_model", ".*vision_model", "vqmodel", ".*vqmodel",
                          "generation_head", ".*generation_head", "lm_head")
    default_guidance = 5.0   # Janus generate's own default when guidance_scale is unset

    # -- the image side --------------------------------------------------------------
    def image_grid(self, lm) -> tuple[int, int]:
        """(rows, columns) of image tokens, in raster order."""
        rows, cols = lm.model.model.vqmodel.quantize.quant_state_dims
        return int(rows), int(cols)

    def num_image_tokens(self, lm) -> int:
        rows, cols = self.image_grid(lm)
        return rows * cols

    def codebook_size(self, lm) -> int:
        return int(lm.model.model.vqmodel.config.num_embeddings)

    def codebook(self, lm) -> torch.Tensor:
        """The VQ codebook as the decoder reads it (L2-normalised rows), (K, D)."""
        weight = lm.model.model.vqmodel.quantize.embedding.weight.detach().float()
        return torch.nn.functional.normalize(weight, dim=-1)

    @torch.inference_mode()
    def decode_images(self, lm, tokens: torch.Tensor) -> torch.Tensor:
        """(B, rows*cols) codes -> uint8 pixels (B, H, W, 3)."""
        pixels = lm.model.decode_image_tokens(tokens.to(lm.device))
        return ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu()

    def stop_token_ids(self, lm) -> set[int]:
        return set()   # an image ends after its grid is full, never at a token

    # -- prompts ---------------------------------------------------------------------
    BOI = "<begin_of_image>"

    def _special(self, lm, name: str) -> int:
        """bos / pad from the generation config (or tokenizer); BOI from the tokenizer's
        named special token (``boi_token``, as Janus' processor reads it), its literal
        ``<begin_of_image>``, or the generation config's ``generation_kwargs``."""
        config, tok = lm.model.generation_config, lm.tokenizer
        value = getattr(config, name, None)
        if value is None and name != "boi_token_id":
            value = getattr(tok, name, None)
        if value is None and name == "boi_token_id":
            value = getattr(tok, "boi_token_id", None)
            if value is None and self.BOI in tok.get_vocab():
                value = tok.convert_tokens_to_ids(self.BOI)
            if value is None:
                value = (getattr(config, "generation_kwargs", None) or {}).get(name)
        if value is None:
            raise ValueError(f"model '{lm.name}' has no {name.removesuffix('_id')} token; Janus "
                             "image generation needs BOS, pad and begin-of-image tokens")
        return int(value)

    def prompt_text(self, lm, messages, add_generation_prompt: bool = True) -> str:
        text = " ".join(m.text for m in messages if m.role == "user").strip()
        template = getattr(lm.tokenizer, "chat_template", None)
        if template:
            return lm.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                    tokenize=False, add_generation_prompt=False)
        return (lm.tokenizer.bos_token or "") + text

    def prompt_ids(self, lm, prompt: str) -> torch.Tensor:
        """(2, L): the conditional row (prompt + BOI) and the unconditional row."""
        bos, pad, boi = (self._special(lm, n) for n in ("bos_token_id", "pad_token_id",
                                                        "boi_token_id"))
        ids = lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not ids or ids[-1] != boi:
            ids = ids + [boi]
        cond = torch.tensor(ids)
        uncond = torch.where((cond == bos) | (cond == boi), cond, torch.full_like(cond, pad))
        return torch.stack([cond, uncond]).to(lm.device)

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        if images:
            raise ValueError("image generation takes a text prompt, not images")
        return {"input_ids": self.prompt_ids(lm, prompt)}

    def embed(self, lm, prompt: str, images: list | None, pool: int = 1) -> torch.Tensor:
        """The prompt's (2, L, H) input embeddings (conditional, unconditional rows)."""
        ids = self.encode(lm, prompt, images)["input_ids"]
        with torch.inference_mode():
            return lm.model.get_input_embeddings()(ids)

    # -- forwards --------------------------------------------------------------------
    def _guided(self, lm, hidden: torch.Tensor) -> torch.Tensor:
        logits = lm.model.model.generation_head(hidden).float()
        cond, uncond = logits[0:1], logits[1:2]
        return uncond + self.guidance_scale(lm) * (cond - uncond)

    @torch.inference_mode()
    def prefill(self, lm, inputs: dict[str, torch.Tensor], cache) -> torch.Tensor:
        """Run the prompt (both rows); guided logits of the last position, (1, V)."""
        if "inputs_embeds" in inputs:
            embeds = inputs["inputs_embeds"]
        else:
            embeds = lm.model.get_input_embeddings()(inputs["input_ids"])
        eager = cache if not isinstance(cache, StaticKVCache) else DynamicCache(config=lm.model.config)
        language = lm.model.model.language_model
        out = language(inputs_embeds=embeds, **cache_arg(language, eager), use_cache=True)
        if eager is not cache:
            cache.load(eager)   # the fast path decodes from here (runtime/fast/fast_decoder.py)
        return self._guided(lm, out.last_hidden_state[:, -1:])[:, -1]

    @torch.inference_mode()
    def extend(self, lm, input_ids: torch.Tensor, cache, attention_mask=None,
               position_ids=None) -> torch.Tensor:
        """Feed image tokens (1, n) to both rows; guided logits (1, n, V). A 4-D tree mask
        (1, 1, n, kv) and positions (1, n) apply to both rows."""
        embeds = lm.model.prepare_embeddings_for_image_generation(input_ids).expand(2, -1, -1)
        extra = {}
        if attention_mask is not None:
            extra["attention_mask"] = attention_mask.expand(2, *attention_mask.shape[1:])
        if position_ids is not None:
            extra["position_ids"] = position_ids.expand(2, -1)
        if isinstance(cache, StaticKVCache):
            return self._guided(lm, lm.fast.run(embeds, cache, **extra)[0])
        language = lm.model.model.language_model
        out = language(inputs_embeds=embeds, **cache_arg(language, cache), use_cache=True, **extra)
        return self._guided(lm, out.last_hidden_state)
