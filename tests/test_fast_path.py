"""The static-cache fast path (runtime/fast/fast_decoder.py) computes what transformers' forward
computes: same logits for every kind of forward the engine makes (decoding steps, chain
verification, padded ensemble rows, tree masks, hidden states, the image model's guided
rows), same tokens end to end with the path on and off, and its cache rolls back like a
DynamicCache."""

from __future__ import annotations

import contextlib

import pytest
import torch

from conftest import fresh_scenes
from test_lossless import reference
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.profile import ProfileError, load_profile
from vlmspec_cli.runtime.adapters.base import keep_branch, truncate_cache
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.models.loading import ModelLoadError, use_fast_path
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.round.verify import SamplingParams

GREEDY = SamplingParams(0.0)


@pytest.fixture
def both_paths(zoo_target):
    """Runs ``fn(lm)`` with the fast path off and on; the fixture model is left on auto."""
    def run(fn):
        out = {}
        for mode in ("off", "on"):
            use_fast_path(zoo_target, mode)
            out[mode] = fn(zoo_target)
        use_fast_path(zoo_target, "auto")
        return out
    yield run
    use_fast_path(zoo_target, "auto")


def small_tree(past: int):
    """The 4-D mask and positions of a 4-node tree after ``past`` cached positions:
    0 -> (1, 2), 1 -> 3."""
    parents = [-1, 0, 0, 1]
    mask = torch.full((1, 1, 4, past + 4), torch.finfo(torch.float32).min)
    mask[..., :past] = 0
    depth = []
    for i in range(4):
        node, d = i, 0
        while node >= 0:
            mask[0, 0, i, past + node] = 0
            node, d = parents[node], d + 1
        depth.append(d - 1)
    return mask, torch.tensor([[past + d for d in depth]])


def _prompt_ids(lm):
    return torch.tensor([[1, 17, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]])


def test_every_kind_of_forward_matches_transformers(both_paths):
    """Decode steps, a multi-token verification, rollback then a tree mask with explicit
    positions, and a hidden layer: logits equal (to float rounding) with the path on/off."""
    def forwards(lm):
        cache = lm.adapter.new_cache(lm)
        assert isinstance(cache, StaticKVCache) == (lm.fast is not None)
        outs = [lm.adapter.prefill(lm, {"input_ids": _prompt_ids(lm)}, cache)]
        outs.append(lm.adapter.extend(lm, torch.tensor([[50]]), cache))
        outs.append(lm.adapter.extend(lm, torch.tensor([[51, 52, 53, 54, 55]]), cache))
        truncate_cache(cache, 14)
        past = 14
        mask, pos = small_tree(past)
        if lm.fast is not None:   # the fast path takes trees' masks as bool (True = visible)
            mask = mask == 0
        outs.append(lm.adapter.extend(lm, torch.tensor([[60, 61, 62, 63]]), cache,
                                      attention_mask=mask, position_ids=pos))
        keep_branch(cache, past, [past, past + 1, past + 3])
        for layer in (-2, -1, 0):   # a middle layer, the last (final-normed), the embeddings
            logits, hidden = lm.adapter.extend_hidden(lm, torch.tensor([[64]]), cache, layer)
            outs += [logits, hidden]
            truncate_cache(cache, past + 3)
        assert cache.get_seq_length() == past + 3
        return outs
    got = both_paths(forwards)
    for eager, fast in zip(got["off"], got["on"]):
        torch.testing.assert_close(fast, eager, atol=2e-5, rtol=1e-5)


def test_padded_rows_match_transformers(both_paths):
    """Left-padded rows with a 0/1 mask and per-row positions (a TABED ensemble)."""
    def rows(lm):
        cache = lm.adapter.new_cache(lm)
        embeds = lm.model.get_input_embeddings()(torch.tensor([[0, 0, 1, 17, 40], [1, 17, 40, 41, 42]]))
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        first = lm.adapter.prefill(lm, {"inputs_embeds": embeds, "attention_mask": mask,
                                        "position_ids": pos}, cache)
        ids = torch.tensor([[70, 71]]).expand(2, 2)
        mask2 = torch.cat([mask, mask.new_ones(2, 2)], dim=1)
        pos2 = torch.tensor([[3], [5]]) + torch.arange(2)[None]
        return [first, lm.adapter.extend(lm, ids, cache, attention_mask=mask2, position_ids=pos2)]
    got = both_paths(rows)
    for eager, fast in zip(got["off"], got["on"]):
        torch.testing.assert_close(fast, eager, atol=2e-5, rtol=1e-5)


def test_prompts_run_on_the_fast_path_and_equal_the_models_forward(both_paths):
    """A prompt with an image, a text prompt and one drafting row of embeddings (no mask
    or positions: it has no padding) run straight into the static cache on the fast path: same
    last logits, same hidden layer and same cached keys/values as the model's own forward.
    So do two left-padded rows (the ensemble's drafting inputs), at their real positions;
    every padding row sees at least its own position (a row that sees nothing is a softmax
    over nothing, NaN on some kernels; torch's CPU kernel gives zeros, so the mask itself is
    checked)."""
    _, image = fresh_scenes(1, seed=516)[0]

    def prompts(lm):
        prompt = lm.adapter.prompt_text(lm, [Message("user", "describe the image.", (image,))])
        with_image = lm.adapter.encode(lm, prompt, [image])
        embeds = lm.model.get_input_embeddings()(_prompt_ids(lm))
        one_row = {"inputs_embeds": embeds}     # as the ensemble passes a single row
        mask = torch.tensor([[0, 0, 0] + [1] * 9, [1] * 12])
        padded = {"inputs_embeds": torch.cat([torch.cat([torch.zeros_like(embeds[:, :3]),
                                                         embeds[:, 3:]], 1), embeds]),
                  "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}
        outs = []
        for inputs in (with_image, {"input_ids": _prompt_ids(lm)}, one_row):
            cache = lm.adapter.new_cache(lm)
            if lm.fast is not None:
                assert lm.adapter._fast_prefill(lm, inputs, lm.adapter.new_cache(lm)) is not None
            outs.append(lm.adapter.prefill(lm, inputs, cache))
            n = cache.get_seq_length()
            keys, values = (cache.keys[:, 0, :, :n], cache.values[:, 0, :, :n]) if lm.fast else (
                torch.stack([layer.keys[0] for layer in cache.layers]),
                torch.stack([layer.values[0] for layer in cache.layers]))
            outs += [keys, values]
            outs += list(lm.adapter.prefill_hidden(lm, inputs, lm.adapter.new_cache(lm), -3))
        cache = lm.adapter.new_cache(lm)
        if lm.fast is not None:
            assert lm.adapter._fast_prefill(lm, padded, lm.adapter.new_cache(lm)) is not None
            seen = lm.fast._visible(mask, 12, 0, embeds.device)   # (2, 1, 12, 12), True = seen
            assert seen.any(-1).all() and torch.equal(seen[1, 0], torch.ones(12, 12).tril().bool())
            # attention gets it additive, as torch makes a bool mask: 0 seen, -inf not
            additive = lm.fast._mask(mask, 2, 12, 0, embeds)
            assert additive.dtype == embeds.dtype and torch.equal(additive == 0, seen)
            assert torch.isneginf(additive[~seen]).all()
        outs.append(lm.adapter.prefill(lm, padded, cache))
        for row in (0, 1):
            real = mask[row].bool()
            if lm.fast is not None:
                keys, values = (cache.keys[:, row, :, :12][:, :, real],
                                cache.values[:, row, :, :12][:, :, real])
                assert not cache.keys[:, row, :, :12].isnan().any()
            else:
                keys = torch.stack([layer.keys[row][:, real] for layer in cache.layers])
                values = torch.stack([layer.values[row][:, real] for layer in cache.layers])
            outs += [keys, values]
        return outs
    got = both_paths(prompts)
    for eager, fast in zip(got["off"], got["on"]):
        torch.testing.assert_close(fast, eager, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_tokens_equal_target_greedy_with_the_path_off_and_on(zoo_target, zoo_draft, method):
    """The losslessness check of test_lossless/test_tree, run with both paths on both
    models, against transformers' own generate()."""
    requests = [Request([Message("user", "describe the image.", (image,))], max_new_tokens=24)
                for _, image in fresh_scenes(4, seed=515)]
    refs = [reference(zoo_target, r) for r in requests]
    kwargs = {"depth": 4, "top_k": 3, "total_tokens": 12,
              "eos_ids": eos_token_ids(zoo_target)} if method == "tree" else {}
    try:
        for mode in ("off", "on"):
            use_fast_path(zoo_target, mode)
            use_fast_path(zoo_draft, mode)
            drafter = create_drafter(method, draft=zoo_draft, sampling=GREEDY,
                                     drafting_input="multimodal",
                                     image_token=zoo_target.adapter.image_token(zoo_target), **kwargs)
            engine = SpeculativeEngine(zoo_target, drafter, 4, GREEDY)
            accepted = 0
            for req, ref in zip(requests, refs):
                res = engine.generate(req)
                assert res.tokens == ref, f"fast_path {mode}: differs from generate()"
                assert isinstance(res.state.target_cache, StaticKVCache) == (mode == "on")
                accepted += res.state.stats.num_accepted_tokens
            assert accepted > 0
    finally:
        use_fast_path(zoo_target, "auto")
        use_fast_path(zoo_draft, "auto")


def test_static_cache_rolls_back_and_keeps_a_branch_in_place():
    cache = StaticKVCache(2, 1, 1, 2, 0, "cpu", torch.float32, headroom=4)

    class Layer:
        def __init__(self, n):
            self.keys = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).repeat(1, 1, 1, 2)
            self.values = -self.keys

    class Eager:
        layers = [Layer(6), Layer(6)]

        def get_seq_length(self):
            return 6
    cache.load(Eager())
    assert cache.length == 6 and cache.capacity == 10
    buffer = cache.keys
    cache.crop(-2)
    assert cache.get_seq_length() == 4
    cache.length = 8        # pretend a tree of 4 nodes was written at 4..7
    with torch.inference_mode():   # as the fast path writes it
        cache.keys[:, :, :, 4:8] = torch.tensor([40., 50., 60., 70.]).view(1, 1, 4, 1)
    cache.keep_positions(4, [5, 7])
    assert cache.length == 6
    assert cache.keys[0, 0, 0, :6, 0].tolist() == [0, 1, 2, 3, 50, 70]
    assert cache.keys is buffer and cache.grown == 0      # moved in place, no reallocation
    cache.reserve(10)
    assert cache.grown == 1 and cache.keys[0, 0, 0, :6, 0].tolist() == [0, 1, 2, 3, 50, 70]


def test_sessions_size_caches_so_none_reallocates(zoo_target):
    from vlmspec_cli.session import build_session
    session = build_session(load_profile("tinyworld-caption", ["method=tree",
                                                               "generation.max_new_tokens=24"]))
    _, image = fresh_scenes(1, seed=77)[0]
    res = session.engine.generate(Request([Message("user", "describe the image.", (image,))],
                                          max_new_tokens=24))
    assert isinstance(res.state.target_cache, StaticKVCache)
    assert res.state.target_cache.grown == 0
    assert "fast path (static cache): target, draft" in session.fast_path_summary()


def test_fast_path_key_is_checked_and_on_refuses_a_model_it_cannot_take():
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import load_model
    with pytest.raises(ProfileError, match="runtime.fast_path"):
        load_profile("tinyworld-caption", ["runtime.fast_path=fast"])
    lm = load_model(ModelSpec(model="zoo:tinyworld/llava-draft", device="cpu"), "draft")
    assert lm.fast is not None
    lm.adapter.text_stack(lm).config.rope_parameters = {"rope_type": "linear", "factor": 2.0,
                                                        "rope_theta": 10000.0}
    with pytest.raises(ModelLoadError, match="runtime.fast_path: on: rotary type 'linear'"):
        use_fast_path(lm, "on", "draft")
    use_fast_path(lm, "auto", "draft")
    assert lm.fast is None and "linear" in lm.fast_off_reason


def test_video_target_and_hidden_head_equal_transformers(zoo_target):
    """The Qwen2.5-VL video target (3-D positions folded by its rotary module): the hidden
    head on the fast path gives the tokens of target-only decoding through transformers."""
    import random

    from vlmspec_cli.session import build_session
    from vlmspec_cli.tasks.video_io import clip_from_arrays
    from vlmspec_cli.zoo import video as world
    eager = build_session(load_profile("tinyworld-video", ["method=none", "runtime.fast_path=off"]))
    fast = build_session(load_profile("tinyworld-video", ["hidden.tree=true"]))
    assert eager.target.fast is None and fast.target.fast is not None
    assert "transformers' forward: target (runtime.fast_path is off)" in eager.fast_path_summary()
    accepted = 0
    for seed, frames in ((920_001, 4), (920_002, 8)):
        script = world.random_script(random.Random(seed))
        clip = clip_from_arrays(world.render_script(script, frames), fps=frames / world.DURATION)
        req = Request([Message("user", world.QUESTIONS[seed % 3], videos=(clip,))], max_new_tokens=32)
        res = fast.engine.generate(req)
        assert res.tokens == eager.engine.generate(req).tokens
        assert isinstance(res.state.target_cache, StaticKVCache)
        accepted += res.state.stats.num_accepted_tokens
    assert accepted > 0


def test_draft_blocks_compute_what_their_transformers_forward_computes(zoo_target):
    """The hidden-state head's layers and the twig's own layers (blocks with no model of
    their own) on the fast path: a prompt, a causal step and a tree-masked step give the
    outputs of the head's own forward / the twig's transformers layers."""
    from transformers import DynamicCache

    from vlmspec_cli.runtime.adapters.base import TextStack
    from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder
    from vlmspec_cli.runtime.models.loading import load_hidden_head, load_twig
    from vlmspec_cli.runtime.fast.trunk import chunk_mask

    torch.manual_seed(3)
    head = load_hidden_head("zoo:tinyworld/llava-hidden", zoo_target)
    twig = load_twig("zoo:tinyworld/llava-twig", zoo_target)
    rotary = zoo_target.adapter.text_stack(zoo_target).rotary
    twig_stack = TextStack(None, twig.model.layers, twig.model.norm, rotary, twig.lm_head,
                           twig.config)
    def twig_layers(z, pos, cache, mask):
        pe = rotary(z, pos)
        if mask is None:
            mask = chunk_mask(z.shape[1], cache.get_seq_length(), z.dtype, z.device)
        for layer in twig.model.layers:
            z = layer(z, attention_mask=mask, position_ids=pos, past_key_values=cache,
                      use_cache=True, position_embeddings=pe)
        return twig.model.norm(z)

    blocks = {"head": (FastDecoder(head.decoder_stack(), "cpu", head.dtype), head.layers_only),
              "twig": (FastDecoder(twig_stack, "cpu", twig.dtype), twig_layers)}
    width = head.config.hidden_size
    prompt, step = torch.randn(1, 9, width), torch.randn(1, 1, width)
    nodes = torch.randn(1, 3, width)
    tree_pos = torch.tensor([[10, 11, 11]])
    allowed = torch.ones(3, 13, dtype=torch.bool)
    allowed[:, 10:] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    additive = torch.zeros(1, 1, 3, 13).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    for name, (fast, eager) in blocks.items():
        with torch.inference_mode():
            cache, static = DynamicCache(), fast.new_cache()
            want = [eager(prompt, torch.arange(9)[None], cache, None),
                    eager(step, torch.tensor([[9]]), cache, None),
                    eager(nodes, tree_pos, cache, additive)]
            got = [fast.run(prompt, static)[0], fast.run(step, static)[0],
                   fast.run(nodes, static, attention_mask=allowed[None, None],
                            position_ids=tree_pos)[0]]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5, msg=name)
        assert static.length == 13 and static.grown == 0



def test_the_engine_prefills_and_decodes_at_their_own_thread_counts(zoo_target, zoo_draft):
    """runtime.prefill_threads while the prompt runs, runtime.threads for the rounds (the
    target-only engine too), read off the target's first layer as it runs on the fast
    path; the tokens equal generate()'s."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.session import build_session

    profile = load_profile(None, ["runtime.threads=1", "runtime.prefill_threads=2"],
                           cli={"target.device": "cpu", "draft.device": "cpu"})
    session = build_session(profile, target=zoo_target)
    assert "CPU threads: 1 decoding, 2 prefilling" in session.fast_path_summary()
    _, image = fresh_scenes(1, seed=517)[0]
    request = Request([Message("user", "describe the image.", (image,))], max_new_tokens=12)
    expected = reference(zoo_target, request)
    seen = []   # (rows the first layer's query projection ran, threads at that moment)
    with first_layer_watch(zoo_target, lambda x: seen.append((x.shape[1], torch.get_num_threads()))):
        for engine in (session.engine, session.baseline_engine()):
            seen.clear()
            res = engine.generate(request)
            assert res.tokens == expected
            prompt = zoo_target.adapter.prompt_length(zoo_target, res.state.prompt, [image])
            assert seen[0] == (prompt, 2) and all(t == 1 for _, t in seen[1:]) and len(seen) > 1


@contextlib.contextmanager
def first_layer_watch(lm, record):
    """``record(x)`` before the target's first layer projects its queries from x: by the
    layer's own module (the prompt, plain steps) or its (in, out) copy (verifications on a
    CPU, runtime/fast/wide_rows.py)."""
    q_proj = lm.adapter.text_stack(lm).layers[0].self_attn.q_proj
    hook = q_proj.register_forward_pre_hook(lambda _m, args: record(args[0]))
    wide = lm.fast.wide[0][0] if lm.fast is not None and lm.fast.wide else None
    own = wide and wide.q_proj
    if wide:
        wide.q_proj = lambda x: (record(x), own(x))[1]
    try:
        yield
    finally:
        hook.remove()
        if wide:
            wide.q_proj = own


def test_a_finished_requests_cache_buffers_serve_the_next_request(zoo_target, zoo_draft):
    """The target cache's buffers go back to the decoder's pool when a request ends and the
    next request decodes in them: its tokens still equal generate()'s although the buffers
    hold the previous (longer) request's keys past every position it writes (the first
    prompt is the longest, so its buffer has room for the others). A recycled
    cache refuses to grow; the pool hands a buffer to one cache at a time."""
    use_fast_path(zoo_target, "on")
    use_fast_path(zoo_draft, "on")
    drafter = create_drafter("chain", draft=zoo_draft, sampling=GREEDY,
                             drafting_input="multimodal",
                             image_token=zoo_target.adapter.image_token(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, 4, GREEDY)
    pool = zoo_target.fast.pool
    pointers = []
    for (_, image), (prompt, n) in zip(fresh_scenes(3, seed=4242),
                                       (("what is in the image? describe it.", 40),
                                        ("describe the image.", 12), ("what is in the image?", 24))):
        req = Request([Message("user", prompt, (image,))], max_new_tokens=n)
        res = engine.generate(req)
        assert res.tokens == reference(zoo_target, req)
        cache = res.state.target_cache
        assert cache.recycled and cache.capacity == 0 and cache.length > 0
        (keys, values), = pool._spare.values()
        pointers.append(keys.data_ptr())
        with pytest.raises(RuntimeError, match="recycled"):
            cache.reserve(1)
    assert len(set(pointers)) == 1          # one buffer pair served all three requests
    spare = pool.take(keys, keys.shape[3] + 1)
    assert spare is None                    # too small for the room asked: not handed out
    assert pool.take(keys, 8)[0] is keys and pool.take(keys, 8) is None   # one taker only
    pool.give(keys, values)


@pytest.mark.parametrize("room", [0, 1])
def test_a_long_prompt_decodes_at_the_prefill_thread_count(zoo_target, zoo_draft, room):
    """runtime.long_context: a prompt of at least that many positions runs its rounds at
    runtime.prefill_threads too (a long video's attention is compute for every core); one
    position shorter and they run at runtime.threads. The tokens equal generate()'s."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.session import build_session

    _, image = fresh_scenes(1, seed=518)[0]
    request = Request([Message("user", "describe the image.", (image,))], max_new_tokens=12)
    prompt = zoo_target.adapter.prompt_length(
        zoo_target, zoo_target.adapter.prompt_text(zoo_target, request.messages), [image])
    profile = load_profile(None, ["runtime.threads=1", "runtime.prefill_threads=2",
                                  f"runtime.long_context={prompt + room}"],
                           cli={"target.device": "cpu", "draft.device": "cpu"})
    session = build_session(profile, target=zoo_target)
    assert f"1 decoding (2 from {prompt + room} positions)" in session.fast_path_summary()
    seen = []
    with first_layer_watch(zoo_target, lambda _x: seen.append(torch.get_num_threads())):
        res = session.engine.generate(request)
    assert res.tokens == reference(zoo_target, request) and len(seen) > 2
    assert seen[0] == 2 and set(seen[1:]) == ({2} if room == 0 else {1})
    with pytest.raises(ProfileError, match="runtime.long_context"):
        load_profile(None, ["runtime.long_context=0"])
