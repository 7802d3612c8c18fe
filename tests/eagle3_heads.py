"""Tiny random-weight EAGLE-3 heads written the way SpecForge exports them (config.json with
``architectures: ["LlamaForCausalLMEagle3"]``, one model.safetensors holding fc, midlayer.*,
norm, lm_head, d2t and t2d by their published names, no embed_tokens), for a target folder:
its widths, vocabulary, layer count and, for Qwen-VL targets, its M-RoPE sections.

Written here from plain tensors and a dict, not by vlmspec's exporter, so loading them
tests the reader against the layout and not against vlmspec's own writer. The draft
vocabulary is a random subset of the target's ids (``draft_vocab``), so q is zero off it."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def target_text_config(target: str | Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(target).get_text_config()


def head_config(target: str | Path, draft_vocab: int | None = None, layer_ids=None) -> dict:
    """config.json of a head for ``target``. ``layer_ids``: None (the engines' default
    layers), ``("top", ids)`` (vLLM's key) or ``("nested", ids)`` (eagle_config, SGLang's)."""
    from transformers import AutoConfig

    top = AutoConfig.from_pretrained(target)
    text = top.get_text_config()
    heads = text.num_attention_heads
    hidden = text.hidden_size
    rope = dict(getattr(text, "rope_parameters", None) or {})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "target_model_type": top.model_type, "hidden_act": "silu", "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_attention_heads": heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", heads),
        "head_dim": getattr(text, "head_dim", None) or hidden // heads,
        "rms_norm_eps": 1e-6, "rope_theta": float(rope.get("rope_theta", 10000.0)),
        "max_position_embeddings": 4096, "num_hidden_layers": 1, "tie_word_embeddings": False,
        "vocab_size": text.vocab_size, "draft_vocab_size": draft_vocab or text.vocab_size,
        "torch_dtype": "float32",
    }
    if rope.get("mrope_section"):
        config["rope_scaling"] = {"type": "mrope", "mrope_section": list(rope["mrope_section"])}
        if rope.get("mrope_interleaved"):
            config["rope_scaling"]["mrope_interleaved"] = True
    if layer_ids is not None:
        where, ids = layer_ids
        if where == "top":
            config["eagle_aux_hidden_state_layer_ids"] = list(ids)
        else:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids),
                                      "use_aux_hidden_state": True}
    return config


def head_tensors(config: dict, seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random weights by their published names; a random sorted draft vocabulary."""
    g = torch.Generator().manual_seed(seed)
    h, i = config["hidden_size"], config["intermediate_size"]
    hd, n, kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    vocab, draft = config["vocab_size"], config["draft_vocab_size"]

    def w(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    ids = torch.randperm(vocab, generator=g)[:draft].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return {
        "fc.weight": w(h, 3 * h, s=0.1),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": w(n * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": w(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": w(h, n * hd),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.mlp.gate_proj.weight": w(i, h),
        "midlayer.mlp.up_proj.weight": w(i, h),
        "midlayer.mlp.down_proj.weight": w(h, i),
        "norm.weight": torch.ones(h),
        "lm_head.weight": w(draft, h, s=scale),
        "d2t": ids - torch.arange(draft),
        "t2d": t2d,
    }


def write_head(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def eagle3_head(folder: Path, target: str | Path, seed: int = 0, draft_vocab: int | None = None,
                layer_ids=None, scale: float = 1.0) -> Path:
    """A random EAGLE-3 head for ``target`` in the published layout."""
    config = head_config(target, draft_vocab, layer_ids)
    return write_head(folder, config, head_tensors(config, seed, scale))
