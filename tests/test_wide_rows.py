"""A target's verifications on its weights laid out (in, out) (runtime/fast/wide_rows.py): a CPU
target gets the copies; they run only for forwards of several new rows after the prompt and
compute what the model's layers compute (to float rounding); the prompt and plain steps
stay the modules' computation bit for bit; another device, a layer it does not know or too
large a copy keeps the modules. Losslessness end to end is what the rest of the suite checks
(test_lossless, test_draft_length, test_tree … verify on a widened CPU target)."""

from __future__ import annotations

import copy

import torch

from vlmspec_cli.runtime.fast import wide_rows
from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder
from vlmspec_cli.runtime.fast.wide_rows import WideLinear, plain_weight, wide_layers

TOL = dict(atol=2e-5, rtol=1e-5)


def _forwards(fast: FastDecoder, width: int) -> list[torch.Tensor]:
    """A prompt, a plain step, a chain's verification (4 rows), a tree's (3 rows, bool mask
    and positions) and a hidden-state read of 2 rows, on a fresh cache: each forward's
    logits; last, the cache's keys and values."""
    gen = torch.Generator().manual_seed(7)
    x = lambda n: 0.03 * torch.randn(1, n, width, generator=gen)   # noqa: E731
    allowed = torch.ones(1, 1, 3, 17, dtype=torch.bool)
    allowed[..., 14:] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs = []
    with torch.inference_mode():
        cache = fast.new_cache()
        outs.append(fast.logits(fast.run(x(9), cache)[0]))
        outs.append(fast.logits(fast.run(x(1), cache)[0]))
        outs.append(fast.logits(fast.run(x(4), cache)[0]))
        outs.append(fast.logits(fast.run(x(3), cache, attention_mask=allowed,
                                         position_ids=torch.tensor([[14, 15, 15]]))[0]))
        hidden, layer = fast.run(x(2), cache, hidden_layer=3)
        outs += [fast.logits(hidden), layer]
        outs += [cache.keys[..., : cache.length, :].clone(),
                 cache.values[..., : cache.length, :].clone()]
    return outs


def test_a_cpu_target_verifies_on_its_copies_and_steps_on_its_modules(zoo_target):
    fast = zoo_target.fast
    assert fast.wide is not None and fast.wide[1] is not None   # loaded as a CPU target
    modules = FastDecoder.for_model(zoo_target)    # the same weights, no copies
    assert modules.wide is None
    width = zoo_target.model.config.text_config.hidden_size
    rows, own = [], []    # rows each of the first layer's query projections was given
    copy_q = fast.wide[0][0].q_proj
    fast.wide[0][0].q_proj = lambda h: (rows.append(h.shape[1]), copy_q(h))[1]
    hook = fast.layers[0].self_attn.q_proj.register_forward_pre_hook(
        lambda _m, args: own.append(args[0].shape[1]))
    try:
        got = _forwards(fast, width)
    finally:
        fast.wide[0][0].q_proj = copy_q
        hook.remove()
    assert own == [9, 1] and rows == [4, 3, 2]
    want = _forwards(modules, width)
    # the prompt and the plain step: the modules' computation, bit for bit
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # several rows after the prompt: the same values up to float rounding (not bit for bit)
    for g, w in zip(got[2:], want[2:]):
        torch.testing.assert_close(g, w, **TOL)
    assert not all(torch.equal(g, w) for g, w in zip(got[2:6], want[2:6]))


def test_copies_only_where_they_apply(zoo_target, zoo_draft, monkeypatch):
    layers, head = zoo_target.fast.layers, zoo_target.fast.stack.head
    assert zoo_draft.fast.wide is None                      # a draft: packed, never widened
    assert wide_layers(layers, head, "cuda") is None        # a CPU's kernels only
    odd = copy.deepcopy(layers[0])
    odd.mlp.up_proj = torch.nn.Identity()                   # not a float nn.Linear
    assert wide_layers([odd], head, "cpu") is None
    int8 = torch.nn.Linear(4, 4)
    int8.weight = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False)
    assert plain_weight(int8, bias_ok=True) is None
    full, out = wide_layers(layers, head, "cpu")
    total = sum(layer.nbytes for layer in full)
    monkeypatch.setattr(wide_rows, "MAX_BYTES", total)      # room for the layers only
    assert wide_layers(layers, head, "cpu")[1] is None
    monkeypatch.setattr(wide_rows, "MAX_BYTES", total - 1)  # not even for them
    assert wide_layers(layers, head, "cpu") is None
    # a biased projection keeps its bias
    biased = torch.nn.Linear(6, 5)
    x = torch.randn(3, 6)
    torch.testing.assert_close(WideLinear(*plain_weight(biased, bias_ok=True))(x), biased(x), **TOL)
