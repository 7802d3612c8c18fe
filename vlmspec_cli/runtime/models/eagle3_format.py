"""The published EAGLE-3 checkpoint layout: what a head directory must hold, read and
checked without loading a tensor (names, shapes, dtypes from the safetensors headers).

A head directory as SpecForge writes it and vLLM / SGLang read it (the public files each
name was checked against are listed in ARCHITECTURE.md, "EAGLE-3 heads"):

config.json   ``architectures: ["LlamaForCausalLMEagle3"]``, a Llama layer's settings
              (hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
              head_dim (default hidden_size / heads), rms_norm_eps, rope_theta,
              rope_scaling: its ``mrope_section`` makes positions 3-D, as Qwen-VL's),
              ``vocab_size`` (the target's), ``draft_vocab_size`` (default vocab_size),
              ``target_hidden_size`` (default hidden_size), and which target layers it
              reads (``target_layers`` below).
weights       ``fc.weight`` (H, 3·H_target): the low ⊕ mid ⊕ high target states → H;
              ``midlayer.*``: one Llama decoder layer whose q/k/v read
              [input_layernorm(embedding) ⊕ hidden_norm(hidden)] (2H wide), o_proj, mlp,
              post_attention_layernorm; ``norm.weight``; ``lm_head.weight`` (V_draft, H);
              ``d2t`` (V_draft,) int64: target id = draft id + d2t[draft id]; ``t2d``
              (V,) bool: which target ids the draft vocabulary holds; optionally
              ``embed_tokens.weight`` (V, H) — SpecForge leaves it out (the engines use
              the target's embedding), older heads ship it.

Anything else — another architecture, a missing or unknown tensor, a wrong shape, a
vocabulary map that is not one-to-one onto target ids — is refused in one line naming the
key, before decoding. Only safetensors are read (never a pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_BYTES = 1 << 20


class Eagle3FormatError(ValueError):
    """A head directory that is not in the published EAGLE-3 layout (one line)."""


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    attention_bias: bool
    norm_before_residual: bool
    raw: dict                       # config.json as read (layer ids, target model type)

    @property
    def mrope_section(self) -> list[int] | None:
        """M-RoPE sections (t, h, w) of a head for a Qwen-VL target (3-D positions)."""
        section = (self.rope_scaling or {}).get("mrope_section")
        return [int(x) for x in section] if section else None

    @property
    def mrope_interleaved(self) -> bool:
        return bool((self.rope_scaling or {}).get("mrope_interleaved", False))


def _int(raw: dict, key: str, default=None, minimum: int = 1) -> int:
    """raw[key] (absent or null: ``default``), an integer of at least ``minimum``."""
    value = raw.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise Eagle3FormatError(f"config.json: '{key}' must be an integer >= {minimum}, "
                                f"not {value!r}")
    return value


def _checked(call, *args):
    """A weights_check reader's result; its CorruptModelFile as one Eagle3FormatError line."""
    from vlmspec_cli.runtime.models.weights_check import CorruptModelFile

    try:
        return call(*args)
    except CorruptModelFile as exc:
        raise Eagle3FormatError(f"corrupt {exc.kind}: {exc}") from None


def read_config(folder: Path) -> Eagle3Config:
    """config.json of a head directory (read bounded by runtime/models/weights_check.py, as every
    model's), checked key by key."""
    from vlmspec_cli.runtime.models.weights_check import read_json

    path = folder / "config.json"
    if not path.is_file():
        raise Eagle3FormatError(f"{folder}: no config.json (not an EAGLE-3 head directory)")
    if path.stat().st_size > CONFIG_BYTES:
        raise Eagle3FormatError(f"{path}: larger than 1 MiB, not a head's config")
    raw = _checked(read_json, path, "config.json")
    if not isinstance(raw, dict):
        raise Eagle3FormatError(f"{path}: not a JSON object")
    arch = raw.get("architectures")
    if arch != [ARCHITECTURE]:
        raise Eagle3FormatError(f"config.json: 'architectures' is {arch!r}, an EAGLE-3 head "
                                f"has [{ARCHITECTURE!r}]")
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        raise Eagle3FormatError(f"config.json: 'num_hidden_layers' is {layers!r}; vlmspec reads "
                                "EAGLE-3 heads of one decoder layer (midlayer)")
    if raw.get("tie_word_embeddings"):
        raise Eagle3FormatError("config.json: 'tie_word_embeddings' is true; an EAGLE-3 head "
                                "has an lm_head of its own over its draft vocabulary")
    if raw.get("hidden_act", "silu") != "silu":
        raise Eagle3FormatError(f"config.json: 'hidden_act' is {raw['hidden_act']!r}, not 'silu'")
    for key in ("fc_norm",):
        if raw.get(key):
            raise Eagle3FormatError(f"config.json: '{key}' is set; vLLM and SGLang load no such "
                                    "head, and neither does vlmspec")
    if raw.get("norm_output", True) is not True:
        raise Eagle3FormatError("config.json: 'norm_output' is false; the engines always apply "
                                "the head's norm before lm_head")
    hidden = _int(raw, "hidden_size")
    heads = _int(raw, "num_attention_heads")
    vocab = _int(raw, "vocab_size")
    scaling = raw.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise Eagle3FormatError("config.json: 'rope_scaling' must be an object or null")
    eps = raw.get("rms_norm_eps", 1e-6)
    theta = raw.get("rope_theta", 10000.0)
    for key, value in (("rms_norm_eps", eps), ("rope_theta", theta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise Eagle3FormatError(f"config.json: '{key}' must be a positive number, not {value!r}")
    config = Eagle3Config(
        hidden_size=hidden, target_hidden_size=_int(raw, "target_hidden_size", hidden),
        intermediate_size=_int(raw, "intermediate_size"), heads=heads,
        kv_heads=_int(raw, "num_key_value_heads", heads),
        head_dim=_int(raw, "head_dim", hidden // heads),
        rms_norm_eps=float(eps), rope_theta=float(theta), rope_scaling=scaling,
        max_position_embeddings=_int(raw, "max_position_embeddings", 4096),
        vocab_size=vocab, draft_vocab_size=_int(raw, "draft_vocab_size", vocab),
        attention_bias=bool(raw.get("attention_bias", False)),
        norm_before_residual=bool(raw.get("norm_before_residual", False)), raw=raw)
    if heads % config.kv_heads:
        raise Eagle3FormatError("config.json: 'num_attention_heads' is not a multiple of "
                                "'num_key_value_heads'")
    if config.draft_vocab_size > vocab:
        raise Eagle3FormatError(f"config.json: 'draft_vocab_size' {config.draft_vocab_size} is "
                                f"larger than 'vocab_size' {vocab}")
    section = config.mrope_section
    if section is not None and (len(section) != 3 or 2 * sum(section) != config.head_dim):
        raise Eagle3FormatError(f"config.json: 'rope_scaling.mrope_section' {section} must be "
                                f"three numbers summing to head_dim / 2 = {config.head_dim // 2}")
    return config


def expected_tensors(c: Eagle3Config) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(required, optional): tensor name → shape, as the engines' loaders read them."""
    h, hd, i = c.hidden_size, c.head_dim, c.intermediate_size
    q, kv = c.heads * hd, c.kv_heads * hd
    required = {
        "fc.weight": (h, 3 * c.target_hidden_size),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (c.draft_vocab_size, h),
    }
    if c.attention_bias:
        required.update({"midlayer.self_attn.q_proj.bias": (q,),
                         "midlayer.self_attn.k_proj.bias": (kv,),
                         "midlayer.self_attn.v_proj.bias": (kv,)})
    optional = {"embed_tokens.weight": (c.vocab_size, h), "t2d": (c.vocab_size,)}
    # a draft vocabulary smaller than the target's needs its map; vLLM takes a missing d2t
    # as all zeros, which is right only when the two vocabularies are the same
    (required if c.draft_vocab_size != c.vocab_size else optional)["d2t"] = (c.draft_vocab_size,)
    return required, optional


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards an index names; pickles are never read."""
    from vlmspec_cli.runtime.models.weights_check import read_json

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _checked(read_json, index, "safetensors index")
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise Eagle3FormatError(f"{index}: not a safetensors index (no 'weight_map' object)")
        names = sorted({str(n) for n in weight_map.values()})
        files = [folder / n for n in names]
        bad = [f for f in files if f.parent != folder or not f.is_file()]
        if bad:
            raise Eagle3FormatError(f"{index}: names {bad[0].name}, which is not a file here")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    hint = f" (it holds {others[0]}: pickle weights, never read)" if others else ""
    raise Eagle3FormatError(f"{folder}: no model.safetensors{hint}")


def read_header(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor's name → (shape, dtype) from the safetensors headers, each read bounded
    and checked by runtime/models/weights_check.py (length, JSON, offsets within the file) before
    anything is loaded."""
    from vlmspec_cli.runtime.models.weights_check import safetensors_shapes

    header: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in weight_files(folder):
        for name, (dtype, shape) in _checked(safetensors_shapes, path).items():
            header[name] = (tuple(shape), dtype)
    return header


def check_tensors(c: Eagle3Config, header: dict) -> None:
    """Names and shapes exactly as the published layout has them."""
    required, optional = expected_tensors(c)
    for name in header:
        if name not in required and name not in optional:
            raise Eagle3FormatError(f"unexpected tensor '{name}' (not in the EAGLE-3 layout: "
                                    "fc, midlayer.*, norm, lm_head, d2t, t2d, embed_tokens)")
    for name, shape in required.items():
        if name not in header:
            raise Eagle3FormatError(f"missing tensor '{name}' {list(shape)}")
    for name, (shape, dtype) in header.items():
        want = {**optional, **required}[name]
        if tuple(shape) != want:
            raise Eagle3FormatError(f"tensor '{name}' has shape {list(shape)}, config.json "
                                    f"gives {list(want)}")
        if name == "d2t" and dtype not in ("I64", "I32"):
            raise Eagle3FormatError(f"tensor 'd2t' has dtype {dtype}, not an integer type")
        if name == "t2d" and dtype not in ("BOOL", "U8"):
            raise Eagle3FormatError(f"tensor 't2d' has dtype {dtype}, not bool")


def draft_to_target(c: Eagle3Config, d2t: torch.Tensor | None,
                    t2d: torch.Tensor | None) -> torch.Tensor:
    """The target id of every draft id, (V_draft,) long, checked: in range, one-to-one,
    and agreeing with ``t2d`` where it is given (nonzero(t2d) = the mapped ids)."""
    base = torch.arange(c.draft_vocab_size)
    ids = base if d2t is None else base + d2t.long()
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
        raise Eagle3FormatError(f"tensor 'd2t' maps a draft id outside the target vocabulary "
                                f"[0, {c.vocab_size})")
    if len(torch.unique(ids)) != len(ids):
        raise Eagle3FormatError("tensor 'd2t' maps two draft ids to one target id")
    if t2d is not None:
        mask = torch.zeros(c.vocab_size, dtype=torch.bool)
        mask[ids] = True
        if not torch.equal(mask, t2d.bool()):
            raise Eagle3FormatError("tensors 't2d' and 'd2t' disagree: t2d must mark exactly "
                                    "the target ids d2t maps to")
    return ids


def target_layers(c: Eagle3Config, target_layer_count: int) -> tuple[int, int, int]:
    """The target's hidden_states indices (0 = embeddings, i = after layer i) the head reads.

    * ``eagle_aux_hidden_state_layer_ids`` at the top of config.json: vLLM's own ids,
      which index a layer's *input* — hidden_states[id];
    * ``eagle_config.eagle_aux_hidden_state_layer_ids``: SpecForge's and SGLang's ids, a
      layer's *output* (SGLang captures id + 1) — hidden_states[id + 1];
    * neither: all three engines' default, hidden_states[2], [L // 2] and [L - 3].
    """
    raw = c.raw
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = raw.get("eagle_config") or {}
    if not isinstance(nested, dict):
        raise Eagle3FormatError("config.json: 'eagle_config' must be an object")
    if nested.get("use_aux_hidden_state", True) is not True:
        raise Eagle3FormatError("config.json: 'eagle_config.use_aux_hidden_state' is false "
                                "(an EAGLE-1/2 style head, not EAGLE-3)")
    given = nested.get("eagle_aux_hidden_state_layer_ids")
    if top:
        key, ids = "eagle_aux_hidden_state_layer_ids", list(top)
    elif given:
        key, ids = "eagle_config.eagle_aux_hidden_state_layer_ids", [i + 1 if isinstance(i, int) else i for i in given]
    else:
        n = target_layer_count
        key, ids = "default (2, L//2, L-3)", [2, n // 2, n - 3]
    if len(ids) != 3 or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise Eagle3FormatError(f"config.json: '{key}' must be three layer ids, not {ids}")
    if any(i < 0 or i > target_layer_count for i in ids):
        raise Eagle3FormatError(f"config.json: '{key}' gives target hidden_states {ids}, but "
                                f"the target has {target_layer_count} layers (0..{target_layer_count})")
    return tuple(ids)


def check_head_dir(folder: str | Path) -> tuple[Eagle3Config, dict]:
    """The whole check of a head directory, as the loaders expect it: config keys, then
    every tensor's name and shape. Returns (config, header)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise Eagle3FormatError(f"{folder}: not a directory")
    config = read_config(folder)
    header = read_header(folder)
    check_tensors(config, header)
    return config, header
