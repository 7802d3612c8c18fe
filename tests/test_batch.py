"""Batched decoding (B > 1, SpeculativeEngine.run): at temperature 0 every row's output equals
that request decoded alone, with prompts of different lengths, rows finishing at different
times, rows leaving and new requests joining; and the ragged cache underneath keeps each
row's attention exactly what it would be alone."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from conftest import fresh_scenes
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.fast.ragged import RaggedCache
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import SamplingParams
from vlmspec_cli.zoo import world

GREEDY = SamplingParams(0.0)


@pytest.fixture(scope="module")
def requests_():
    """Different prompt lengths (1 or 2 images, short and long prompts, a text-only turn)
    and different token limits, so rows finish at different rounds."""
    reqs = []
    prompts = [world.CAPTION_PROMPTS[0], "What colour is the background?",
               world.CAPTION_PROMPTS[1], "how many shapes are there?"]
    for i, (_, image) in enumerate(fresh_scenes(10, seed=4242)):
        images = (image, image) if i % 4 == 1 else (image,)
        reqs.append(Request([Message("user", prompts[i % 4], images)],
                            max_new_tokens=(40, 9, 25, 3)[i % 4], seed=i))
    reqs.append(Request([Message("user", "say something about shapes.")], max_new_tokens=20))
    return reqs


def _single(target, draft, variant, gamma, reqs):
    if draft is None:
        engine = SpeculativeEngine(target, create_drafter("none"), 1, GREEDY)
    else:
        drafter = create_drafter("chain", draft=draft, sampling=GREEDY, drafting_input=variant,
                                 image_token=target.adapter.image_token(target))
        engine = SpeculativeEngine(target, drafter, gamma, GREEDY)
    return [engine.generate(r) for r in reqs]


def _batched(engine, reqs):
    """Run the batch; also record how many rows were live at each admission."""
    live_at_admission = []
    live = set()

    def admit(r):
        live_at_admission.append(len(live))
        live.add(id(r))
        return r

    out = {}
    for r, res in engine.run(reqs, admit):
        assert not isinstance(res, Exception), res
        live.discard(id(r))
        out[id(r)] = res
        s = res.state.stats  # stats add up per row
        assert s.new_tokens == s.num_accepted_tokens + s.num_drafts == len(res.tokens)
        assert s.num_accepted_tokens <= s.num_draft_tokens
    return [out[id(r)] for r in reqs], live_at_admission


def batched_equals_alone(session, reqs, alone, batch_size: int, label: str) -> list:
    """The session's batch over ``reqs`` against each request decoded alone by the same
    session and against ``alone`` (target-only's tokens): the same tokens and the same
    proposals (accepted and drafted counts: each row's draft state is its own); the batch
    was full and rows joined mid-way. Returns the batch's results."""
    singles = [session.engine.generate(r) for r in reqs]
    results, live = _batched(session.batched_engine(), reqs)
    for i, (res, single) in enumerate(zip(results, singles)):
        assert res.tokens == single.tokens == alone[i], f"{label} {i}"
        assert (res.state.stats.num_accepted_tokens, res.state.stats.num_drafts) == \
            (single.state.stats.num_accepted_tokens, single.state.stats.num_drafts), i
    assert max(live) == min(batch_size, len(reqs)) - 1       # the batch was full
    if batch_size < len(reqs):                                 # and rows joined mid-way
        assert any(n > 0 for n in live[batch_size:])
    return results


@pytest.mark.parametrize("variant,gamma,batch_size", [
    ("multimodal", 5, 3), ("multimodal", 3, 8), ("text", 5, 4), ("text", 1, 2)])
def test_batched_chain_equals_each_request_alone(zoo_target, zoo_draft, requests_, variant,
                                                 gamma, batch_size):
    refs = _single(zoo_target, zoo_draft, variant, gamma, requests_)
    drafter = create_drafter("chain", draft=zoo_draft, sampling=GREEDY, drafting_input=variant,
                             image_token=zoo_target.adapter.image_token(zoo_target))
    engine = SpeculativeEngine(zoo_target, drafter, gamma, GREEDY, batch_size)
    results, live = _batched(engine, requests_)
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from its single decoding"
        # the same proposals as alone: the shared draft cache forgot exactly the rejected
        # (and over-fed) tokens, or the draft would propose differently and accept less
        assert (res.state.stats.num_accepted_tokens, res.state.stats.num_drafts) == \
            (ref.state.stats.num_accepted_tokens, ref.state.stats.num_drafts), f"request {i}"
    # the batch really was full, and requests joined while others were still decoding
    assert max(live) == min(batch_size, len(requests_)) - 1
    if batch_size < len(requests_):
        assert any(0 < n for n in live[batch_size:])
    assert sum(r.state.stats.num_accepted_tokens for r in results) > 0


def test_batched_target_only_equals_each_request_alone(zoo_target, requests_):
    refs = _single(zoo_target, None, None, 1, requests_)
    results, _ = _batched(SpeculativeEngine(zoo_target, None, 5, GREEDY, 4), requests_)
    assert [r.tokens for r in results] == [r.tokens for r in refs]


def test_a_request_that_fails_to_start_leaves_the_batch_going(zoo_target, zoo_draft, requests_):
    reqs = requests_[:4]
    engine = SpeculativeEngine(zoo_target, create_drafter("chain", draft=zoo_draft, sampling=GREEDY,
                                                          drafting_input="text"), 3, GREEDY, 2)

    def admit(r):
        if r is reqs[1]:
            raise ValueError("cannot read this one")
        return r

    outcomes = {id(r): res for r, res in engine.run(reqs, admit)}
    assert isinstance(outcomes[id(reqs[1])], ValueError)
    refs = _single(zoo_target, zoo_draft, "text", 3, [reqs[0], reqs[2], reqs[3]])
    assert [outcomes[id(r)].tokens for r in (reqs[0], reqs[2], reqs[3])] == \
        [r.tokens for r in refs]


@pytest.fixture(params=["off", "on", "compiled"])
def draft_on_path(request, zoo_draft):
    """The draft with the fast path off (DynamicCache rows), on (a StaticKVCache), and on
    with compiled steps (runtime.compile: padded rows, per-row positions)."""
    from vlmspec_cli.runtime.models.loading import use_fast_path
    use_fast_path(zoo_draft, "off" if request.param == "off" else "on")
    if request.param == "compiled":
        from vlmspec_cli.runtime.fast.compiled_step import set_compiled
        set_compiled(zoo_draft.fast)
    yield zoo_draft
    use_fast_path(zoo_draft, "auto")


def test_ragged_cache_rows_attend_as_if_alone(draft_on_path):
    """Rows of different lengths, fed different numbers of tokens, rolled back by different
    amounts, compacted and dropped: each row's logits match a forward of its own tokens,
    with the fast path off and on."""
    from vlmspec_cli.runtime.static_cache import StaticKVCache
    lm = draft_on_path
    tok = lm.tokenizer
    texts = ["a red circle", "the background is blue and there is a large square",
             "how many"]
    seqs = [tok(t)["input_ids"] for t in texts]
    cache = RaggedCache(lm)
    for s in seqs:
        single = lm.adapter.new_cache(lm, static=False)
        lm.adapter.prefill(lm, {"input_ids": torch.tensor([s])}, single)
        cache.add_row(single, len(s))
    assert cache.width == max(map(len, seqs))

    def alone(ids):
        with torch.no_grad():
            return lm.model(input_ids=torch.tensor([ids])).logits[0]

    feeds = [[5, 6, 7, 8], [9], []]
    outs = cache.feed(feeds)
    for s, f, o in zip(seqs, feeds, outs):
        if f:
            torch.testing.assert_close(o, alone(s + f)[-len(f):], atol=1e-4, rtol=1e-4)
    seqs = [s + f for s, f in zip(seqs, feeds)]
    cache.rollback([3, 0, 0])          # row 0 forgets 6, 7, 8: a hole of 3 slots
    seqs[0] = seqs[0][:-3]
    for _ in range(3):                 # grow the waste until compaction runs
        feeds = [[11], [], [12, 13]]
        outs = cache.feed(feeds)
        cache.rollback([1, 0, 1])
        for s, f, o in zip(seqs, feeds, outs):
            if f:
                torch.testing.assert_close(o, alone(s + f)[-len(f):], atol=1e-4, rtol=1e-4)
        seqs = [seqs[0], seqs[1], seqs[2] + [12]]
    assert cache.width < max(map(len, seqs)) + 6, "compaction never reclaimed the holes"
    assert cache.next_pos.tolist() == [len(s) for s in seqs]
    before = cache.width
    cache.keep_rows([0, 2])            # the longest row leaves: the width shrinks to fit
    seqs = [seqs[0], seqs[2]]
    longest = max(map(len, seqs))
    assert cache.width < before and longest <= cache.width <= longest / 0.75
    outs = cache.feed([[14], [15]])
    for s, f, o in zip(seqs, [[14], [15]], outs):
        torch.testing.assert_close(o, alone(s + f)[-1:], atol=1e-4, rtol=1e-4)
    assert isinstance(cache.cache, StaticKVCache) == (lm.fast is not None)


def _records(result):
    return {r["input"]: r for r in map(json.loads, result.stdout.splitlines())}


def test_cli_batch_size_same_outputs_and_bad_inputs(tmp_path):
    images = []
    for i, (_, image) in enumerate(fresh_scenes(5, seed=77)):
        images.append(tmp_path / f"s{i}.png")
        image.save(images[-1])
    (tmp_path / "empty.png").write_bytes(b"")
    args = ["caption", str(tmp_path), "--json", "-q", "--max-new-tokens", "24"]
    runner = CliRunner()
    one = runner.invoke(cli, args)
    many = runner.invoke(cli, args + ["--batch-size", "3", "--compare"])
    assert one.exit_code == 1 and many.exit_code == 1, many.output
    a, b = _records(one), _records(many)
    assert set(a) == set(b) and len(a) == 6
    for key in a:
        assert a[key]["output"] == b[key]["output"] and a[key]["error"] == b[key]["error"]
    assert "empty" in b[str(tmp_path / "empty.png")]["error"]
    assert all(r["compare"]["identical"] for r in b.values() if r["error"] is None)


def test_cli_batch_size_rejects_methods_that_decode_one_at_a_time(tmp_path, one_at_a_time):
    res = CliRunner().invoke(cli, ["caption", "x.png", "--batch-size", "2", "--method",
                                   one_at_a_time])
    assert res.exit_code == 2
    assert "batch_size" in res.output and f"'{one_at_a_time}' decodes one request" in res.output
