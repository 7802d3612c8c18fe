"""Packed draft layers (runtime/fast/packed_layers.py): a draft's steps in fewer operators compute
what its eager layers compute (to float rounding) for every kind of forward a draft makes;
only drafts are packed, never a target; a layer it does not know exactly keeps the eager
path. Losslessness with packed drafts is what the rest of the suite checks end to end
(test_lossless, test_draft_length, test_tree … all run their drafts packed)."""

from __future__ import annotations

import pytest
import torch

from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder
from vlmspec_cli.runtime.fast.packed_layers import pack_layers

TOL = dict(atol=5e-5, rtol=1e-4)


def _forwards(fast: FastDecoder, width: int):
    """Every kind of forward a draft makes, on a fresh cache: a prompt, a step, a chain of
    3, tree nodes with a bool mask and positions, a hidden-state read; then two left-padded
    rows with a padding mask and per-row positions. Outputs and the caches' contents."""
    gen = torch.Generator().manual_seed(5)
    # at the scale of a small model's token embeddings (mean square ~1e-3), where a norm's
    # ε (1e-6) still shows: dropping it moved a draft's outputs by 1e-3 of their size
    x = lambda *shape: 0.03 * torch.randn(*shape, width, generator=gen)   # noqa: E731
    allowed = torch.ones(1, 1, 3, 16, dtype=torch.bool)
    allowed[..., 13:] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs = []
    with torch.inference_mode():
        cache = fast.new_cache()
        outs.append(fast.run(x(1, 9), cache)[0])
        outs.append(fast.run(x(1, 1), cache)[0])
        outs.append(fast.run(x(1, 3), cache)[0])
        outs.append(fast.run(x(1, 3), cache, attention_mask=allowed,
                             position_ids=torch.tensor([[13, 14, 14]]))[0])
        outs += list(fast.run(x(1, 2), cache, hidden_layer=(0, 1, -1)))
        keys, values = cache.keys[..., : cache.length, :], cache.values[..., : cache.length, :]
        rows = fast.new_cache(2)
        pad = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        positions = (pad.cumsum(-1) - 1).clamp(min=0)
        prompt = fast.run(x(2, 5), rows, attention_mask=pad, position_ids=positions)[0]
        outs += [prompt[0, 2:], prompt[1]]       # (a padding row's output is not read)
        chunk = torch.cat([pad, torch.ones(2, 2, dtype=pad.dtype)], -1)
        outs.append(fast.run(x(2, 2), rows, attention_mask=chunk,
                             position_ids=torch.tensor([[3, 4], [5, 6]]))[0])
    return outs, (keys.clone(), values.clone())


def test_a_packed_draft_computes_what_its_eager_layers_compute(zoo_draft):
    assert zoo_draft.fast.packed is not None      # loaded as a draft: packed
    eager = FastDecoder.for_model(zoo_draft)      # the same weights, op for op the eager layers
    assert eager.packed is None
    width = zoo_draft.model.config.text_config.hidden_size
    got, got_cache = _forwards(zoo_draft.fast, width)
    want, want_cache = _forwards(eager, width)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    # the cache holds the keys (rotary applied) and values the eager layers write
    torch.testing.assert_close(got_cache, want_cache, **TOL)


def test_draft_blocks_without_a_model_are_packed_too(zoo_target):
    """The hidden-state head's and the twig's own layers (fast_decoder.follow_target)."""
    from vlmspec_cli.runtime.adapters.base import TextStack
    from vlmspec_cli.runtime.fast.fast_decoder import follow_target
    from vlmspec_cli.runtime.models.loading import load_hidden_head, load_twig

    head = load_hidden_head("zoo:tinyworld/llava-hidden", zoo_target)
    twig = load_twig("zoo:tinyworld/llava-twig", zoo_target)
    rotary = zoo_target.adapter.text_stack(zoo_target).rotary
    blocks = [(head.decoder_stack, head.config.layer_config(), head.dtype),
              (lambda: TextStack(None, twig.model.layers, twig.model.norm, rotary, twig.lm_head,
                                 twig.config), twig.config, twig.dtype)]
    for make_stack, config, dtype in blocks:
        packed = follow_target(zoo_target, None, make_stack, config, dtype)
        assert packed is not None and packed.packed is not None
        width = config.hidden_size
        got, _ = _forwards(packed, width)
        want, _ = _forwards(FastDecoder(make_stack(), "cpu", dtype), width)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOL)


def test_a_draft_stays_packed_when_its_fast_path_is_switched(zoo_draft):
    """A model remembers what it was loaded as: switching a draft's fast path off and on
    (tests, profiles that set it) gives it packed layers again."""
    from vlmspec_cli.runtime.models.loading import use_fast_path

    try:
        use_fast_path(zoo_draft, "off")
        assert zoo_draft.fast is None
        use_fast_path(zoo_draft, "on")
        assert zoo_draft.fast.packed is not None
    finally:
        use_fast_path(zoo_draft, "auto")


def test_a_target_is_never_packed(zoo_target):
    """The target's steps decide the output: they stay the eager computation op for op, in
    sessions as loaded alone."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.session import build_session

    assert zoo_target.fast is not None and zoo_target.fast.packed is None
    session = build_session(load_profile("tinyworld-caption", ["drafting.length=fixed"]))
    assert session.engine.target.fast.packed is None
    assert session.engine.drafter.draft.fast.packed is not None


def _tiny_layers(kind: str):
    from transformers import LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    small = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=16)
    if kind == "qwen3":
        config = Qwen3Config(**small)
        return torch.nn.ModuleList([Qwen3DecoderLayer(config, 0)]), config
    config = LlamaConfig(**small, mlp_bias=kind == "mlp bias")
    return torch.nn.ModuleList([LlamaDecoderLayer(config, 0)]), config


@pytest.mark.parametrize("kind", ["qwen3", "mlp bias", "quantized", "half", "gelu"])
def test_layers_it_does_not_pack_exactly_keep_the_eager_path(kind):
    layers, config = _tiny_layers(kind)
    dtype = torch.float32
    if kind == "quantized":   # a bitsandbytes-style layer: an nn.Linear subclass
        class Linear4bit(torch.nn.Linear):
            pass
        old = layers[0].mlp.down_proj
        layers[0].mlp.down_proj = Linear4bit(old.in_features, old.out_features, bias=False)
    elif kind == "half":
        dtype = torch.float16
    elif kind == "gelu":
        config.hidden_act = "gelu"
    assert pack_layers(layers, config, dtype) is None
    plain, plain_config = _tiny_layers("llama")
    assert pack_layers(plain, plain_config, torch.float32) is not None
