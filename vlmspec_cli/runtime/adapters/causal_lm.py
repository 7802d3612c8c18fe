"""Text-only causal LMs (Llama, Qwen2, …) used as drafts for text-only drafting."""

from __future__ import annotations

from transformers import AutoModelForCausalLM

from vlmspec_cli.runtime.adapters.base import ModelAdapter


class CausalLMAdapter(ModelAdapter):
    model_types = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3", "gpt2", "opt")
    model_class = AutoModelForCausalLM
    takes_images = False
