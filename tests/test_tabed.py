"""TABED (issue 3): caption and pooled drafting, batched ensembles, adaptive weights.

T=0: every ensemble and weighting variant reproduces the target's greedy tokens, on
single images, multi-image prompts and second turns. The weights move to the member that
matches the target. Pooling respects the 2-D grid.
"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import fresh_scenes
from test_lossless import reference
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.drafters.inputs import input_prompt, replace_images
from vlmspec_cli.drafters.weights import EnsembleWeights, distance, grid_candidates
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities
from vlmspec_cli.zoo import world

GREEDY = SamplingParams(0.0)
MAX_NEW = 32


def _requests(n_single: int, seed: int) -> list[Request]:
    """Fresh single-image captions/questions, a 2-image difference, a 5-image story, a
    second (text-only follow-up) turn and an unrelated text task after an image turn."""
    reqs = []
    rng = random.Random(seed)
    for i, (scene, image) in enumerate(fresh_scenes(n_single, seed)):
        prompt = world.CAPTION_PROMPTS[i % 3] if i % 2 == 0 else rng.choice(world.qa_pairs(scene, rng))[0]
        reqs.append(Request([Message("user", prompt, (image,))], max_new_tokens=MAX_NEW))
    for kind in ("difference", "story", "followup", "text_task"):
        turns = world.sample_conversation(rng, kind)[:-1]
        reqs.append(Request([Message(t.role, t.text, tuple(t.images)) for t in turns],
                            max_new_tokens=MAX_NEW))
    return reqs


@pytest.fixture(scope="module")
def cases(zoo_target):
    reqs = _requests(6, seed=31337)
    return [(r, reference(zoo_target, r)) for r in reqs]


def _engine(zoo_target, zoo_draft, zoo_captioner, method, sampling=GREEDY, gamma=4, **kw):
    drafter = create_drafter(method, draft=zoo_draft, sampling=sampling, captioner=zoo_captioner,
                             image_token=zoo_target.adapter.image_token(zoo_target), **kw)
    return SpeculativeEngine(zoo_target, drafter, gamma, sampling)


@pytest.mark.parametrize("method,kw", [
    ("chain", dict(drafting_input="caption")),                                        # C
    ("chain", dict(drafting_input="pooled")),                                         # P
    ("tabed", dict(inputs=["multimodal", "text"], policy="static")),           # MT
    ("tabed", dict(inputs=["multimodal", "text"], policy="grid")),             # MT*
    ("tabed", dict(inputs=["multimodal", "text", "caption", "pooled"], policy="static")),  # MTCP
    ("tabed", dict(inputs=["multimodal", "text", "caption", "pooled"], policy="softmax")),  # MTCP*
    ("tabed", dict(inputs=["multimodal", "text"], policy="grid", window=1, distance="tvd")),
    ("tabed", dict(inputs=["text", "pooled"], policy="grid", window=4)),
    ("tabed", dict(inputs=["caption", "multimodal"], policy="softmax", window=16, temperature=0.5)),
    ("tabed", dict(inputs=["multimodal", "text", "pooled"], policy="grid", grid=4)),
])
def test_ensembles_equal_target_greedy(zoo_target, zoo_draft, zoo_captioner, cases, method, kw):
    engine = _engine(zoo_target, zoo_draft, zoo_captioner, method, **kw)
    accepted = 0
    for i, (req, ref) in enumerate(cases):
        res = engine.generate(req)
        assert res.tokens == ref, f"case {i} ({req.messages[-1].text!r}) differs from target greedy"
        s = res.state.stats
        accepted += s.num_accepted_tokens
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts
        if method == "tabed":
            weights = s.ensemble["block_weights"]
            # one weight vector per block that drafted (a last round may draft nothing)
            assert s.num_drafts - 1 <= len(weights) <= s.num_drafts
            assert all(abs(sum(w) - 1) < 1e-3 and len(w) == len(kw["inputs"]) for w in weights)
    assert accepted > 0


def test_caption_member_gets_captions_and_time(zoo_target, zoo_draft, zoo_captioner, cases):
    req = cases[0][0]
    engine = _engine(zoo_target, zoo_draft, zoo_captioner, "tabed", inputs=["caption", "text"])
    state = engine.start(req)
    captions = state.drafter_state.captions
    assert len(captions) == 1 and captions[0]           # one caption for one image
    assert any(k in captions[0] for k in world.SHAPES)  # it describes shapes
    assert state.stats.caption_s > 0
    # a chain reading the caption waits for the captioning prepare() started
    chain = _engine(zoo_target, zoo_draft, zoo_captioner, "chain", drafting_input="caption")
    assert chain.start(req).stats.caption_s > 0


def test_input_prompts():
    prompt = "USER: <image>\n<image>\nspot the difference. ASSISTANT:"
    assert input_prompt(prompt, [1, 2], "text", "<image>", []) == \
        "USER: \n\n\n\nspot the difference. ASSISTANT:"
    assert input_prompt(prompt, [1, 2], "caption", "<image>", ["a red circle", "a blue square"]) == \
        "USER: image: a red circle\n\nimage: a blue square\n\nspot the difference. ASSISTANT:"
    assert input_prompt(prompt, [1, 2], "pooled", "<image>", []) == prompt
    with pytest.raises(ValueError, match="2 image placeholders for 1"):
        replace_images(prompt, "<image>", ["x"])


def test_pooled_features_respect_the_grid(zoo_draft):
    """2x2 pooling of the 3x3 patch grid: 4 tokens, each the projection of the mean of its
    window's patches (row-major), edge windows averaging only the patches they cover."""
    image = fresh_scenes(1, seed=5)[0][1]
    lm = zoo_draft
    pooled = lm.adapter.image_features(lm, [image], pool=2)
    assert pooled.shape[:2] == (1, 4)
    model = lm.model.model
    with torch.inference_mode():
        pix = lm.processor.image_processor([image], return_tensors="pt")["pixel_values"]
        hidden = model.vision_tower(pix, output_hidden_states=True).hidden_states[-1][0, 1:]  # (9, C)
        windows = [[0, 1, 3, 4], [2, 5], [6, 7], [8]]
        means = torch.stack([hidden[w].mean(0) for w in windows])
        expected = model.multi_modal_projector(means)
    torch.testing.assert_close(pooled[0], expected, rtol=1e-4, atol=1e-5)
    assert lm.adapter.image_features(lm, [image]).shape[:2] == (1, 9)


def test_grid_candidates():
    two = grid_candidates(2, 10)
    assert two.shape == (11, 2)
    assert torch.allclose(two[3], torch.tensor([0.7, 0.3]))   # w_j = [1 - j/n, j/n]
    three = grid_candidates(3, 4)
    assert three.shape == (15, 3) and torch.allclose(three.sum(1), torch.ones(15))


def test_distances():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert distance(p, p, "kl").item() == pytest.approx(0.0, abs=1e-6)
    assert distance(p, torch.tensor([1.0, 0.0, 0.0]), "tvd").item() == pytest.approx(0.5)
    assert distance(p, torch.tensor([0.25, 0.75, 0.0]), "kl").item() == pytest.approx(
        0.5 * (torch.log(torch.tensor(2.0)) + torch.log(torch.tensor(2 / 3))).item())


@pytest.mark.parametrize("policy", ["grid", "softmax"])
@pytest.mark.parametrize("h", [1, 4])
def test_weights_move_to_the_member_that_matches_the_target(policy, h):
    """Member 0 drafts exactly the target's distribution, member 1 noise; after a long
    history where the roles were swapped, the weight moves to member 0 within h steps."""
    gen = torch.Generator().manual_seed(0)
    vocab = 50

    def step(good: int):
        p = torch.softmax(3 * torch.randn(1, vocab, generator=gen), -1)
        noise = torch.softmax(3 * torch.randn(1, vocab, generator=gen), -1)
        q = torch.stack([p, noise], 1) if good == 0 else torch.stack([noise, p], 1)
        return p, q

    weights = EnsembleWeights(2, policy=policy, window=h, temperature=0.1)
    assert torch.allclose(weights.current(), torch.tensor([0.5, 0.5]))  # nothing verified yet
    for _ in range(20):
        weights.observe(*step(good=1))
    assert weights.current()[1] > 0.9
    for i in range(h):
        weights.observe(*step(good=0))
    w = weights.current()
    assert w[0] > 0.9, f"after {h} steps the weight is still {w.tolist()}"
    if policy == "grid":
        assert w.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("policy", ["grid", "softmax"])
def test_window_all_keeps_running_sums_equal_to_the_whole_history(policy):
    """With no window only the summed distances are kept; they choose as a window longer
    than the history does, block after block (3 members: the grid's simplex too)."""
    gen = torch.Generator().manual_seed(3)
    every, wide = EnsembleWeights(3, policy=policy), EnsembleWeights(3, policy=policy, window=10_000)
    for n in (1, 4, 2, 6, 3):
        p = torch.softmax(2 * torch.randn(n, 40, generator=gen), -1)
        q = torch.softmax(2 * torch.randn(n, 3, 40, generator=gen), -1)
        for weights in (every, wide):
            weights.observe(p, q)
        torch.testing.assert_close(every.current(), wide.current())
    assert every.observed == wide.observed == 16


def test_window_all_remembers_everything():
    """Ten steps where member 1 matched, then one where member 0 did: with the whole
    history the weight stays mostly on member 1; with h = 1 it jumps to member 0."""
    p = torch.tensor([[0.9, 0.1]])
    bad = torch.tensor([[0.1, 0.9]])
    result = {}
    for window in ("all", 1):
        weights = EnsembleWeights(2, policy="grid", window=window)
        for _ in range(10):
            weights.observe(p, torch.stack([bad, p], 1))
        weights.observe(p, torch.stack([p, bad], 1))
        result[window] = weights.current().tolist()
    assert result["all"][1] >= 0.8
    assert result[1] == [1.0, 0.0]


def test_adaptive_ensemble_in_the_engine_prefers_the_exact_member(zoo_target, zoo_draft, cases):
    """Draft with the target itself: its multimodal member is the target's own distribution,
    the text-only member is not. The grid weight goes to the multimodal member after the
    first block and then every proposal is accepted."""
    trace: list[dict] = []
    drafter = create_drafter("tabed", draft=zoo_target, sampling=GREEDY, inputs=["text", "multimodal"],
                             image_token=zoo_target.adapter.image_token(zoo_target), policy="grid",
                             trace=trace.append)
    engine = SpeculativeEngine(zoo_target, drafter, 4, GREEDY)
    req, ref = cases[0]
    res = engine.generate(req)
    assert res.tokens == ref
    blocks = res.state.stats.ensemble["block_weights"]
    assert blocks[0] == [0.5, 0.5]
    assert all(w[1] >= 0.9 for w in blocks[1:]), blocks
    assert [t["weights"] for t in trace] == blocks
    assert all(t["accepted"] == t["drafted"] for t in trace[1:]), trace


def _exact_sequences(target, request: Request, params: SamplingParams, length: int,
                     threshold: float = 1e-6) -> dict[tuple, float]:
    """The target's own distribution over its first ``length`` tokens (stopping at EOS),
    enumerated by batched forwards over every prefix with probability above threshold."""
    adapter = target.adapter
    inputs = adapter.encode(target, adapter.prompt_text(target, request.messages), request.images)
    eos = target.tokenizer.eos_token_id
    done: dict[tuple, float] = {}
    frontier: dict[tuple, float] = {(): 1.0}
    for _ in range(length):
        prefixes = list(frontier)
        ids = torch.cat([inputs["input_ids"].expand(len(prefixes), -1),
                         torch.tensor(prefixes, dtype=torch.long).reshape(len(prefixes), -1)], 1)
        with torch.inference_mode():
            logits = target.model(input_ids=ids,
                                  pixel_values=inputs["pixel_values"].expand(len(prefixes), -1, -1, -1)
                                  ).logits[:, -1]
        probs = probabilities(logits, params)
        frontier_next: dict[tuple, float] = {}
        for prefix, row in zip(prefixes, probs):
            mass = frontier[prefix] * row
            for tok in (mass > threshold).nonzero().flatten().tolist():
                seq = prefix + (tok,)
                (done if tok == eos else frontier_next)[seq] = float(mass[tok])
        frontier = frontier_next
    return done | frontier


def test_ensemble_sampling_follows_target_distribution(zoo_target, zoo_draft):
    """T>0: tokens drafted from the adaptive mixture q = sum_i w_i q^(i) and verified with
    that q follow the target's distribution (chi-square on the first three tokens)."""
    from scipy.stats import chisquare

    params = SamplingParams(1.3)
    image = fresh_scenes(1, seed=4242)[0][1]
    req = Request([Message("user", "describe the image.", (image,))], max_new_tokens=3)
    exact = _exact_sequences(zoo_target, req, params, 3)
    trace: list[dict] = []
    drafter = create_drafter("tabed", draft=zoo_draft, sampling=params, inputs=["text", "multimodal"],
                             image_token=zoo_target.adapter.image_token(zoo_target), policy="grid",
                             trace=trace.append)
    engine = SpeculativeEngine(zoo_target, drafter, 1, params)
    n = 600
    counts: dict[tuple, int] = {}
    rejected = 0
    for seed in range(n):
        res = engine.generate(Request(req.messages, max_new_tokens=3, seed=seed))
        key = tuple(res.tokens)
        counts[key] = counts.get(key, 0) + 1
        rejected += res.state.stats.num_draft_tokens - res.state.stats.num_accepted_tokens
    assert rejected > n // 20, "the draft is too close to the target to test the residual path"
    adapted = [t["weights"] for t in trace if t["weights"] != [0.5, 0.5]]
    assert adapted, "no block was drafted with adapted weights"

    # cells: sequences with enough expected mass; everything else (including sequences
    # below the enumeration threshold) pooled into one cell
    cells = [c for c in sorted(exact, key=exact.get, reverse=True) if exact[c] * n >= 5]
    expected = torch.tensor([exact[c] * n for c in cells])
    observed = torch.tensor([float(counts.get(c, 0)) for c in cells])
    obs = torch.cat([observed, torch.tensor([n - observed.sum()])])
    exp = torch.cat([expected, torch.tensor([n - expected.sum()])])
    assert len(cells) >= 5 and exp[-1] >= 5
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


def test_ensemble_samples_from_the_mixture_it_hands_to_verification(zoo_target, zoo_draft):
    """The q a drafted token comes with is the weighted mixture of the members' own
    distributions, and the token really is drawn from that q (chi-square)."""
    from scipy.stats import chisquare

    params = SamplingParams(1.0)
    image = fresh_scenes(1, seed=5)[0][1]  # a scene where M's and T's first tokens differ
    req = Request([Message("user", "describe the image.", (image,))], max_new_tokens=8, seed=3)
    image_token = zoo_target.adapter.image_token(zoo_target)

    def first_q(method, **kw):
        drafter = create_drafter(method, draft=zoo_draft, sampling=params, image_token=image_token, **kw)
        engine = SpeculativeEngine(zoo_target, drafter, 1, params)
        return engine, engine.start(req)

    engine, state = first_q("tabed", inputs=["text", "multimodal"], policy="static")
    prefill_logits = state.drafter_state.next_logits
    n = 3000
    counts = torch.zeros(zoo_draft.vocab_size)
    for _ in range(n):
        state.drafter_state.next_logits = prefill_logits  # redraw the first token
        draft = engine.drafter.propose(state, 1)
        counts[draft.tokens[0]] += 1
    q = draft.probs[0]
    q_text = first_q("chain", drafting_input="text")[1].drafter_state.next_logits
    q_image = first_q("chain", drafting_input="multimodal")[1].drafter_state.next_logits
    mixture = 0.5 * probabilities(q_text, params) + 0.5 * probabilities(q_image, params)
    torch.testing.assert_close(q, mixture, rtol=1e-4, atol=1e-6)
    assert (probabilities(q_text, params) - mixture).abs().sum() > 0.05  # members differ

    big = q * n >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([q[big] * n, (q[~big] * n).sum()[None]])
    assert chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("policy", ["grid", "softmax", "static"])
@pytest.mark.parametrize("drafting_input", ["multimodal", "text"])
def test_one_member_ensemble_is_chain(zoo_target, zoo_draft, zoo_captioner, cases, policy, drafting_input):
    """tabed with one drafting input (--inputs M) is chain with that input: at T=0 the
    target's greedy tokens and chain's drafts; at T>0 the same samples (no crash)."""
    for i, (req, ref) in enumerate(cases[:3]):
        one = _engine(zoo_target, zoo_draft, zoo_captioner, "tabed", inputs=[drafting_input], policy=policy)
        chain = _engine(zoo_target, zoo_draft, zoo_captioner, "chain", drafting_input=drafting_input)
        res, base = one.generate(req), chain.generate(req)
        assert res.tokens == ref == base.tokens, f"case {i} differs"
        assert res.state.stats.accepted_per_pos == base.state.stats.accepted_per_pos
    hot = SamplingParams(1.0)
    req = Request(cases[0][0].messages, max_new_tokens=12, seed=7)
    one = _engine(zoo_target, zoo_draft, zoo_captioner, "tabed", sampling=hot, inputs=[drafting_input],
                  policy=policy).generate(req)
    chain = _engine(zoo_target, zoo_draft, zoo_captioner, "chain", sampling=hot,
                    drafting_input=drafting_input).generate(req)
    assert one.tokens == chain.tokens and len(one.tokens) > 0
