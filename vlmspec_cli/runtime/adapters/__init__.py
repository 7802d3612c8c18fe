"""Model-family adapters: one file per family, looked up by ``config.model_type``.

The families' modules import their transformers model classes, which takes seconds: they
are imported on the first lookup (``adapter_for``), so what needs only the base class or
the cache helpers (the drafters, ``--dry-run``) does not pay for them."""

from __future__ import annotations

from vlmspec_cli.runtime.adapters.base import ModelAdapter

_ADAPTERS: list[ModelAdapter] = []


class UnsupportedModelError(ValueError):
    pass


def adapters() -> list[ModelAdapter]:
    """Every family's adapter, in lookup order (the causal LM, for text drafts, last)."""
    if not _ADAPTERS:
        from vlmspec_cli.runtime.adapters.causal_lm import CausalLMAdapter
        from vlmspec_cli.runtime.adapters.emu3 import Emu3Adapter
        from vlmspec_cli.runtime.adapters.janus import JanusAdapter
        from vlmspec_cli.runtime.adapters.llava import LlavaAdapter
        from vlmspec_cli.runtime.adapters.llava_next import LlavaNextAdapter
        from vlmspec_cli.runtime.adapters.llava_onevision import LlavaOnevisionAdapter
        from vlmspec_cli.runtime.adapters.mistral3 import Mistral3Adapter
        from vlmspec_cli.runtime.adapters.qwen2_vl import Qwen2VLAdapter, Qwen25VLAdapter
        from vlmspec_cli.runtime.adapters.qwen3_vl import Qwen3VLAdapter

        _ADAPTERS.extend([LlavaAdapter(), LlavaNextAdapter(), JanusAdapter(), Qwen25VLAdapter(),
                          Qwen2VLAdapter(), Qwen3VLAdapter(), Mistral3Adapter(),
                          LlavaOnevisionAdapter(), Emu3Adapter(), CausalLMAdapter()])
    return _ADAPTERS


def adapter_for(config, role: str = "target") -> ModelAdapter:
    for adapter in adapters():
        if adapter.supports(config):
            return adapter
    if role == "captioner":  # a captioner only generates text from images: any family will do
        from vlmspec_cli.runtime.adapters.image_to_text import ImageToTextAdapter

        return ImageToTextAdapter()
    known = ", ".join(t for a in adapters() for t in a.model_types)
    raise UnsupportedModelError(
        f"model type '{config.model_type}' has no vlmspec adapter yet (supported: {known})"
    )


__all__ = ["ModelAdapter", "adapter_for", "adapters", "UnsupportedModelError"]
