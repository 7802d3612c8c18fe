"""T>0: speculative sampling through the real engine reproduces the target's distribution.

Tiny-vocabulary Llama target and draft (real transformers classes, saved and loaded through
the same from_pretrained path as any model). The exact target distribution of the first
three tokens is enumerated; speculative samples are compared with it by chi-square. Fixed
seeds make the test deterministic (no flakiness), and the draft differs enough from the
target that rejections and residual resampling really happen.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.models.loading import load_model
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities

VOCAB = 5          # model vocabulary: t0..t4 (EOS lies outside it, so no early stop)
NEW_TOKENS = 3


def _tiny_lm(path, layers: int, seed: int, device: str = "cpu", dtype: str = "auto"):
    vocab = {f"t{i}": i for i in range(VOCAB)} | {"</s>": VOCAB, "<unk>": VOCAB + 1}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", unk_token="<unk>",
                                  chat_template="{% for m in messages %}{{ m['content'][-1]['text'] }}{% endfor %}")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None, initializer_range=0.6)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return load_model(ModelSpec(model=str(path), device=device, dtype=dtype))


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return _tiny_lm(root / "target", 2, seed=0), _tiny_lm(root / "draft", 1, seed=7)


def _exact_distribution(target, prompt_ids, params, new_tokens: int = NEW_TOKENS):
    """P(x1, …, x_new_tokens) under the target's warped distribution, for every sequence."""
    seqs = list(itertools.product(range(VOCAB), repeat=new_tokens))
    ids = torch.tensor([prompt_ids + list(s) for s in seqs], device=target.device)
    with torch.no_grad():
        logits = target.model(input_ids=ids).logits.float().cpu()
    n = len(prompt_ids)
    probs = probabilities(logits[:, n - 1 : n - 1 + new_tokens], params)  # (S, new, V)
    tok = torch.tensor(seqs)
    per_step = probs.gather(-1, tok[..., None])[..., 0]
    return seqs, per_step.prod(-1)


def _assert_samples_follow_target(engine, target, params, n: int = 2000, decode=None,
                                  new_tokens: int = NEW_TOKENS):
    """Decode the first ``new_tokens`` tokens with n seeds; chi-square against the exact
    distribution. ``decode(requests) -> results`` replaces one-by-one ``engine.generate``
    (batching). Returns the exact distribution (to compare the draft's with)."""
    prompt = "t1 t3 t0 t2"
    prompt_ids = target.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    seqs, exact = _exact_distribution(target, prompt_ids, params, new_tokens)
    index = {s: i for i, s in enumerate(seqs)}
    counts = torch.zeros(len(seqs))
    rejected = 0
    requests = [Request([Message("user", prompt)], max_new_tokens=new_tokens, seed=seed)
                for seed in range(n)]
    for res in (decode(requests) if decode else map(engine.generate, requests)):
        counts[index[tuple(res.tokens)]] += 1
        s = res.state.stats
        rejected += s.num_draft_tokens - s.num_accepted_tokens
    assert rejected > n // 10, "draft too close to the target: residual path barely exercised"

    # chi-square over cells with enough expected mass; pool the rest into one cell
    expected = exact * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] < 5:  # pooled cell too small: fold it into the largest
        obs, exp = obs[:-1].clone(), exp[:-1].clone()
        obs[exp.argmax()] += counts[~big].sum()
        exp[exp.argmax()] += expected[~big].sum()
    exp = exp * obs.sum() / exp.sum()
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3
    return prompt_ids, exact


@pytest.mark.parametrize("params,gamma", [(SamplingParams(1.0), 2), (SamplingParams(0.8, top_p=0.9), 3)])
def test_first_tokens_follow_target_distribution(tiny_pair, params, gamma):
    target, draft = tiny_pair
    drafter = create_drafter("chain", draft=draft, sampling=params, drafting_input="text")
    engine = SpeculativeEngine(target, drafter, gamma, params)
    prompt_ids, exact = _assert_samples_follow_target(engine, target, params)
    # the draft's own distribution is clearly different (so the test could fail)
    _, draft_exact = _exact_distribution(draft, prompt_ids, params)
    assert (exact - draft_exact).abs().sum() > 0.3


@pytest.mark.parametrize("with_twig", [False, True])
def test_twig_first_tokens_follow_target_distribution(tiny_pair, with_twig):
    """Self-speculation at T > 0: the draft is layers[:1] of the 2-layer target + its head
    (layer-skip) or + a random 1-layer twig; its q must be what the tokens were drawn from."""
    target, _ = tiny_pair
    params = SamplingParams(1.0)
    twig = None
    if with_twig:
        torch.manual_seed(11)
        cfg = LlamaConfig(**{**target.model.config.to_dict(), "num_hidden_layers": 1})
        twig = LlamaForCausalLM(cfg).eval()
    drafter = create_drafter("twig", target=target, sampling=params, layers=1, twig=twig, threshold=0.0)
    _assert_samples_follow_target(SpeculativeEngine(target, drafter, 2, params), target, params, n=1500)


@pytest.mark.parametrize("batch_size,gamma", [(4, 2), (7, 3)])
def test_batched_first_tokens_follow_target_distribution(tiny_pair, batch_size, gamma):
    """Batched speculative sampling (SpeculativeEngine.run): every row's samples follow the
    target's distribution, with rows at different accepted lengths in one batch."""
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    drafter = create_drafter("chain", draft=draft, sampling=params, drafting_input="text")
    engine = SpeculativeEngine(target, drafter, gamma, params, batch_size)

    def decode(requests):
        for _, res in engine.run(requests, lambda r: r):
            assert not isinstance(res, Exception), res
            yield res

    _assert_samples_follow_target(None, target, params, n=1500, decode=decode)


@pytest.mark.parametrize("top_k,total,depth", [(2, 6, 3), (3, 12, 3), (4, 30, 2)])
def test_tree_first_tokens_follow_target_distribution(tiny_pair, top_k, total, depth):
    """Multi-candidate speculative sampling over draft trees (siblings drawn without
    replacement, recursive rejection): the emitted tokens follow the target's distribution
    for several branching factors."""
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    drafter = create_drafter("tree", draft=draft, sampling=params, drafting_input="text", depth=depth,
                             top_k=top_k, total_tokens=total)
    _assert_samples_follow_target(SpeculativeEngine(target, drafter, depth, params), target,
                                  params, n=1500)


@pytest.mark.parametrize("method,kwargs", [
    ("tree", dict(policy="static", depth=3, top_k=3, total_tokens=9)),
    ("adt", dict(cols=2, depth=2, top_k=2, total_tokens=12,
                 adaptive=dict(beta=0.5, step_depth=1, step_top_k=2))),
])
def test_tree_shape_policies_follow_target_distribution(tiny_pair, method, kwargs):
    """Static trees and ADT-Tree (shapes chosen from earlier rounds' acceptance) keep the
    emitted tokens distributed as the target's."""
    target, draft = tiny_pair
    params = SamplingParams(1.0)
    drafter = create_drafter(method, draft=draft, sampling=params, drafting_input="text", **kwargs)
    gamma = 8 if method == "adt" else kwargs["depth"]
    engine = SpeculativeEngine(target, drafter, gamma, params)
    _assert_samples_follow_target(engine, target, params, n=1500)


@pytest.mark.parametrize("tree", [None, (3, 2, 6)])
def test_hidden_head_follows_target_distribution(tiny_pair, tree):
    """The hidden-state head (HiViS/Sparrow) at T > 0, as a chain and as a tree: its first
    proposal is drawn from the target's own prefill distribution (q = p), the next ones from
    a random head on the target's hidden states; the emitted tokens follow the target."""
    from vlmspec_cli.drafters.hidden import TreeSettings
    from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead, HiddenHeadConfig

    target, _ = tiny_pair
    params = SamplingParams(1.0)
    torch.manual_seed(5)
    head = HiddenDraftHead(HiddenHeadConfig(hidden_size=16, intermediate_size=32,
                                            num_attention_heads=2, vocab_size=VOCAB,
                                            max_steps=3)).eval()
    with torch.no_grad():  # a sharp, wrong-ish draft: many rejections
        head.fc.weight.mul_(8)
    settings = TreeSettings(*tree) if tree else None
    drafter = create_drafter("hidden", target=target, head=head, sampling=params, tree=settings)
    engine = SpeculativeEngine(target, drafter, tree[0] if tree else 2, params)
    _assert_samples_follow_target(engine, target, params, n=1500)
