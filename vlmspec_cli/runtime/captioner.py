"""The captioner behind caption drafting (TABED §6.2): a lightweight image-to-text model that
runs once per request, in a worker thread so that it overlaps the target's prefill."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from vlmspec_cli.runtime.adapters.image_to_text import ImageToTextAdapter
from vlmspec_cli.runtime.models import LoadedModel
from vlmspec_cli.runtime.request import Message


class Captioner:
    def __init__(self, lm: LoadedModel, prompt: str = "describe the image.",
                 max_new_tokens: int = 48) -> None:
        self.lm = lm
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self._pool: ThreadPoolExecutor | None = None

    @torch.inference_mode()
    def caption(self, image) -> str:
        """Greedy caption of one image."""
        lm = self.lm
        if isinstance(lm.adapter, ImageToTextAdapter):
            inputs = lm.adapter.encode(lm, self.prompt, [image])
        else:  # a chat VLM (e.g. a small Llava): the prompt goes through its chat template
            text = lm.adapter.prompt_text(lm, [Message("user", self.prompt, (image,))])
            inputs = lm.adapter.encode(lm, text, [image])
        tok = lm.tokenizer
        out = lm.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                                pad_token_id=tok.pad_token_id or tok.eos_token_id)
        if not getattr(lm.model.config, "is_encoder_decoder", False):
            out = out[:, inputs["input_ids"].shape[1]:]  # decoder-only: drop the prompt
        return tok.decode(out[0], skip_special_tokens=True).strip()

    def caption_all(self, images: list) -> tuple[list[str], float]:
        """Captions of every image, and the seconds it took."""
        t0 = time.perf_counter()
        captions = [self.caption(im) for im in images]
        return captions, time.perf_counter() - t0

    def submit(self, images: list) -> Future:
        """Caption in the background (torch releases the GIL in its kernels, so this runs
        alongside the target prefill); the future gives ``caption_all``'s result."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="captioner")
        return self._pool.submit(self.caption_all, list(images))
