"""Emu3 family (Emu3ForConditionalGeneration), image-generation mode: the prompt is text
ending in the target size ("<|image start|>H*W<|image token|>", as Emu3Processor writes
it with ``return_for_image_generation``); the output is H rows of W visual tokens, each
row closed by an end-of-line token, which the VQ-VAE decodes to pixels.

Every forward runs two rows and returns one distribution per position, the one
transformers' ``generate`` samples from with ``negative_prompt_ids`` and
``prefix_allowed_tokens_fn`` (UnbatchedClassifierFreeGuidanceLogitsProcessor, then
PrefixConstrainedLogitsProcessor):

    l = u + s * (c - u),   c, u = log_softmax of the conditional / negative row,

then every token the image position does not allow set to -inf: visual tokens inside a
row, the end-of-line token at the end of each row. The mask depends only on the position
in the image, so target-only decoding, drafts and verification all see the same
distributions.

The negative row is the negative prompt with the same size suffix. The two rows differ in
length, so the shorter one is left-padded with the pad token: its padding is masked out of
every attention and its positions start at 0 at its first real token, so each row is
computed as if alone. The cache records the padding and the prompt length
(``GuidedCache``); a crop or index_select of the cache applies to both rows at once.

Visual tokens are ordinary vocabulary entries (``<|visual tokenNNNNNN|>``): the engine's
tokens are vocabulary ids, mapped to VQ codes only to decode pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, Emu3ForConditionalGeneration

from vlmspec_cli.runtime.adapters.base import cache_arg, cache_length
from vlmspec_cli.runtime.adapters.guided import GuidedImageAdapter

# Emu3's published negative prompt (the model card's and transformers' example)
DEFAULT_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, "
                    "fewer digits, cropped, worst quality, low quality, normal quality, jpeg "
                    "artifacts, signature, watermark, username, blurry.")


@dataclass(frozen=True)
class RowLayout:
    """Where the two rows' real tokens start in the cache, and where the prompt ends."""

    pads: tuple[int, int]    # left padding of the conditional and the negative row
    prompt_len: int          # cached positions before the first image token


class GuidedCache(DynamicCache):
    """A transformers cache of both rows, with the layout its prefill gave it."""

    layout: RowLayout | None = None


class Emu3Adapter(GuidedImageAdapter):
    model_types = ("emu3",)
    model_class = Emu3ForConditionalGeneration
    splits_layers = False         # two rows with their own positions: no split trunk
    quant_skip_modules = ("vqmodel", ".*vqmodel", "lm_head")
    default_guidance = 3.0   # Emu3's published image-generation guidance scale

    # -- the image side --------------------------------------------------------------
    def size_kwargs(self, lm) -> dict:
        """Emu3Processor's size settings (``ratio``, ``image_area``): the generation
        config's where it names them, else the processor's own defaults."""
        config = lm.model.generation_config
        return {k: getattr(config, k, None) or getattr(lm.processor, k)
                for k in ("ratio", "image_area")}

    def image_size(self, lm) -> tuple[int, int]:
        """(rows, columns) of visual tokens, as the processor computes the target size."""
        s = self.size_kwargs(lm)
        proc = lm.processor
        rows, cols = proc.calculate_generate_size(s["ratio"], s["image_area"], proc.downsample_ratio)
        return int(rows), int(cols)

    def image_grid(self, lm) -> tuple[int, int]:
        """(rows, tokens per row) in raster order: each row's visual tokens and its EOL."""
        rows, cols = self.image_size(lm)
        return rows, cols + 1

    def num_image_tokens(self, lm) -> int:
        rows, cols = self.image_grid(lm)
        return rows * cols

    def codebook_size(self, lm) -> int:
        return int(lm.model.model.vqmodel.config.codebook_size)

    def codebook(self, lm) -> torch.Tensor:
        raise ValueError("acceptance: relaxed (LANTERN) needs a draft token's VQ code to be its "
                         "id; Emu3's visual tokens are vocabulary ids among text and end-of-line "
                         "tokens, so relaxed acceptance is not available for Emu3 (use exact)")

    @torch.inference_mode()
    def decode_images(self, lm, tokens: torch.Tensor) -> torch.Tensor:
        """(B, rows * (cols + 1)) generated ids -> uint8 pixels (B, H, W, 3), through the
        VQ-VAE and the image processor's postprocess (as Emu3's own example)."""
        rows, cols = self.image_grid(lm)
        grid = tokens.reshape(-1, rows, cols).to(lm.device)
        codes = lm.model.vocabulary_mapping.convert_bpe2img(grid)   # drops the EOL column
        pixels = lm.model.model.vqmodel.decode(codes)
        images = lm.processor.postprocess(list(pixels.float().cpu()),
                                          return_tensors="PIL.Image.Image")["pixel_values"]
        return torch.stack([torch.from_numpy(np.array(im.convert("RGB"))) for im in images])

    def stop_token_ids(self, lm) -> set[int]:
        return set()   # an image ends after its grid is full, never at a token

    def allowed(self, lm, index: torch.Tensor) -> torch.Tensor:
        """(n, V) bool: the tokens allowed as the ``index``-th (n,) generated token, the
        rule of transformers' Emu3 example: EOL closing each row, visual tokens inside
        one; after the grid EOF, end of image, EOS, then padding."""
        rows, cols = self.image_grid(lm)
        tok, mapping = lm.tokenizer, lm.model.vocabulary_mapping
        vocab = lm.model.get_output_embeddings().weight.shape[0]
        mask = torch.zeros(len(index), vocab, dtype=torch.bool, device=lm.device)
        mask[:, mapping.image_tokens] = True
        offset = index.to(lm.device) + 1     # from the "<|image token|>" that opens the grid
        tail = [tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id]
        for i, o in enumerate(offset.tolist()):
            after = o - rows * cols
            single = None
            if o % cols == 0:
                single = mapping.eol_token_id
            elif after > 0:
                single = tail[after - 1] if after <= len(tail) else tok.pad_token_id
            if single is not None:
                mask[i] = False
                mask[i, single] = True
        return mask

    # -- prompts ---------------------------------------------------------------------
    def image_token(self, lm) -> str | None:
        return None   # the prompt is text only: no image placeholder to replace

    def prompt_text(self, lm, messages, add_generation_prompt: bool = True) -> str:
        return " ".join(m.text for m in messages if m.role == "user").strip()

    def negative_prompt(self, lm) -> str:
        return getattr(lm.model.generation_config, "negative_prompt", None) or DEFAULT_NEGATIVE

    def row_ids(self, lm, prompt: str) -> tuple[list[int], list[int]]:
        """The conditional and negative rows as Emu3Processor writes them for image
        generation: BOS, the text, the size suffix."""
        wrapper = lm.tokenizer.image_wrapper_token
        if wrapper in prompt or lm.tokenizer.boi_token in prompt:
            raise ValueError(f"the prompt may not contain Emu3's image tokens ({wrapper})")
        rows = lm.processor(text=[prompt, self.negative_prompt(lm)], padding=False,
                            return_for_image_generation=True, **self.size_kwargs(lm))
        cond, uncond = (list(r) for r in rows["input_ids"])
        return cond, uncond

    def encode(self, lm, prompt: str, images: list | None) -> dict[str, torch.Tensor]:
        """(2, L) ids (conditional, negative), the shorter left-padded, and their mask."""
        if images:
            raise ValueError("image generation takes a text prompt, not images")
        pad = lm.tokenizer.pad_token_id
        if pad is None or pad == lm.tokenizer.bos_token_id:
            raise ValueError(f"model '{lm.name}' needs a pad token other than BOS to align "
                             "the guidance rows")
        rows = self.row_ids(lm, prompt)
        length = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (length - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows])
        return {"input_ids": ids.to(lm.device), "attention_mask": mask.to(lm.device)}

    def embed(self, lm, prompt: str, images: list | None, pool: int = 1) -> torch.Tensor:
        """The prompt's (2, L, H) input embeddings (the padding embeds the pad token, which
        ``prefill`` recognises)."""
        ids = self.encode(lm, prompt, images)["input_ids"]
        with torch.inference_mode():
            return lm.model.get_input_embeddings()(ids)

    # -- forwards --------------------------------------------------------------------
    def new_cache(self, lm, static: bool = True):
        """A transformers cache for both rows (Emu3's decoder has no fast path)."""
        return GuidedCache(config=lm.model.config)

    def _pads(self, lm, inputs: dict) -> torch.Tensor:
        """Each row's left padding: from the mask, else the leading pad embeddings."""
        if "attention_mask" in inputs:
            return (inputs["attention_mask"] == 0).long().cumprod(-1).sum(-1)
        embeds = inputs["inputs_embeds"]
        pad = lm.model.get_input_embeddings()(
            torch.tensor([lm.tokenizer.pad_token_id], device=embeds.device))[0]
        return (embeds == pad).all(-1).long().cumprod(-1).sum(-1)

    def _guided(self, lm, logits: torch.Tensor, first_index: torch.Tensor) -> torch.Tensor:
        """(2, n, V) logits of both rows -> (1, n, V) guided and constrained; the query at
        column i yields generated token ``first_index[i]``."""
        scale = self.guidance_scale(lm)
        logits = torch.log_softmax(logits.float(), dim=-1)
        cond, uncond = logits[0:1], logits[1:2]
        guided = cond if scale == 1 else scale * (cond - uncond) + uncond
        allowed = self.allowed(lm, first_index)
        return guided.masked_fill(~allowed[None], -float("inf"))

    @torch.inference_mode()
    def prefill(self, lm, inputs: dict[str, torch.Tensor], cache) -> torch.Tensor:
        """Run the prompt (both rows); guided logits of the first image token, (1, V)."""
        if not isinstance(cache, GuidedCache):
            raise ValueError("Emu3 image generation decodes into the adapter's own cache")
        embeds = inputs.get("inputs_embeds")
        if embeds is None:
            embeds = lm.model.get_input_embeddings()(inputs["input_ids"])
        if embeds.shape[0] != 2:
            raise ValueError("Emu3 image generation prefills its two guidance rows together")
        pads = self._pads(lm, inputs)
        length = embeds.shape[1]
        columns = torch.arange(length, device=embeds.device)[None]
        mask = (columns >= pads[:, None].to(embeds.device)).long()
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        out = lm.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                       **cache_arg(lm.model, cache), use_cache=True, logits_to_keep=1)
        cache.layout = RowLayout((int(pads[0]), int(pads[1])), length)
        first = torch.zeros(1, dtype=torch.long)
        return self._guided(lm, out.logits[:, -1:], first)[:, -1]

    @torch.inference_mode()
    def extend(self, lm, input_ids: torch.Tensor, cache, attention_mask=None,
               position_ids=None) -> torch.Tensor:
        """Feed generated tokens (1, n) to both rows; guided logits (1, n, V). A tree's
        4-D mask (1, 1, n, kv) and positions (1, n) are the cache's own, for both rows;
        each row's padding is masked out and its positions shifted to its first token."""
        layout: RowLayout = cache.layout
        n = input_ids.shape[1]
        past = cache_length(cache)
        kv = past + n
        if position_ids is None:
            position_ids = torch.arange(past, kv, device=lm.device)[None]
        if attention_mask is None:
            visible = torch.ones(n, kv, dtype=torch.bool, device=lm.device).tril(past)
        else:
            mask = attention_mask[0, 0, :, :kv]
            visible = mask if mask.dtype == torch.bool else mask == 0
        pads = torch.tensor(layout.pads, device=lm.device)
        rows = visible[None].expand(2, n, kv) & (torch.arange(kv, device=lm.device)[None, None]
                                                 >= pads[:, None, None])
        dtype = lm.model.get_output_embeddings().weight.dtype
        additive = torch.zeros(rows.shape, dtype=dtype, device=lm.device)
        additive = additive.masked_fill(~rows, torch.finfo(dtype).min)[:, None]
        out = lm.model(input_ids=input_ids.expand(2, n), attention_mask=additive,
                       position_ids=position_ids.to(lm.device).expand(2, n) - pads[:, None],
                       **cache_arg(lm.model, cache), use_cache=True)
        index = position_ids[0].cpu() + 1 - layout.prompt_len
        return self._guided(lm, out.logits, index)

    def prefill_hidden(self, lm, inputs, cache, layer):
        raise ValueError("hidden-state drafting reads text positions; Emu3 image generation "
                         "does not offer it")

    def extend_hidden(self, lm, input_ids, cache, layer, **extra):
        raise ValueError("hidden-state drafting reads text positions; Emu3 image generation "
                         "does not offer it")
