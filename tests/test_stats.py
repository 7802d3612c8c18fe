"""Invariant 3 (bookkeeping): the speculative counters add up."""

from __future__ import annotations

import pytest

from conftest import fresh_scenes
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.runtime.round.verify import SamplingParams


def check_invariants(s: SpecStats, tokens: list[int], gamma: int, max_new: int) -> None:
    assert s.num_accepted_tokens <= s.num_draft_tokens <= gamma * s.num_drafts
    # each round emits its accepted tokens plus one token of the target's
    assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(tokens)
    assert len(tokens) <= max_new
    assert sum(s.accept_len_hist) == s.num_drafts
    assert sum(k * c for k, c in enumerate(s.accept_len_hist)) == s.num_accepted_tokens
    assert sum(s.accepted_per_pos) == s.num_accepted_tokens
    # unconditional per-position counts: position i+1 accepted implies position i was
    assert all(a >= b for a, b in zip(s.accepted_per_pos, s.accepted_per_pos[1:]))
    for i, count in enumerate(s.accepted_per_pos):
        assert count == sum(s.accept_len_hist[i + 1:])
    assert s.mean_accept_len == pytest.approx(1 + s.num_accepted_tokens / s.num_drafts)
    assert 0.0 <= s.draft_accept_rate <= 1.0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("gamma", [1, 4])
def test_stats_add_up(zoo_target, zoo_draft, temperature, gamma):
    sampling = SamplingParams(temperature)
    drafter = create_drafter("chain", draft=zoo_draft, sampling=sampling, drafting_input="multimodal",
                             image_token=zoo_target.adapter.image_token(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, gamma, sampling)
    total = SpecStats()
    for i, (_, image) in enumerate(fresh_scenes(6, seed=7)):
        max_new = 5 + 7 * i  # some runs stop on the token limit, others on EOS
        res = engine.generate(Request([Message("user", "describe the image.", (image,))],
                                      max_new_tokens=max_new, seed=i))
        check_invariants(res.state.stats, res.tokens, gamma, max_new)
        total.merge(res.state.stats)
    assert total.num_drafts > 0 and total.num_accepted_tokens > 0
    assert total.new_tokens == total.num_accepted_tokens + total.num_drafts


def test_target_only_has_no_drafted_tokens(zoo_target):
    engine = SpeculativeEngine(zoo_target, create_drafter("none"), 1, SamplingParams())
    (_, image), = fresh_scenes(1, seed=3)
    res = engine.generate(Request([Message("user", "describe the image.", (image,))], max_new_tokens=12))
    s = res.state.stats
    assert s.num_draft_tokens == 0 and s.num_accepted_tokens == 0
    assert s.num_drafts == s.new_tokens == len(res.tokens)


def test_records_use_vllm_metric_names_and_old_records_still_read():
    """Records say mean_acceptance_length, draft_acceptance_rate and
    num_accepted_tokens_per_pos (vLLM's names; issue 36), in the same places the short
    names were; a record of the short names (an older run's Ray shard) reads the same."""
    s = SpecStats()
    for drafted, accepted in ((4, 4), (4, 1), (4, 0)):
        s.record_round(drafted, accepted, accepted + 1)
    d = s.to_dict()
    assert d["mean_acceptance_length"] == pytest.approx(1 + 5 / 3, abs=1e-4)
    assert d["draft_acceptance_rate"] == pytest.approx(5 / 12, abs=1e-4)
    assert d["num_accepted_tokens_per_pos"] == [2, 1, 1, 1]
    assert not {"mean_accept_len", "draft_accept_rate", "accepted_per_pos"} & set(d)
    keys = list(d)
    assert keys.index("num_accepted_tokens_per_pos") == keys.index("num_accepted_tokens") + 1
    old = {("accepted_per_pos" if k == "num_accepted_tokens_per_pos" else k): v for k, v in d.items()}
    for record in (d, old):
        assert SpecStats.from_dict(record).to_dict() == d
