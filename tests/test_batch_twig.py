"""Batched decoding with ``twig`` (TwigVLM self-speculation; issue 61): every row keeps its
own copy of the target's first K layers' cache (its trunk) and its twig cache, drafts from
them row by row, and the target verifies every row in one forward over the batch's ragged
cache. At temperature 0 each row emits what the same request decoded alone emits, with
the same proposals accepted (the row's trunk and twig read exactly the committed tokens),
for prompts of different lengths and rows that finish at different rounds, with a twig and
as layer-skip (``twig.model: none``); at T > 0 the tokens follow the target's law
(chi-square). Pruning (lossy) is refused in a batch, in one line, before anything loads."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from batch_cli import batch_equals_alone
from conftest import ROOT, assert_first_two_follow, fresh_scenes
from test_batch import _batched, requests_  # noqa: F401  (requests_: the fixture)
from test_batch_heads import joint_law
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.drafters.twig import PrunePlan
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.loading import load_model, load_twig, use_fast_path
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.round.verify import SamplingParams

GREEDY = SamplingParams(0.0)
PROFILE = ROOT / "profiles" / "tinyworld-twig.yaml"


@pytest.fixture(scope="module")
def deep():
    """The shipped twig profile's models: the 32-layer target and its twig on layer 2."""
    target = load_model(ModelSpec(model="zoo:tinyworld/llava-target-deep", device="cpu"), "target")
    return target, load_twig("zoo:tinyworld/llava-deep-twig", target)


def _engine(target, twig, gamma, batch_size=1, sampling=GREEDY, threshold=0.6, prune=None):
    drafter = create_drafter("twig", target=target, sampling=sampling, layers=2, twig=twig,
                             threshold=threshold, prune=prune)
    return SpeculativeEngine(target, drafter, gamma, sampling, batch_size)


def _check_equal_alone(target, twig, gamma, batch_size, reqs, threshold=0.6):
    refs = [_engine(target, twig, gamma, threshold=threshold).generate(r) for r in reqs]
    results, live = _batched(_engine(target, twig, gamma, batch_size, threshold=threshold),
                             reqs)
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from its single decoding"
        # the same proposals as alone: the row's trunk and twig kept exactly the committed
        # tokens (a draft that read a rejected token, or missed an accepted one, drafts
        # differently and accepts less)
        s, r = res.state.stats, ref.state.stats
        assert (s.num_accepted_tokens, s.num_drafts, s.num_draft_tokens) == \
            (r.num_accepted_tokens, r.num_drafts, r.num_draft_tokens), f"request {i}"
        # the row's own trunk holds the prompt and the committed tokens but the pending
        # one, as the request's target cache alone; its twig has read (or queued) as many
        st = res.state.drafter_state
        committed = ref.state.target_cache.get_seq_length(0)
        assert st.trunk.get_seq_length(0) == committed == st.prompt_len + len(res.tokens) - 1
        if twig is not None:
            unread = 0 if st.unread is None else st.unread.shape[1]
            assert st.twig_cache.get_seq_length(0) + unread == committed, f"request {i}"
    assert max(live) == min(batch_size, len(reqs)) - 1          # the batch was full
    if batch_size < len(reqs):                                   # and rows joined mid-way
        assert any(0 < n for n in live[batch_size:])
    assert sum(r.state.stats.num_accepted_tokens for r in results) > len(reqs)


@pytest.mark.parametrize("batch_size", [3, 8])
def test_batched_twig_equals_each_request_alone(deep, requests_, batch_size):
    target, twig = deep
    _check_equal_alone(target, twig, 5, batch_size, requests_)


@pytest.mark.parametrize("fast", ["off", "on"])
def test_batched_layer_skip_equals_each_request_alone(deep, requests_, fast):
    """``twig.model: none``: the target's own first K layers and head draft, on the fast
    path's split cache and off it (transformers caches)."""
    target, _ = deep
    use_fast_path(target, fast)
    try:
        _check_equal_alone(target, None, 3, 3 if fast == "off" else 8, requests_[:7],
                           threshold=0.0)
    finally:
        use_fast_path(target, "auto")


def test_pruned_twig_refuses_a_batch(deep):
    target, twig = deep
    engine = _engine(target, twig, 3, prune=PrunePlan(keep=4))
    with pytest.raises(ValueError, match="one request at a time"):
        engine.drafter.check_batch()


def test_batched_twig_samples_follow_the_targets_law(deep):
    """300 seeded requests of one image prompt decoded 8 rows at a time: the first token is
    the target's own, the second the twig's proposal verified in the batch's forward; the
    joint law of both is the target's (chi-square, as tests/test_batch_heads.py)."""
    target, twig = deep
    params, runs = SamplingParams(1.0), 300
    (_, image), = fresh_scenes(1, seed=515)
    messages = [Message("user", "describe the image.", (image,))]
    joint = joint_law(target, messages, params, runs)
    engine = _engine(target, twig, 2, batch_size=8, sampling=params, threshold=0.0)
    reqs = [Request(messages, max_new_tokens=(3, 5, 4)[seed % 3], seed=seed)
            for seed in range(runs)]
    assert_first_two_follow([res for _, res in engine.run(reqs, lambda r: r)], joint, runs)


def test_cli_twig_batch(tmp_path):
    """The shipped twig profile captions a folder at --batch-size 3 exactly as at 1 and as
    target-only (--compare), drafting.length auto choosing each row's k; the records keep
    their shape; --out resumes."""
    _, b = batch_equals_alone(tmp_path, ["--profile", str(PROFILE), "-m", "twig"])
    assert sum(r["stats"]["num_accepted_tokens"] for r in b.values()) > 0


def test_cli_pruned_twig_refuses_a_batch_in_one_line():
    """Pruning (lossy, opt-in) cannot batch: refused before anything loads, in one line."""
    res = CliRunner().invoke(cli, ["caption", "x.png", "--profile", str(PROFILE),
                                   "--batch-size", "2", "--set", "prune.keep=8"])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "one request at a time" in errors[0], res.output
    assert "--batch-size 1" in errors[0]
