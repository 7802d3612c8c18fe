"""Model-family adapters: one file per family, looked up by ``config.model_type``."""

from __future__ import annotations

from vlmspec_cli.runtime.adapters.base import ModelAdapter
from vlmspec_cli.runtime.adapters.causal_lm import CausalLMAdapter
from vlmspec_cli.runtime.adapters.emu3 import Emu3Adapter
from vlmspec_cli.runtime.adapters.image_to_text import ImageToTextAdapter
from vlmspec_cli.runtime.adapters.janus import JanusAdapter
from vlmspec_cli.runtime.adapters.llava import LlavaAdapter
from vlmspec_cli.runtime.adapters.llava_next import LlavaNextAdapter
from vlmspec_cli.runtime.adapters.llava_onevision import LlavaOnevisionAdapter
from vlmspec_cli.runtime.adapters.mistral3 import Mistral3Adapter
from vlmspec_cli.runtime.adapters.qwen2_vl import Qwen2VLAdapter, Qwen25VLAdapter
from vlmspec_cli.runtime.adapters.qwen3_vl import Qwen3VLAdapter

_ADAPTERS: list[ModelAdapter] = [LlavaAdapter(), LlavaNextAdapter(), JanusAdapter(), Qwen25VLAdapter(), Qwen2VLAdapter(), Qwen3VLAdapter(), Mistral3Adapter(), LlavaOnevisionAdapter(), Emu3Adapter(), CausalLMAdapter()]


class UnsupportedModelError(ValueError):
    pass


def adapter_for(config, role: str = "target") -> ModelAdapter:
    for adapter in _ADAPTERS:
        if adapter.supports(config):
            return adapter
    if role == "captioner":  # a captioner only generates text from images: any family will do
        return ImageToTextAdapter()
    known = ", ".join(t for a in _ADAPTERS for t in a.model_types)
    raise UnsupportedModelError(
        f"model type '{config.model_type}' has no vlmspec adapter yet (supported: {known})"
    )


__all__ = ["ModelAdapter", "adapter_for", "UnsupportedModelError"]
