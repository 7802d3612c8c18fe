"""``twig`` self-speculation (TwigVLM): lossless without pruning, shared first-K layers run
once per token, twig-guided pruning keeps exactly what it is asked to."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import fresh_scenes
from test_lossless import reference
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.drafters.twig import PrunePlan, select_visual_rows
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.models.loading import load_twig
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import SessionError, build_session, validate_method
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.fast.trunk import mean_retained_tokens
from vlmspec_cli.runtime.round.verify import SamplingParams
from vlmspec_cli.zoo import world

GREEDY = SamplingParams(0.0)
TWIG = "zoo:tinyworld/llava-twig"


@pytest.fixture(scope="module")
def zoo_twig(zoo_target):
    return load_twig(TWIG, zoo_target)


@pytest.fixture(scope="module")
def corpus(zoo_target):
    """Fresh scenes with caption prompts and questions, a two-image request, a second turn
    and a text-only request, each with its target-greedy reference."""
    rng = random.Random(4242)
    reqs = []
    for i, (scene, image) in enumerate(fresh_scenes(8, seed=777)):
        prompt = world.CAPTION_PROMPTS[i % 3] if i % 2 == 0 else rng.choice(world.qa_pairs(scene, rng))[0]
        reqs.append(Request([Message("user", prompt, (image,))], max_new_tokens=40))
    (_, a), (_, b) = fresh_scenes(2, seed=778)
    reqs.append(Request([Message("user", "what changed between the two images?", (a, b))], max_new_tokens=40))
    reqs.append(Request([Message("user", "describe the image.", (a,)),
                         Message("assistant", "a red circle."),
                         Message("user", "what colour is the background?")], max_new_tokens=20))
    reqs.append(Request([Message("user", "say something about shapes.")], max_new_tokens=30))
    return [(r, reference(zoo_target, r)) for r in reqs]


def _run(engine, corpus):
    drafted = accepted = 0
    for req, ref in corpus:
        res = engine.generate(req)
        assert res.tokens == ref, f"differs from target greedy on {req.messages[-1].text!r}"
        s = res.state.stats
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts
        assert sum(s.accept_len_hist) == s.num_drafts
        drafted += s.num_draft_tokens
        accepted += s.num_accepted_tokens
    return accepted / drafted


@pytest.mark.parametrize("threshold", [0.0, 0.6])
@pytest.mark.parametrize("gamma", [1, 5])
def test_twig_equals_target_greedy(zoo_target, zoo_twig, corpus, threshold, gamma):
    drafter = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2, twig=zoo_twig,
                             threshold=threshold)
    rate = _run(SpeculativeEngine(zoo_target, drafter, gamma, GREEDY), corpus)
    assert rate > 0.2, "the twig should propose tokens the target accepts"


@pytest.mark.parametrize("mode", ["off", "on"])
def test_twig_trunk_on_and_off_the_fast_path(zoo_target, zoo_twig, corpus, mode):
    """The split trunk over transformers' cache (off) and over static segments (on), with
    pruning segments too: the same tokens as target greedy / the pruned target."""
    from vlmspec_cli.runtime.models.loading import use_fast_path
    from vlmspec_cli.runtime.static_cache import StaticKVCache
    from vlmspec_cli.runtime.fast.trunk import SegmentedCache
    try:
        use_fast_path(zoo_target, mode)
        drafter = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2,
                                 twig=zoo_twig, threshold=0.6)
        _run(SpeculativeEngine(zoo_target, drafter, 5, GREEDY), corpus[:4])
        res = SpeculativeEngine(zoo_target, drafter, 5, GREEDY).generate(corpus[0][0])
        assert isinstance(res.state.target_cache, SegmentedCache) == (mode == "on")
        if mode == "on":   # its segments' buffers went back to the pool: _run's requests
            # above decoded in each other's buffers, each equal to target greedy
            assert all(seg.recycled for seg in res.state.target_cache.segments)
        # the twig's own layers follow the target onto the fast path
        assert isinstance(res.state.drafter_state.twig_cache, StaticKVCache) == (mode == "on")

        def pruned():
            return create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2,
                                  twig=zoo_twig, threshold=0.6,
                                  prune=PrunePlan(keep=4, final_wipe=5))
        engine = SpeculativeEngine(zoo_target, pruned(), 5, GREEDY)
        for req, _ in corpus[:3]:
            assert engine.generate(req).tokens == _pruned_target_greedy(pruned(), zoo_target, req)
    finally:
        use_fast_path(zoo_target, "auto")


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("threshold", [0.0, 0.6])
def test_layer_skip_equals_target_greedy(zoo_target, corpus, k, threshold):
    drafter = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=k, threshold=threshold)
    _run(SpeculativeEngine(zoo_target, drafter, 4, GREEDY), corpus)


def test_early_exit_shortens_drafts(zoo_target, zoo_twig, corpus):
    """θ = 0 always drafts δ tokens; θ close to 1 stops after the first unsure token."""
    req, _ = corpus[0]
    lengths = {}
    for theta in (0.0, 0.99):
        d = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2, twig=zoo_twig,
                           threshold=theta)
        s = SpeculativeEngine(zoo_target, d, 5, GREEDY).generate(req).state.stats
        lengths[theta] = s.num_draft_tokens / s.num_drafts
    assert lengths[0.99] < lengths[0.0]


class LayerRows:
    """Counts the rows (tokens) each decoder layer processes, via forward hooks on its
    first norm (the fast path calls a layer's modules, not the layer's own forward)."""

    def __init__(self, layers):
        self.rows = [0] * len(layers)
        self.hooks = [layer.input_layernorm.register_forward_hook(self._hook(i))
                      for i, layer in enumerate(layers)]

    def _hook(self, i):
        def hook(_module, args, _output):
            self.rows[i] += args[0].shape[1]
        return hook

    def remove(self):
        for h in self.hooks:
            h.remove()


@pytest.mark.parametrize("use_twig", [True, False])
def test_first_k_layers_run_once_per_token(zoo_target, zoo_twig, corpus, use_twig):
    """Every token goes through each shared layer exactly once: as many rows pass layers[:K]
    as layers[K:] (a draft that recomputed them for verification would double the count),
    and that is the prompt plus every token fed for verification."""
    k = 2
    layers = zoo_target.model.model.language_model.layers
    d = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=k,
                       twig=zoo_twig if use_twig else None, threshold=0.0)
    engine = SpeculativeEngine(zoo_target, d, 5, GREEDY)
    req, _ = corpus[1]
    prompt_len = zoo_target.adapter.prompt_embeds(zoo_target, zoo_target.adapter.prompt_text(
        zoo_target, req.messages), req.images)[0].shape[1]
    counter = LayerRows(layers)
    try:
        res = engine.generate(req)
    finally:
        counter.remove()
    s = res.state.stats
    fed = s.num_draft_tokens + s.num_drafts - 1  # pending + proposals per round; round 1 has no pending
    assert counter.rows == [prompt_len + fed] * len(layers)
    assert s.num_accepted_tokens > 0
    # every layer's cache holds the prompt and the committed tokens but the last
    cache = res.state.target_cache
    assert [cache.get_seq_length(i) for i in range(len(layers))] == \
        [prompt_len + len(res.tokens) - 1] * len(layers)


def test_pruning_keeps_r_tokens_and_wipes_after_kf(zoo_target, zoo_twig, corpus):
    layers = zoo_target.model.model.language_model.layers
    plan = PrunePlan(keep=3, layer=3, final_wipe=6)
    d = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2, twig=zoo_twig,
                       threshold=0.6, prune=plan)
    assert d.lossless is False
    engine = SpeculativeEngine(zoo_target, d, 5, GREEDY)
    req, _ = corpus[0]
    state = engine.start(req)
    cache = state.target_cache
    s = cache.get_seq_length(0)
    m = 9  # one 3x3 tinyworld image
    expected = [s] * 3 + [s - m + 3] * 3 + [s - m] * 2
    assert [cache.get_seq_length(i) for i in range(len(layers))] == expected
    unpruned = SpeculativeEngine(zoo_target, create_drafter("twig", target=zoo_target, sampling=GREEDY,
                                 layers=2, twig=zoo_twig), 5, GREEDY).start(req)
    assert not torch.allclose(state.target_next_logits, unpruned.target_next_logits, atol=1e-4)
    res = engine.generate(req)
    rep = res.state.stats.pruning
    assert rep == {"visual_tokens": 9, "kept": 3, "layer": 3, "final_wipe": 6, "num_layers": 8,
                   "mean_retained": round((9 * 3 + 3 * 3) / 8, 3)}
    assert res.state.stats.to_dict()["pruning"] == rep
    assert res.tokens, "pruned decoding still produces output"


def test_turning_pruning_off_restores_losslessness(zoo_target, zoo_twig, corpus):
    """After a pruned run on the same twig (which switched it to eager attention), an empty
    prune plan is lossless again and decodes exactly the target's greedy output."""
    pruned = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2, twig=zoo_twig,
                            prune=PrunePlan(keep=2, final_wipe=5))
    req, ref = corpus[0]
    assert SpeculativeEngine(zoo_target, pruned, 5, GREEDY).generate(req).tokens != ref
    off = create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2, twig=zoo_twig,
                         threshold=0.6, prune=PrunePlan())
    assert off.lossless is True
    _run(SpeculativeEngine(zoo_target, off, 5, GREEDY), corpus)


def _pruned_target_greedy(drafter, target, req) -> list[int]:
    """The pruned target decoding alone, one token per forward: the drafter's pruned
    prefill, then layers[:K] and layers[K:] on each new token — no drafts."""
    state = DecodeState(req, prompt=target.adapter.prompt_text(target, req.messages))
    drafter.prefill(state)
    eos = target.tokenizer.eos_token_id
    out = [int(state.target_next_logits.argmax())]
    while len(out) < req.max_new_tokens and out[-1] != eos:
        logits = drafter.extend_target(state, torch.tensor([[out[-1]]]))
        out.append(int(logits[0, -1].argmax()))
    return out


@pytest.mark.parametrize("plan", [dict(keep=2), dict(keep=4, final_wipe=5), dict(final_wipe=3)])
def test_pruned_speculation_equals_pruned_target(zoo_target, zoo_twig, corpus, plan):
    """Pruning changes the target; speculation on top of it changes nothing more."""
    def drafter():
        return create_drafter("twig", target=zoo_target, sampling=GREEDY, layers=2, twig=zoo_twig,
                              threshold=0.6, prune=PrunePlan(**plan))
    engine = SpeculativeEngine(zoo_target, drafter(), 5, GREEDY)
    for req, _ in corpus[:6]:
        assert engine.generate(req).tokens == _pruned_target_greedy(drafter(), zoo_target, req)


def test_select_visual_rows_ranks_by_text_attention():
    visual = torch.tensor([False, True, True, True, True, False, False])
    att = torch.zeros(1, 2, 7, 7)
    att[0, :, 5, 3] = 0.9   # text rows attend most to visual row 3, then 1
    att[0, :, 6, 1] = 0.5
    att[0, :, 6, 4] = 0.1
    att[0, :, 0, 2] = 5.0   # only text rows after the image count (a row before it cannot
    att[0, :, 2, 2] = 9.0   # see it), and visual rows' own attention never does
    keep = select_visual_rows(att, visual, 2)
    assert keep.tolist() == [True, True, False, True, False, True, True]
    assert select_visual_rows(att, visual, 10).all()


def test_mean_retained_tokens_is_eq6():
    assert mean_retained_tokens(576, 41, 2, 24, 32) == pytest.approx(64, abs=0.5)  # Table 6
    assert mean_retained_tokens(576, 134, 2, 24, 32) == pytest.approx(128, abs=0.5)


@pytest.mark.parametrize("sets,needle", [
    (["method=chain", "prune.keep=3"], "method 'twig' only"),
    (["method=twig", "twig.model=none"], "needs twig.layers"),
    (["method=twig", "twig.model=none", "twig.layers=2", "prune.keep=3"], "needs a twig"),
])
def test_profile_checks_before_loading(sets, needle):
    with pytest.raises(SessionError, match=needle):
        validate_method(load_profile(None, overrides=sets))


@pytest.mark.parametrize("sets,needle", [
    (["twig.layers=3"], "trained on layer 2"),
    (["prune.keep=3", "prune.layer=1"], "prune.layer must be"),
    (["prune.keep=3", "prune.final_wipe=9"], "prune.final_wipe must be"),
    (["twig.model=none", "twig.layers=8"], "between 1 and 7"),
])
def test_session_rejects_bad_twig_settings(sets, needle):
    prof = load_profile("tinyworld-twig", overrides=sets + ["target.device=cpu"])
    with pytest.raises(SessionError, match=needle):
        build_session(prof)


@pytest.fixture(scope="module")
def qwen2_target(tmp_path_factory):
    """A Qwen2-family causal LM (random, tinyworld tokenizer), loaded like a user's model."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import ZOO_ROOT, load_model

    path = tmp_path_factory.mktemp("qwen2")
    tok = AutoTokenizer.from_pretrained(ZOO_ROOT / "tinyworld" / "llava-target")
    torch.manual_seed(5)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                      pad_token_id=tok.pad_token_id, initializer_range=0.2)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return load_model(ModelSpec(model=str(path), device="cpu"), "target")


@pytest.mark.parametrize("with_twig", [False, True])
def test_twig_on_a_qwen2_target_equals_greedy(qwen2_target, with_twig):
    from transformers import Qwen2ForCausalLM

    twig = None
    if with_twig:  # an untrained twig: proposals are poor, output must still be exact
        torch.manual_seed(6)
        cfg = {**qwen2_target.model.config.to_dict(), "num_hidden_layers": 1}
        cfg.pop("layer_types", None)
        twig = Qwen2ForCausalLM(type(qwen2_target.model.config)(**cfg)).eval()
    drafter = create_drafter("twig", target=qwen2_target, sampling=GREEDY, layers=2, twig=twig,
                             threshold=0.0)
    engine = SpeculativeEngine(qwen2_target, drafter, 4, GREEDY)
    for text in ("describe the image.", "what colour is the circle?", "a red square and"):
        req = Request([Message("user", text)], max_new_tokens=24)
        assert engine.generate(req).tokens == reference(qwen2_target, req)


def test_cli_twig_records_and_pruning_marks_lossy(tmp_path):
    """Through the CLI: twig output equals target-only (--compare checks it and counts
    mismatches into the exit code), and pruning makes the record say lossless: false."""
    import json

    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    for i, (_, image) in enumerate(fresh_scenes(2, seed=4321)):
        image.save(tmp_path / f"s{i}.png")
    base = ["caption", str(tmp_path), "--profile", "tinyworld-twig", "--json", "-q",
            "--max-new-tokens", "24"]
    res = CliRunner().invoke(cli, base + ["--compare"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    assert len(recs) == 2
    assert all(r["method"] == "twig" and r["lossless"] is True and r["error"] is None for r in recs)
    assert all(r["drafting_inputs"] == [] and "pruning" not in r["stats"] for r in recs)

    res = CliRunner().invoke(cli, base + ["--set", "prune.keep=3", "--set", "prune.final_wipe=6"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    assert all(r["lossless"] is False and r["stats"]["pruning"]["kept"] == 3 for r in recs)

    res = CliRunner().invoke(cli, base + ["--set", "prune.keep=3", "--method", "chain"])
    assert res.exit_code == 2 and "method 'twig' only" in res.output
