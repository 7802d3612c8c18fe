"""verify.py on synthetic distributions: greedy rules and the exactness of speculative
sampling (every emitted token is distributed as p, whatever q)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from vlmspec_cli.runtime.round.verify import (
    SamplingParams,
    align_vocab,
    probabilities,
    verify_greedy,
    verify_sampling,
)


def logits_from(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_greedy_longest_prefix_and_correction():
    # target argmax per position: 2, 0, 1, 3
    logits = torch.tensor([[0, 0, 9, 0], [9, 0, 0, 0], [0, 9, 0, 0], [0, 0, 0, 9]], dtype=torch.float)
    assert verify_greedy([2, 0, 1], logits) == (3, 3)      # all accepted + bonus
    assert verify_greedy([2, 1, 1], logits) == (1, 0)      # mismatch at 2nd: correction 0
    assert verify_greedy([3, 0, 1], logits) == (0, 2)      # first rejected
    assert verify_greedy([], logits[:1]) == (0, 2)         # no draft: the target's token


def test_probabilities_top_p_keeps_nucleus():
    logits = logits_from([[0.5, 0.3, 0.15, 0.05]])
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-5)
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=1.0))
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0.05]]), atol=1e-5)


def test_align_vocab_pads_and_truncates():
    q = torch.tensor([[0.5, 0.5]])
    assert align_vocab(q, 4).tolist() == [[0.5, 0.5, 0.0, 0.0]]
    assert align_vocab(torch.tensor([[0.2, 0.3, 0.5]]), 2).shape == (1, 2)


@pytest.mark.parametrize("case", ["disjoint-ish", "close", "draft-overconfident"])
def test_speculative_sampling_first_token_is_distributed_as_p(case):
    """Chi-square: the first emitted token (accepted draft or residual resample) follows p."""
    p_rows = {
        "disjoint-ish": [0.05, 0.05, 0.1, 0.4, 0.4],
        "close": [0.3, 0.25, 0.2, 0.15, 0.1],
        "draft-overconfident": [0.2, 0.2, 0.2, 0.2, 0.2],
    }[case]
    q_row = {
        "disjoint-ish": [0.6, 0.3, 0.05, 0.03, 0.02],
        "close": [0.25, 0.3, 0.2, 0.1, 0.15],
        "draft-overconfident": [0.92, 0.02, 0.02, 0.02, 0.02],
    }[case]
    params = SamplingParams(temperature=1.0)
    p = torch.tensor(p_rows)
    q = torch.tensor(q_row)
    target_logits = torch.log(torch.stack([p, p]))
    g_draft = torch.Generator().manual_seed(1)
    g_target = torch.Generator().manual_seed(2)
    n = 20000
    counts = torch.zeros(5)
    rejections = 0
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=g_draft))
        n_acc, tok = verify_sampling([x], q[None], target_logits, params, g_target)
        first = x if n_acc == 1 else tok
        rejections += n_acc == 0
        counts[first] += 1
    stat = chisquare(counts.numpy(), (p * n).numpy())
    assert stat.pvalue > 1e-3, (counts / n, p)
    assert rejections > 0  # the residual path was exercised
    # and sampling straight from q would have failed the same test
    assert chisquare((q * n).numpy(), (p * n).numpy()).pvalue < 1e-6


def test_speculative_sampling_accepts_everything_when_q_equals_p():
    p = torch.tensor([0.1, 0.2, 0.7])
    logits = torch.log(torch.stack([p, p, p]))
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n_acc, _ = verify_sampling([2, 1], torch.stack([p, p]), logits, SamplingParams(1.0), g)
        assert n_acc == 2
