"""A text-anchored draft head on the target's hidden states (HiViS §3, Sparrow §3).

The head never sees a visual token. Its input at a text position t is

    z_t = FC(e(x_{t+1}) ⊕ h_t)  (+ s_k, a step embedding, HiViS)

where h_t is the target's hidden state at position t (layer ``target_layer``: HiViS reads
the last layer, Sparrow the second-to-last; in a VLM those states are already "infused"
with the video), e(x_{t+1}) is the target's own embedding of the token that follows, and
s_k says how many of the head's own predictions lie behind this step (k = 0: h_t came from
the target). A few Llama decoder layers over z give h'_t, the head's estimate of the
target's next hidden state h_{t+1}; the target's LM head on the head's norm of h'_t gives
the draft distribution of x_{t+2}. Drafting further feeds h'_t back as if it were the
target's (self-feedback, HiViS stage 2).

Only text positions enter the head's KV cache (Sparrow's VATA: no visual KV), at
text-only positions 0, 1, 2 …, so a draft step costs the same for 4 frames or 400.

The head is a ``PreTrainedModel`` (config + safetensors, ``from_pretrained``); it borrows
the target's token embedding and LM head, which it does not store. When the target decodes
on the fast path, so does the head: its layers run over a ``StaticKVCache`` through
``FastDecoder`` (``decoder_stack``), the head's own forward is used for training.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (LlamaDecoderLayer, LlamaRMSNorm,
                                                      LlamaRotaryEmbedding)

from vlmspec_cli.runtime.adapters.base import TextStack, cache_arg
from vlmspec_cli.runtime.fast.trunk import chunk_mask


class HiddenHeadConfig(PretrainedConfig):
    model_type = "vlmspec_hidden_head"

    def __init__(self, hidden_size: int = 128, intermediate_size: int = 384,
                 num_hidden_layers: int = 1, num_attention_heads: int = 4,
                 num_key_value_heads: int | None = None, head_dim: int | None = None,
                 rms_norm_eps: float = 1e-6, rope_theta: float = 10000.0,
                 max_position_embeddings: int = 4096, target_layer: int = -1,
                 max_steps: int = 0, vocab_size: int = 0, target_model_type: str = "",
                 **kwargs) -> None:
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.target_layer = target_layer        # which of the target's hidden_states it reads
        self.max_steps = max_steps              # step embeddings (0: none)
        self.vocab_size = vocab_size            # the target's, checked at load
        self.target_model_type = target_model_type
        super().__init__(**kwargs)

    def layer_config(self) -> LlamaConfig:
        # an additive float mask is always passed for more than one row (trunk.chunk_mask
        # or a tree mask), which sdpa and eager both honour
        return LlamaConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            vocab_size=max(self.vocab_size, 1), attn_implementation="sdpa")


class HiddenDraftHead(PreTrainedModel):
    config_class = HiddenHeadConfig
    base_model_prefix = "head"
    _no_split_modules = ["LlamaDecoderLayer"]

    def __init__(self, config: HiddenHeadConfig) -> None:
        super().__init__(config)
        layer_config = config.layer_config()
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList(LlamaDecoderLayer(layer_config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(layer_config)
        self.steps = nn.Embedding(config.max_steps, h) if config.max_steps else None
        self.post_init()

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.config.layer_config())

    def forward(self, token_embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache=None, attention_mask: torch.Tensor | None = None,
                steps: torch.Tensor | None = None) -> torch.Tensor:
        """h' (B, n, H) for n pairs (e(x_{t+1}), h_t). ``positions`` (B, n): text-only
        positions; ``attention_mask``: additive (B, 1, n, past + n), default causal after
        the cache; ``steps`` (B, n): self-feedback depth of each pair (step embeddings)."""
        z = self.inputs(token_embeds, hidden, steps)
        return self.layers_only(z, positions, cache, attention_mask)

    def layers_only(self, z: torch.Tensor, positions: torch.Tensor, cache=None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head's decoder layers over its inputs z (B, n, H)."""
        past = 0 if cache is None else int(cache.get_seq_length())
        if attention_mask is None:
            attention_mask = chunk_mask(z.shape[1], past, z.dtype, z.device)
        pe = self.rotary(z, positions)
        for layer in self.layers:
            z = layer(z, attention_mask=attention_mask, position_ids=positions,
                      **cache_arg(layer, cache), use_cache=cache is not None,
                      position_embeddings=pe)
        return z

    def inputs(self, token_embeds: torch.Tensor, hidden: torch.Tensor,
               steps: torch.Tensor | None = None) -> torch.Tensor:
        """z (B, n, H) = FC(e(x_{t+1}) ⊕ h_t) (+ s_k): what the layers read."""
        z = self.fc(torch.cat([token_embeds, hidden.to(token_embeds.dtype)], dim=-1))
        if self.steps is not None and steps is not None:
            z = z + self.steps(steps.clamp(max=self.config.max_steps - 1))
        return z

    def decoder_stack(self) -> TextStack:
        """The head's layers as a stack the fast path runs (runtime/fast/fast_decoder.py): no
        embedding or LM head of its own, and no final norm (``head_logits`` applies it;
        drafting feeds the pre-norm states back)."""
        return TextStack(None, self.layers, nn.Identity(), self.rotary, None,
                         self.config.layer_config())


def prompt_pairs(ids: torch.Tensor, hidden: torch.Tensor, visual: torch.Tensor):
    """The head's view of a prompt of L target positions: for every TEXT position t < L-1,
    the pair (x_{t+1}, h_t). Returns (next_ids (n,), hidden rows (n, H)). Visual positions
    never become pairs; a text position just before an image pairs with the image
    placeholder token (a fixed embedding, the same in training and decoding). The last
    position's pair needs the first generated token and is made by the drafter."""
    text = (~visual[:-1]).nonzero().flatten()
    return ids[text + 1], hidden[text]


def head_logits(head: HiddenDraftHead, lm_head, h: torch.Tensor) -> torch.Tensor:
    """Draft logits from the head's states: its own norm, the target's LM head."""
    return lm_head(head.norm(h))
