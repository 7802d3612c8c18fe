"""``eagle3``: published EAGLE-3 heads, written here in the layout SpecForge exports and
vLLM / SGLang load (tests/eagle3_heads.py), random and with a draft vocabulary smaller than
the target's, on tiny LLaVA, Qwen2.5-VL and Qwen3-VL targets.

At T = 0 chains and trees decode what the target's own generate() decodes (single images,
a two-turn chat with an image per turn); at T > 0 the emitted tokens follow the target's
exact law (chi-square), through the head's draft vocabulary; the CLI captions, describes a
video and answers a --chat conversation with --compare; a head whose names, shapes or
vocabulary map are not the published ones is refused in one line naming the key."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from conftest import ROOT, assert_first_two_follow
from eagle3_heads import eagle3_head, head_config, head_tensors, write_head
from families import check_offline_profile, image_requests, qwen2_5_vl
from families import qwen3_vl
from test_batch_heads import joint_law
from test_lossless import reference
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.models.eagle3_format import Eagle3FormatError, read_config, target_layers
from vlmspec_cli.runtime.models.eagle3_head import load_head_dir
from vlmspec_cli.runtime.round.verify import draft_vocab_logits, probabilities, SamplingParams
from vlmspec_cli.session import build_session

LLAVA = ROOT / "vlmspec_cli" / "zoo" / "weights" / "tinyworld" / "llava-target"
VIDEO_TARGET = ROOT / "vlmspec_cli" / "zoo" / "weights" / "tinyworld" / "qwen-video-target"
IMAGES = [((100, 60), (200, 30, 30)), ((64, 120), (20, 160, 60))]
TREE = ["eagle3.tree=true", "tree.depth=3", "tree.top_k=2", "tree.total_tokens=6"]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """family → (target folder, a random head for it: draft vocabulary a random half)."""
    root = tmp_path_factory.mktemp("eagle3")
    out = {"llava": LLAVA,
           "qwen2_5_vl": qwen2_5_vl(root / "qwen25", seed=1, layers=4),
           "qwen3_vl": qwen3_vl(root / "qwen3", seed=1, layers=4)}
    return {name: (path, eagle3_head(root / f"{name}-head", path, seed=3, draft_vocab=200))
            for name, path in out.items()}


def _session(target, head, *sets: str, task: str = "caption"):
    return build_session(load_profile("tinyworld-video" if task == "video" else "tinyworld-caption", [
        f"target.model={target}", "method=eagle3", f"eagle3.model={head}", *sets]))


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_equals_the_targets_generate(targets, family, shape):
    target, head = targets[family]
    session = _session(target, head, *(TREE if shape == "tree" else ["drafting.gamma=3"]))
    drafted, caches = 0, []
    for req in image_requests(IMAGES, max_new_tokens=10):
        res = session.engine.generate(req)
        assert res.tokens == reference(session.target, req), f"{family} {shape}"
        s = res.state.stats
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(res.tokens)
        drafted += s.num_draft_tokens
        if s.draft_cache is not None:   # (auto length: a request that never drafted
            caches.append(s.draft_cache)   # never prefilled its head)
    assert drafted > 0 and caches
    # the head read every prompt position, visual ones included, and three target layers
    assert all(c["entries"] >= c["prompt_tokens"] - 1 for c in caches)
    assert len(session.engine.hidden_layer) == 3


def test_auto_length_on_a_chain_with_drafting_off_and_on(targets):
    """drafting.length auto on an EAGLE-3 chain: γ chosen per round, drafting switched off
    and on (a made-up cost: a draft step as dear as a target step), every output the
    target's greedy one; a tree keeps its shape (the hidden head's rule, which reads
    hidden.tree, is not the one that applies)."""
    from test_draft_length import Costs, use_auto
    from vlmspec_cli.drafters import method_class
    from vlmspec_cli.runtime.length.draft_length import AutoGamma

    target, head = targets["llava"]
    sets = [f"target.model={target}", "method=eagle3", f"eagle3.model={head}", "drafting.length=auto"]
    assert method_class("eagle3").draft_length(load_profile("tinyworld-caption", sets + TREE)) == "fixed"
    session = _session(target, head, "drafting.gamma=3", "drafting.length=auto")
    assert isinstance(session.engine.policy.auto, AutoGamma)
    # (probe_share 1: a probe after the backoff's 1-2 plain rounds; at PROBE_SHARE's 1% the
    # modelled probe cost spaced them past these requests' 30 rounds)
    use_auto(session.engine, AutoGamma(3, costs=Costs(1.0), probe_after=1, max_backoff=2,
                                      probe_share=1.0))
    plain = drafted = 0
    for req in image_requests(IMAGES, max_new_tokens=10):
        res = session.engine.generate(req)
        assert res.tokens == reference(session.target, req)
        plain += res.state.stats.draft_length["rounds_plain"]
        drafted += res.state.stats.draft_length["rounds_drafted"]
    assert plain > 0 and drafted > 0


def test_a_heads_probe_due_within_a_request_comes_at_its_start(targets):
    """A head that never pays (a made-up machine: a draft step as dear as a target step):
    a probe due within a request comes at its first chosen round (its late prefill then
    reads the prompt's states alone, and no plain round before keeps any), while a
    chain's draft, which keeps nothing while it waits, is probed where the wait puts it;
    every output is the target's."""
    from test_draft_length import Costs, use_auto
    from vlmspec_cli.runtime.length.draft_length import AutoGamma

    target, head = targets["llava"]
    reqs = image_requests(IMAGES * 3, max_new_tokens=24)
    for method, first in (("eagle3", True), ("chain", False)):
        if method == "eagle3":
            session = _session(target, head, "drafting.length=auto")
        else:
            session = build_session(load_profile("tinyworld-caption", [
                "method=chain", "drafting.length=auto"]))
        auto = use_auto(session.engine, AutoGamma(3, costs=Costs(1.0), probe_after=4,
                                                  max_backoff=8, probe_share=1.0))
        assert auto.probe_first is first
        probes_at, choose = [], auto.choose

        def chosen(state, budget, choose=choose):
            k = choose(state, budget)
            if auto.probing:
                probes_at.append(len(state.tokens))
            return k

        auto.choose = chosen
        firsts = []     # each request's first probe (later ones follow the wait within it)
        for req in reqs[:len(reqs) if method == "eagle3" else 3]:
            probes_at.clear()
            res = session.engine.generate(req)
            assert res.tokens == reference(session.target, req)
            firsts.append(probes_at[0] if probes_at else None)
        later = firsts[1:]              # (the process's first request learns what it costs)
        assert None not in later and all(at == 1 for at in later) is first, firsts


@pytest.mark.parametrize("head", ["hidden", "eagle3-llava", "eagle3-qwen3_vl"])
def test_a_head_prefilled_late_drafts_as_one_prefilled_with_the_target(targets, head):
    """With auto length a head is prefilled at its request's first drafted round from the
    prompt's states and those of the plain rounds decoded before it (TargetFeatures.later):
    it then proposes exactly what the head prefilled with the target proposes, round for
    round, and the output is the target's (a made-up schedule: plain rounds for the first
    three tokens, then chains of up to 3; the M-RoPE head's later positions included).
    A request that never drafts never prefills its head."""
    from test_draft_length import Costs, use_auto
    from vlmspec_cli.runtime.length.draft_length import AutoGamma

    class Scripted(AutoGamma):
        measures_prefill = False     # (the process's first request is not special here)

        def __init__(self, start: int) -> None:
            super().__init__(3, costs=Costs(1.0))
            self.start_at = start

        def choose(self, state, budget):
            k = min(3, budget) if len(state.tokens) >= self.start_at else 0
            state.length.count(k)
            return k

    if head == "hidden":
        session_of = lambda: build_session(load_profile("tinyworld-caption", ["method=hidden",
            "hidden.tree=false", "drafting.length=auto"]))
    else:
        target, path = targets[head.split("-")[1]]
        session_of = lambda: _session(target, path, "drafting.length=auto")
    reqs = image_requests(IMAGES, max_new_tokens=14)
    seen = {}
    for late in (False, True):
        session = session_of()
        drafter = session.engine.drafter
        assert drafter.late_prefill
        drafter.late_prefill = late
        use_auto(session.engine, Scripted(3))
        proposed, own = [], drafter.propose
        drafter.propose = (lambda state, k, own=own:
                           proposed.append(own(state, k)) or proposed[-1])
        outs = [session.engine.generate(r) for r in reqs]
        for r, res in zip(reqs, outs):
            assert res.tokens == reference(session.target, r)
            assert res.state.stats.draft_cache["entries"] > 0
        seen[late] = [list(p.tokens) for p in proposed], [o.tokens for o in outs]
        if late:   # never drafted: never prefilled (no record of its cache)
            use_auto(session.engine, Scripted(10 ** 6))
            assert session.engine.generate(reqs[0]).state.stats.draft_cache is None
    assert seen[True] == seen[False] and len(seen[True][0]) >= 2 * len(reqs)
    assert any(seen[True][0])


def test_a_request_plain_throughout_runs_as_target_only(targets, monkeypatch):
    """Auto length with a head that never pays (a made-up machine: a draft step as dear as
    a target step): a request that starts with drafting off and a wait longer than its
    rounds, or whose rounds left fall under the wait after a failed probe, decodes the rest
    as target-only does: its target forwards hand over no hidden states and the head is
    never prefilled for it. Every decision is the one made without that (tokens, each
    request's draft-length record, the process's wait and backoff), and the output is the
    target's."""
    from test_draft_length import Costs, use_auto
    from vlmspec_cli.runtime.length.draft_length import AutoGamma
    from vlmspec_cli.runtime.round import round_policy

    target, head = targets["llava"]
    reqs = image_requests(IMAGES * 3, max_new_tokens=24)
    runs = {}
    for lane in (False, True):
        at_start = []     # the requests judged plain throughout at their start
        if not lane:
            monkeypatch.setattr(round_policy, "plain_throughout", lambda auto, state: False)
            monkeypatch.setattr(round_policy, "plain_from_here", lambda auto, state: False)
        else:
            judge = round_policy.plain_throughout
            monkeypatch.setattr(round_policy, "plain_throughout",
                                lambda auto, state: at_start.append(judge(auto, state)) or at_start[-1])
        session = _session(target, head, "drafting.gamma=3", "drafting.length=auto")
        auto = use_auto(session.engine, AutoGamma(3, costs=Costs(1.0)))
        lm = session.target
        calls = {"prefill_hidden": 0, "extend_hidden": 0}
        for name in calls:
            def counted(*a, _f=getattr(lm.adapter, name), _n=name, **k):
                calls[_n] += 1
                return _f(*a, **k)
            monkeypatch.setattr(lm.adapter, name, counted)
        seen = []
        for r in reqs:
            before, judged = dict(calls), len(at_start)
            res = session.engine.generate(r)
            assert res.tokens == reference(session.target, r)
            st = res.state
            seen.append((res.tokens, st.stats.draft_length, auto.wait, auto.backoff))
            if any(at_start[judged:]):   # plain from its start
                assert calls == before and st.stats.draft_cache is None
        runs[lane] = seen, calls, sum(at_start)
        monkeypatch.undo()
    assert runs[True][0] == runs[False][0] and runs[True][2] > 0
    # most rounds hand over nothing now (the requests before the first probe's failure, and
    # the stretch before a probe in a request, still do)
    assert runs[True][1]["extend_hidden"] < runs[False][1]["extend_hidden"] / 2
    assert runs[True][1]["prefill_hidden"] < runs[False][1]["prefill_hidden"]


def test_every_path_hands_over_the_same_three_layers(targets):
    """The target's forwards hand the head low ⊕ mid ⊕ high, concatenated, alike through
    transformers, the fast path and the compiled step's graph (run eagerly here): at the
    prefill and at a later extend; and decoding with the fast path on or off is the same."""
    from vlmspec_cli.runtime.fast.compiled_step import CompiledSteps

    target, head = targets["llava"]
    req = image_requests(IMAGES, max_new_tokens=12)[0]
    feats, tokens = {}, {}
    for mode in ("off", "on", "compiled"):
        session = _session(target, head, f"runtime.fast_path={'off' if mode == 'off' else 'on'}")
        lm, layers = session.target, session.engine.hidden_layer
        if mode == "compiled":
            lm.fast.compiled = CompiledSteps(lm.fast)
            lm.fast.compiled.step = lm.fast.compiled._layers   # the graph's code, uncompiled
        inputs = lm.adapter.encode(lm, lm.adapter.prompt_text(lm, req.messages), req.images)
        cache = lm.adapter.new_cache(lm)
        _, prompt = lm.adapter.prefill_hidden(lm, inputs, cache, layers)
        _, later = lm.adapter.extend_hidden(lm, torch.tensor([[5, 6, 7]]), cache, layers)
        feats[mode] = prompt[0], later[0]
        if mode != "compiled":
            tokens[mode] = session.engine.generate(req).tokens
    width = session.target.model.get_input_embeddings().weight.shape[1]
    assert layers == (2, 4, 5) and feats["off"][0].shape[-1] == 3 * width
    for mode in ("on", "compiled"):
        for ours, theirs in zip(feats[mode], feats["off"]):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert tokens["off"] == tokens["on"]


# ---------------------------------------------------------------------- T > 0
@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from test_sampling_lm import _tiny_lm

    path = tmp_path_factory.mktemp("tiny") / "target"
    return path, _tiny_lm(path, 2, seed=0)


@pytest.mark.parametrize("tree", [None, (3, 2, 6)])
def test_samples_follow_the_target_through_a_draft_vocabulary(tiny_target, tmp_path, tree):
    """A 5-token target, a head whose draft vocabulary holds 3 of them (q = 0 on the other
    two): the first three tokens of 1500 seeded decodes follow the target's exact law."""
    from test_sampling_lm import _assert_samples_follow_target
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.drafters.hidden import TreeSettings
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine

    torch.set_num_threads(1)   # 1500 decodes of a 2-layer model: threads only contend
    path, target = tiny_target
    config = head_config(path, draft_vocab=3, layer_ids=("top", [0, 1, 2]))
    head = load_head_dir(write_head(tmp_path / "head", config, head_tensors(config, 5, scale=4.0)),
                         "cpu", torch.float32)
    assert int(head.t2d.sum()) == 3
    params = SamplingParams(1.0)
    settings = TreeSettings(*tree) if tree else None
    drafter = create_drafter("eagle3", target=target, head=head, sampling=params, tree=settings)
    engine = SpeculativeEngine(target, drafter, tree[0] if tree else 2, params)
    _assert_samples_follow_target(engine, target, params, n=1500)


@pytest.mark.parametrize("family,temperature,shape", [
    ("llava", 1.0, TREE), ("qwen2_5_vl", 0.03, ["drafting.gamma=2"]), ("qwen3_vl", 1.0, TREE)])
def test_a_vlm_targets_first_two_tokens_follow_its_law(targets, family, temperature, shape):
    """300 seeded decodes of an image prompt: the first token is the target's own, the
    second the head's proposal from the prompt's states (a chain, or a tree's children
    drawn without replacement); the joint law of both (chi-square over the pairs with 5
    or more expected draws, the rest pooled) is the target's. ``temperature`` makes each
    law neither too flat nor too peaked to test with 300 draws. (A fixed draft length: with
    ``drafting.length: auto`` a request's first round drafts nothing, draft_length.py.)"""
    from vlmspec_cli.runtime.request import Message, Request

    torch.set_num_threads(1)
    target, head = targets[family]
    session = _session(target, head, f"sampling.temperature={temperature}",
                       "drafting.length=fixed", *shape)
    lm, params, runs = session.target, session.sampling, 300
    messages = [Message("user", "describe the image.", (Image.new("RGB", *IMAGES[0]),))]
    joint = joint_law(lm, messages, params, runs)
    # three tokens: the first round drafts x1 (q = p) and the head's x2
    results = [session.engine.generate(Request(messages, max_new_tokens=3, seed=seed))
               for seed in range(runs)]
    assert_first_two_follow(results, joint, runs)


def test_draft_vocabulary_logits_are_zero_off_the_map():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    out = draft_vocab_logits(logits, torch.tensor([4, 0, 2]), 6)
    q = probabilities(out, SamplingParams(1.0))[0]
    assert torch.allclose(q[[4, 0, 2]], torch.softmax(logits[0], -1))
    assert q[[1, 3, 5]].sum() == 0 and out[0].argmax() == 2


# ---------------------------------------------------------------------- the CLI
def _cli(*args: str, env=None):
    return CliRunner(env=env).invoke(cli, list(args), catch_exceptions=False)


def test_cli_caption_and_chat_compare(targets, tmp_path):
    target, head = targets["qwen3_vl"]
    Image.new("RGB", (72, 40), (200, 30, 30)).save(tmp_path / "a.png")
    Image.new("RGB", (40, 72), (20, 160, 60)).save(tmp_path / "b.png")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"id": "c", "messages": [
        {"role": "user", "text": "what is this?", "images": ["a.png"]},
        {"role": "assistant", "text": "a red thing."},
        {"role": "user", "text": "and this?", "images": ["b.png"]}]}) + "\n")
    for given, extra in (([str(tmp_path / "a.png")], []), (["--chat", str(chat)], TREE)):
        sets = [x for s in [f"target.model={target}", "method=eagle3", f"eagle3.model={head}", *extra]
                for x in ("--set", s)]
        res = _cli("caption", *given, *sets, "--compare", "--json", "--max-new-tokens", "8")
        assert res.exit_code == 0, res.output
        record = next(json.loads(line) for line in res.stdout.splitlines() if '"input"' in line)
        assert record["compare"]["identical"] is True and record["method"] == "eagle3"
        assert record["eagle3"]["model"] == str(head) and record["stats"]["num_drafts"] > 0


def test_cli_describe_video_compare(tmp_path):
    """The tinyworld Qwen2.5-VL video target with a random head of M-RoPE positions."""
    head = eagle3_head(tmp_path / "head", VIDEO_TARGET, seed=4, draft_vocab=300)
    video = sorted((ROOT / "examples" / "videos").glob("*.mp4"))[0]
    res = _cli("describe-video", str(video), "--frames", "4", "--set", "method=eagle3",
               "--set", f"eagle3.model={head}", "--compare", "--json", "--max-new-tokens", "12")
    assert res.exit_code == 0, res.output
    record = next(json.loads(line) for line in res.stdout.splitlines() if '"input"' in line)
    assert record["compare"]["identical"] is True and record["stats"]["num_drafts"] > 0


# ---------------------------------------------------------------------- refusals
def _broken(tmp_path, change):
    config = head_config(LLAVA, draft_vocab=100)
    tensors = head_tensors(config, seed=1)
    change(config, tensors)
    return write_head(tmp_path / "head", config, tensors)


def _rename(t, old, new):
    t[new] = t.pop(old)


BROKEN = {
    "architectures": lambda c, t: c.update(architectures=["Eagle3Speculator"]),
    "layers.0.self_attn.q_proj.weight": lambda c, t: _rename(
        t, "midlayer.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.weight"),
    "lm_head.weight": lambda c, t: t.pop("lm_head.weight"),
    "fc.weight": lambda c, t: t.update({"fc.weight": t["fc.weight"].T.contiguous()}),
    "midlayer.self_attn.k_proj.weight": lambda c, t: t.update(
        {"midlayer.self_attn.k_proj.weight": t["midlayer.self_attn.k_proj.weight"][:, :128]}),
    "d2t": lambda c, t: t["d2t"].__setitem__(-1, 10_000),
    "t2d": lambda c, t: t["t2d"].__setitem__(t["t2d"].logical_not().nonzero()[0, 0], True),
    # draft ids 0 and 1 on one target id (no t2d to disagree with: it is optional)
    "two draft ids": lambda c, t: (t.pop("t2d"), t["d2t"].__setitem__(1, t["d2t"][0] - 1)),
    "draft_vocab_size": lambda c, t: c.update(draft_vocab_size=4096),
}


@pytest.mark.parametrize("key", list(BROKEN))
def test_a_head_off_the_published_layout_is_refused_naming_the_key(tmp_path, key):
    folder = _broken(tmp_path, BROKEN[key])
    with pytest.raises(Eagle3FormatError, match=key.replace(".", r"\.")) as err:
        load_head_dir(folder, "cpu", torch.float32)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("key", ["layers.0.self_attn.q_proj.weight", "d2t"])
def test_the_cli_refuses_it_before_decoding_in_one_line(tmp_path, key):
    folder = _broken(tmp_path, BROKEN[key])
    Image.new("RGB", (40, 40)).save(tmp_path / "a.png")
    res = _cli("caption", str(tmp_path / "a.png"), "--set", f"target.model={LLAVA}", "--set",
               "method=eagle3", "--set", f"eagle3.model={folder}", "-q")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert key in res.stderr and "EAGLE-3 head" in res.stderr


def test_hostile_files_are_refused_by_the_bounded_checks(tmp_path):
    """config.json and the safetensors headers go through runtime/models/weights_check.py as every
    model's do: a header declaring 2**63 bytes, a config nested past Python's recursion
    limit, a config declaring a vocabulary of billions (before its t2d is sized): one line."""
    def hostile(name, change):
        folder = _broken(tmp_path / name, lambda c, t: None)
        change(folder)
        with pytest.raises(Eagle3FormatError) as err:
            load_head_dir(folder, "cpu", torch.float32, vocab_size=256)
        assert "\n" not in str(err.value)
        return str(err.value)

    def huge_header(folder):
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes((2 ** 63).to_bytes(8, "little") + data[8:])

    def deep_config(folder):
        (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)

    def huge_vocab(folder):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"vocab_size": 2 ** 40}))
        from safetensors.torch import load_file, save_file
        tensors = load_file(str(folder / "model.safetensors"))
        del tensors["t2d"]
        save_file(tensors, str(folder / "model.safetensors"))

    assert "model.safetensors" in hostile("header", huge_header)
    assert "config.json" in hostile("deep", deep_config) and "nested" in hostile("deep2", deep_config)
    assert "'vocab_size' is 1099511627776" in hostile("vocab", huge_vocab)


@pytest.mark.parametrize("shipped, head", [("tinyworld-caption", "llava-deep-eagle3"),
                                           ("tinyworld-video", "qwen-video-deep-eagle3")])
def test_bench_runs_the_shipped_head_beside_another_methods_profile(shipped, head):
    """vlmspec bench runs eagle3 from another method's profile with the head shipped for
    its target, as a chain (DraftingMethod.beside), not with the hidden head's settings."""
    from vlmspec_cli.tasks.bench import method_profiles

    base = load_profile(str(ROOT / "profiles" / f"{shipped}.yaml"), ["hidden.tree=true"])
    profile = method_profiles(base, ["none", "eagle3"])["eagle3"]
    assert profile.eagle3.model == f"zoo:tinyworld/{head}" and not profile.eagle3.tree


def test_pickle_weights_are_never_read(tmp_path):
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(head_config(LLAVA)))
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(Eagle3FormatError, match="pytorch_model.bin"):
        load_head_dir(folder, "cpu", torch.float32)


def test_target_layers_follow_each_engines_convention(tmp_path):
    """vLLM's top-level ids index a layer's input (hidden_states[id]); SpecForge's and
    SGLang's eagle_config ids a layer's output (SGLang captures id + 1); neither: the
    engines' default 2, L // 2, L - 3."""
    def layers(layer_ids, count=32):
        folder = write_head(tmp_path / str(layer_ids), head_config(LLAVA, layer_ids=layer_ids), {})
        return target_layers(read_config(folder), count)

    assert layers(None) == (2, 16, 29)
    assert layers(("top", [1, 15, 28])) == (1, 15, 28)
    assert layers(("nested", [1, 15, 28])) == (2, 16, 29)
    with pytest.raises(Eagle3FormatError, match="eagle_aux_hidden_state_layer_ids"):
        layers(("top", [1, 15, 40]))


def test_a_head_for_another_target_is_refused(targets):
    from vlmspec_cli.session import ModelLoadError, SessionError

    _, head = targets["qwen3_vl"]
    with pytest.raises((SessionError, ModelLoadError), match="vocab_size"):
        _session(LLAVA, head)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_mrope_positions_are_the_targets(targets, family):
    """An M-RoPE head rotates by the target's own rule: its cos/sin at 3-D positions equal
    the Qwen target's rotary module's (sections consecutive for Qwen2.5-VL, interleaved for
    Qwen3-VL)."""
    target, head_dir = targets[family]
    lm = _session(target, head_dir, "method=none").target
    head = load_head_dir(head_dir, "cpu", torch.float32)
    positions = torch.randint(0, 50, (3, 1, 9))
    x = torch.zeros(1, 9, 1)
    cos, sin = lm.model.model.language_model.rotary_emb(x, positions)
    ours = head._cos_sin(positions[:, 0], x)
    torch.testing.assert_close(ours[0], cos.reshape(9, -1))
    torch.testing.assert_close(ours[1], sin.reshape(9, -1))


def test_the_head_reads_an_image_prompt_at_the_targets_3d_positions(targets):
    """Qwen2.5-VL: after the prefill the head's cache holds every prompt pair (x_{t+1},
    fc(g_t)), visual positions included, rotated at the positions the target's own
    get_rope_index gave the prompt (not at their index)."""
    target, head_dir = targets["qwen2_5_vl"]
    session = _session(target, head_dir)
    lm, drafter = session.target, session.engine.drafter
    req = image_requests(IMAGES, max_new_tokens=4)[0]
    state = session.engine.start(req)
    inputs = lm.adapter.encode(lm, lm.adapter.prompt_text(lm, req.messages), req.images)
    ids, positions = inputs["input_ids"][0], inputs["position_ids"][:, 0]
    assert (positions[0] != torch.arange(len(ids))).any()   # the image moved them
    states = lm.model(**{k: v for k, v in inputs.items() if k != "rope_deltas"},
                      output_hidden_states=True).hidden_states
    g = torch.cat([states[i][0] for i in drafter.hidden_layer], -1)
    head = drafter.head
    cache = head.new_cache()
    with torch.inference_mode():
        head(drafter.embed(ids[None, 1:]), head.project(g[:-1])[None], positions[:, :-1], cache)
    torch.testing.assert_close(state.drafter_state.cache.keys, cache.keys, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("profile,hub_id", [("qwen25-vl-7b-eagle3", "Qwen/Qwen2.5-VL-7B-Instruct"),
                                            ("qwen3-vl-8b-eagle3", "Qwen/Qwen3-VL-8B-Instruct")])
def test_real_head_profiles_fail_in_one_line_offline(tmp_path, profile, hub_id):
    check_offline_profile(profile, hub_id, tmp_path)
    from vlmspec_cli.profile import load_profile   # the head is named in the same line

    check_offline_profile(profile, load_profile(profile).eagle3.model, tmp_path)
