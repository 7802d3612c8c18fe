"""An EAGLE-3 draft head (Li et al. 2025) as the engines run it, on the published weights.

At a target position t the head reads g_t = low ⊕ mid ⊕ high, three of the target's
hidden states at t (runtime/models/eagle3_format.py ``target_layers``), and the embedding of the
token after it, e(x_{t+1}):

    z_t  = fc(g_t)                                          (3·H_target → H)
    a_t  = attn([input_layernorm(e(x_{t+1})) ⊕ hidden_norm(z_t)])   (q/k/v read 2H)
    u_t  = z_t + a_t                  (``norm_before_residual``: hidden_norm(z_t) + a_t)
    h'_t = u_t + mlp(post_attention_layernorm(u_t))
    q(x_{t+2}) ∝ exp(lm_head(norm(h'_t)))                 over the draft vocabulary

Drafting further feeds h'_t back in place of z (fc applies to the target's states only):
the pair (x̂_{t+2}, h'_t) at position t + 1, and so on. Positions are the target's: 1-D
position t, or with ``rope_scaling.mrope_section`` (heads for Qwen-VL targets) the
target's 3-D M-RoPE positions, interleaved as Qwen3-VL's with ``mrope_interleaved``.

The head keeps its own small KV cache (``Eagle3Cache``), of every position it has read.
Its logits are over the draft vocabulary; verify.py ``draft_vocab_logits`` puts them on
the target's ids (``target_ids`` = draft id + d2t). Parameter and buffer names are the
published ones, so ``state_dict()`` is what a head directory holds.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from vlmspec_cli.runtime.models.eagle3_format import (Eagle3Config, Eagle3FormatError, check_head_dir,
                                               draft_to_target)


class Eagle3Cache:
    """Keys and values (1, kv_heads, n, head_dim) of the positions the head has read."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (negative: drop that many, as transformers)."""
        keep = self.get_seq_length() + length if length < 0 else length
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :keep], self.values[:, :, :keep]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys, self.values = torch.cat([self.keys, k], 2), torch.cat([self.values, v], 2)
        return self.keys, self.values


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, q, bias=c.attention_bias)
        self.k_proj = nn.Linear(2 * c.hidden_size, kv, bias=c.attention_bias)
        self.v_proj = nn.Linear(2 * c.hidden_size, kv, bias=c.attention_bias)
        self.o_proj = nn.Linear(q, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        h, eps = c.hidden_size, c.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = _MLP(c)


def rope_config(c: Eagle3Config) -> LlamaConfig:
    """The head's rotary settings as transformers' Llama reads them (default, linear,
    dynamic, yarn, llama3; an M-RoPE head's frequencies are the default ones)."""
    scaling = dict(c.rope_scaling or {})
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    if kind == "mrope" or "mrope_section" in scaling:
        kind, scaling = "default", {}
    return LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.heads, head_dim=c.head_dim,
                       max_position_embeddings=c.max_position_embeddings,
                       rope_parameters={**scaling, "rope_type": kind, "rope_theta": c.rope_theta})


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Eagle3Head(nn.Module):
    """The published EAGLE-3 head: fc, midlayer, norm, lm_head, d2t, t2d (embed_tokens when
    the checkpoint has one; otherwise the drafter uses the target's embedding)."""

    def __init__(self, c: Eagle3Config, with_embedding: bool = False) -> None:
        super().__init__()
        self.config = c
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size) if with_embedding else None
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))
        # target id of each draft id (d2t checked one-to-one): not a checkpoint tensor
        self.register_buffer("target_ids", torch.arange(c.draft_vocab_size), persistent=False)
        # rotary frequencies kept in float32 outside the module tree (a cast of the head to
        # bfloat16 must not round them)
        rotary = LlamaRotaryEmbedding(rope_config(c))
        self._inv_freq = rotary.inv_freq.detach().float().clone()
        self._rope_scale = float(rotary.attention_scaling)
        self._axis = self._mrope_axis(c)

    @staticmethod
    def _mrope_axis(c: Eagle3Config) -> torch.Tensor | None:
        """Which position axis (t, h, w) each rotary frequency reads: consecutive
        sections (Qwen2.5-VL), or interleaved t h w t h w … (Qwen3-VL)."""
        section = c.mrope_section
        if section is None:
            return None
        half = c.head_dim // 2
        if not c.mrope_interleaved:
            return torch.repeat_interleave(torch.arange(3), torch.tensor(section))
        axis = torch.zeros(half, dtype=torch.long)
        for a in (1, 2):
            idx = torch.arange(a, 3 * section[a], 3)
            axis[idx[idx < half]] = a
        return axis

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def set_vocab_map(self) -> None:
        """``target_ids`` from the loaded d2t / t2d (refusing a broken map)."""
        ids = draft_to_target(self.config, self.d2t.cpu(), self.t2d.cpu())
        self.target_ids = ids.to(self.device)

    def new_cache(self) -> Eagle3Cache:
        return Eagle3Cache()

    def project(self, target_states: torch.Tensor) -> torch.Tensor:
        """fc over the target's concatenated low ⊕ mid ⊕ high states (…, 3·H_target)."""
        return self.fc(target_states.to(self.dtype))

    def _cos_sin(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin (…, n, head_dim) for positions (3, …, n): each rotary frequency reads
        its M-RoPE axis (1-D heads read the first row)."""
        inv = self._inv_freq.to(like.device)
        freqs = positions.to(like.device).float()[..., None] * inv          # (3, …, n, half)
        if self._axis is None:
            freqs = freqs[0]
        else:
            axis = self._axis.to(like.device)
            freqs = torch.where(axis == 0, freqs[0], torch.where(axis == 1, freqs[1], freqs[2]))
        emb = torch.cat([freqs, freqs], dim=-1)
        scale = self._rope_scale
        return (emb.cos() * scale).to(like.dtype), (emb.sin() * scale).to(like.dtype)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """Rotated queries (B, heads, n, d) and keys, and values (B, kv_heads, n, d) of the
        layer's input x (B, n, 2H) at positions (3, B, n) or (3, n)."""
        c, attn = self.config, self.midlayer.self_attn
        b, n = x.shape[:2]
        q = attn.q_proj(x).view(b, n, c.heads, c.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, c.kv_heads, c.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._cos_sin(positions, q)
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)    # over the heads
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def layer_input(self, embeds: torch.Tensor, hidden: torch.Tensor):
        """(x, residual): the attention's 2H-wide input [input_layernorm(e) ⊕
        hidden_norm(z)] and what its output is added to (z, or hidden_norm(z) with
        ``norm_before_residual``)."""
        m = self.midlayer
        hidden = hidden.to(self.dtype)
        normed = m.hidden_norm(hidden)
        residual = normed if self.config.norm_before_residual else hidden
        return torch.cat([m.input_layernorm(embeds.to(self.dtype)), normed], dim=-1), residual

    def finish_layer(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """h' from the attention's output (B, n, heads·d): o_proj, residual, MLP."""
        m = self.midlayer
        h = residual + m.self_attn.o_proj(attended)
        return h + m.mlp(m.post_attention_layernorm(h))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: Eagle3Cache, mask: torch.Tensor | None = None) -> torch.Tensor:
        """h' (1, n, H) for n pairs (e(x_{t+1}), z_t): ``hidden`` is fc(g_t) or the head's
        own earlier output; ``positions`` (3, n); ``mask``: (n, past + n) bool or an
        additive (1, 1, n, past + n), default causal after the cache."""
        c = self.config
        x, residual = self.layer_input(embeds, hidden)
        n = x.shape[1]
        q, k, v = self.qkv(x, positions)
        past = cache.get_seq_length()
        keys, values = cache.update(k, v)
        if mask is None:
            rows = torch.arange(n, device=x.device)[:, None] + past
            mask = torch.arange(past + n, device=x.device)[None] <= rows
        groups = c.heads // c.kv_heads
        o = F.scaled_dot_product_attention(q, keys.repeat_interleave(groups, 1),
                                           values.repeat_interleave(groups, 1), attn_mask=mask)
        return self.finish_layer(residual, o.transpose(1, 2).reshape(1, n, c.heads * c.head_dim))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (…, V_draft) of the head's states."""
        return self.lm_head(self.norm(h))


def load_head_dir(folder: str | Path, device, dtype, vocab_size: int | None = None) -> Eagle3Head:
    """A head directory checked (eagle3_format.check_head_dir) and loaded: safetensors
    only, every tensor by its published name, then the vocabulary map checked.
    ``vocab_size``: the target's, checked before anything is built (a config declaring a
    vocabulary of billions would otherwise size its t2d buffer first)."""
    from safetensors.torch import load_file

    from vlmspec_cli.runtime.models.eagle3_format import weight_files

    folder = Path(folder)
    config, header = check_head_dir(folder)
    if vocab_size is not None and config.vocab_size != vocab_size:
        raise Eagle3FormatError(f"config.json: 'vocab_size' is {config.vocab_size}, the target's "
                                f"vocabulary has {vocab_size} tokens: a head for another target")
    head = Eagle3Head(config, with_embedding="embed_tokens.weight" in header)
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        state.update(load_file(str(path)))
    for name in ("d2t", "t2d"):   # optional when the vocabularies are the same
        state.setdefault(name, getattr(head, name))
    head.load_state_dict({k: (v if k in ("d2t", "t2d") else v.to(dtype)) for k, v in state.items()},
                         strict=True)
    head.d2t = head.d2t.long()
    head.t2d = head.t2d.bool()
    head = head.to(device=device, dtype=dtype)
    head.d2t, head.t2d = head.d2t.long(), head.t2d.bool()   # buffers keep their types
    head.set_vocab_map()
    return head.eval()


__all__ = ["Eagle3Cache", "Eagle3Head", "Eagle3FormatError", "load_head_dir"]
