"""The captioner behind caption drafting (TABED §6.2): a lightweight image-to-text model that
runs once per request; on a GPU in a worker thread (own CUDA stream) so that it overlaps
the target's prefill."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from vlmspec_cli.runtime.models.loading import LoadedModel
from vlmspec_cli.runtime.request import Message


class Captioner:
    def __init__(self, lm: LoadedModel, prompt: str = "describe the image.",
                 max_new_tokens: int = 48) -> None:
        self.lm = lm
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self._pool: ThreadPoolExecutor | None = None
        self._cache: OrderedDict[str, str] = OrderedDict()
        self.cache_size = 256

    @torch.inference_mode()
    def caption_batch(self, images: list) -> list[str]:
        """Greedy captions of several images in one batched generate() (left padding)."""
        # (its module imports transformers' model classes: not before a captioner loads)
        from vlmspec_cli.runtime.adapters.image_to_text import ImageToTextAdapter

        lm = self.lm
        tok = lm.tokenizer
        if isinstance(lm.adapter, ImageToTextAdapter):
            inputs = lm.processor(images=list(images), text=[self.prompt] * len(images) if self.prompt else None,
                                  return_tensors="pt", padding=True)
        else:  # a chat VLM (e.g. a small Llava): the prompt goes through its chat template
            text = lm.adapter.prompt_text(lm, [Message("user", self.prompt, (images[0],))])
            side, tok.padding_side = tok.padding_side, "left"
            try:
                inputs = lm.processor(images=list(images), text=[text] * len(images),
                                      return_tensors="pt", padding=True)
            finally:
                tok.padding_side = side
        inputs = {k: (v.to(lm.device, dtype=lm.dtype) if v.is_floating_point() else v.to(lm.device))
                  for k, v in inputs.items()}
        gen = lm.model.generation_config
        if gen.pad_token_id is None:  # batched generate() pads finished rows
            gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        # (some families' generate(), e.g. BLIP's, pass pad_token_id themselves)
        out = lm.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        if not getattr(lm.model.config, "is_encoder_decoder", False):
            out = out[:, _echoed_prompt(out, inputs["input_ids"]):]  # drop the prompt
        return [t.strip() for t in tok.batch_decode(out, skip_special_tokens=True)]

    def forget(self) -> None:
        """Drop every cached caption (benchmarks: each request then pays for its own images,
        as a folder of distinct images does, whichever row captioned them first)."""
        self._cache.clear()

    def caption_all(self, images: list) -> tuple[list[str], float]:
        """Captions of every image (cached by pixel content: a conversation's second turn
        or a repeated image costs nothing), and the seconds it took."""
        t0 = time.perf_counter()
        keys = [_image_key(im) for im in images]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo:
            first = {k: im for k, im in zip(keys, images) if k in todo}
            for key, text in zip(todo, self.caption_batch([first[k] for k in todo])):
                self._cache[key] = text
        for key in keys:
            self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return [self._cache[k] for k in keys], time.perf_counter() - t0

    def submit(self, images: list) -> Future:
        """Start captioning; the future gives ``caption_all``'s result.

        On a GPU it runs in a worker thread on its own CUDA stream, overlapping the
        target's prefill. On CPU it runs here and now: the prefill already uses every
        core, and a second thread's OpenMP pool left the main thread's decoding several
        times slower for the rest of the process (by hand on 2 cores, not recorded)."""
        if self.lm.device.type != "cuda":
            future: Future = Future()
            future.set_result(self.caption_all(list(images)))
            return future
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="captioner")
        device = self.lm.device

        def run():
            stream = torch.cuda.Stream(device=device)
            with torch.cuda.stream(stream):
                result = self.caption_all(list(images))
            stream.synchronize()
            return result

        return self._pool.submit(run)

def _echoed_prompt(out: torch.Tensor, prompt: torch.Tensor) -> int:
    """How many leading tokens of generate()'s output repeat the prompt: all of it for
    plain decoder-only models, all but a trailing [SEP] for BLIP."""
    n = min(out.shape[1], prompt.shape[1])
    same = (out[:, :n] == prompt[:, :n].to(out.device)).all(0)
    return int(n if bool(same.all()) else same.int().argmin())


def _image_key(image) -> str:
    digest = hashlib.blake2b(image.tobytes(), digest_size=16)
    digest.update(f"{image.mode}{image.size}".encode())
    return digest.hexdigest()
