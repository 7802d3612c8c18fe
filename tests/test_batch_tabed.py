"""TABED in batches (method ``tabed``, generation.batch_size > 1; drafters/ensemble.py):
each request's m drafting inputs are m rows of the batch's one ragged draft cache (B × m
draft rows, one draft forward per drafted position), and each request keeps its own
ensemble weights, learned from its own verified target distributions.

At temperature 0, batched at B = 3 and 8 with rows of different prompt lengths and token
limits (rows finish at different rounds and new ones join), every row emits what the same
request decoded alone emits, with the same proposals accepted and the same weights block by
block (its weights' whole trajectory, and its --trace lines); at T > 0 the same draws, each
row's from its own generators. ``drafting.length: auto`` chooses k per row and stays the
target's greedy decoding; the CLI's records at --batch-size 3 equal B = 1's, and --out
resumes; a LLaVA-NeXT target and a Qwen2-VL one (M-RoPE) batch too."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from test_batch import _batched, requests_  # noqa: F401  (requests_: the fixture)
from test_batch_length import Recording
from vlmspec_cli.cli import cli
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.runtime.length.draft_length import AutoGamma
from vlmspec_cli.runtime.models.loading import use_fast_path
from vlmspec_cli.runtime.round.engine import SpeculativeEngine
from vlmspec_cli.runtime.round.verify import SamplingParams

GREEDY = SamplingParams(0.0)
MTCP = ["multimodal", "text", "caption", "pooled"]


@pytest.fixture
def draft_path(request, zoo_draft):
    """The draft with the fast path on (static caches) or off (transformers caches)."""
    use_fast_path(zoo_draft, request.param)
    yield request.param
    use_fast_path(zoo_draft, "auto")


def _engine(target, draft, captioner, inputs, batch_size=1, sampling=GREEDY, gamma=4,
            trace=None, **weights):
    drafter = create_drafter("tabed", draft=draft, sampling=sampling, inputs=inputs,
                             captioner=captioner, image_token=target.adapter.image_token(target),
                             trace=trace, **weights)
    return SpeculativeEngine(target, drafter, gamma, sampling, batch_size)


def _close(a: list[list[float]], b: list[list[float]]) -> bool:
    """Two weight trajectories (rounded to 4 places) the same, block by block: a batch's
    draft forward sums in another order than a request's alone, so a weight may differ in
    its last place."""
    return len(a) == len(b) and all(
        len(x) == len(y) and all(abs(u - v) <= 2e-4 for u, v in zip(x, y)) for x, y in zip(a, b))


def _check_rows_equal_alone(results, refs, batch_size, live, n_inputs):
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from its decoding alone"
        s, r = res.state.stats, ref.state.stats
        # the same proposals, accepted the same: its rows' draft cache forgot exactly what
        # the request's own forgets, or the draft would propose differently
        assert (s.num_accepted_tokens, s.num_drafts, s.num_draft_tokens) == \
            (r.num_accepted_tokens, r.num_drafts, r.num_draft_tokens), f"request {i}"
        if n_inputs > 1:   # its own weights, block by block, and where they ended
            got, want = s.ensemble["block_weights"], r.ensemble["block_weights"]
            assert got and _close(got, want), f"request {i}: {got} != {want}"
            final = res.state.drafter_state.weights.current().tolist()
            assert _close([final], [ref.state.drafter_state.weights.current().tolist()]), i
    assert max(live) == min(batch_size, len(refs)) - 1            # the batch was full
    if batch_size < len(refs):                                      # and rows joined mid-way
        assert any(0 < n for n in live[batch_size:])
    assert sum(r.state.stats.num_accepted_tokens for r in results) > 0


@pytest.mark.parametrize("inputs,weights,batch_size,draft_path", [
    (["multimodal", "text"], dict(policy="grid"), 3, "on"),
    (["multimodal", "text"], dict(policy="grid", window=4, distance="tvd"), 8, "off"),
    (MTCP, dict(policy="softmax"), 8, "on"),
    (["text", "pooled"], dict(policy="grid", grid=4), 3, "off"),
    (["caption", "multimodal", "pooled"], dict(policy="static"), 3, "on"),
    (["pooled"], dict(policy="grid"), 8, "on"),              # one member: a chain
], indirect=["draft_path"])
def test_batched_tabed_equals_each_request_alone(zoo_target, zoo_draft, zoo_captioner,
                                                 requests_, inputs, weights, batch_size,
                                                 draft_path):
    refs = [_engine(zoo_target, zoo_draft, zoo_captioner, inputs, **weights).generate(r)
            for r in requests_]
    engine = _engine(zoo_target, zoo_draft, zoo_captioner, inputs, batch_size, **weights)
    results, live = _batched(engine, requests_)
    _check_rows_equal_alone(results, refs, batch_size, live, len(inputs))
    if weights["policy"] != "static" and len(inputs) > 1:
        # the rows' weights are their own: in some block two requests weighed differently
        blocks = [r.state.stats.ensemble["block_weights"] for r in results]
        assert any(len({tuple(b[j]) for b in blocks if len(b) > j}) > 1 for j in range(1, 4))


def test_batched_tabed_traces_each_request_as_alone(zoo_target, zoo_draft, zoo_captioner,
                                                    requests_):
    """--trace in a batch: each request's block lines (interleaved with the other rows')
    are the lines it writes alone, and its record's weights."""
    reqs = [replace(r, request_id=f"r{i}") for i, r in enumerate(requests_)]
    inputs = ["multimodal", "text", "pooled"]
    alone, batched = [], []
    for r in reqs:
        _engine(zoo_target, zoo_draft, zoo_captioner, inputs, trace=alone.append).generate(r)
    engine = _engine(zoo_target, zoo_draft, zoo_captioner, inputs, 4, trace=batched.append)
    for r, res in engine.run(reqs, lambda r: r):
        mine = [t for t in batched if t["request"] == r.request_id]
        assert [t["weights"] for t in mine] == res.state.stats.ensemble["block_weights"]

    def lines(trace, rid):
        return [(t["block"], t["drafted"], t["accepted"], t["inputs"]) for t in trace
                if t["request"] == rid]

    assert len(batched) == len(alone) > len(reqs)
    assert batched != alone        # the rows' lines interleave: the batch really ran together
    for r in reqs:
        assert lines(batched, r.request_id) == lines(alone, r.request_id), r.request_id
        assert _close([t["weights"] for t in batched if t["request"] == r.request_id],
                      [t["weights"] for t in alone if t["request"] == r.request_id])


class _FailsOn:
    """A captioner that fails on one image (the request's drafter prefill fails after its
    target row joined the batch)."""

    def __init__(self, captioner, image) -> None:
        self.captioner, self.image = captioner, image

    def submit(self, images):
        if any(im is self.image for im in images):
            raise ValueError("cannot caption this one")
        return self.captioner.submit(images)


def test_a_request_whose_drafting_fails_leaves_the_batch_going(zoo_target, zoo_draft,
                                                               zoo_captioner, requests_):
    reqs = requests_[:6]
    bad = reqs[2].images[0]
    inputs = ["caption", "text"]
    captioner = _FailsOn(zoo_captioner, bad)
    engine = _engine(zoo_target, zoo_draft, captioner, inputs, 3)
    outcomes = {id(r): res for r, res in engine.run(reqs, lambda r: r)}
    failed = [r for r in reqs if any(im is bad for im in r.images)]
    assert failed and all(isinstance(outcomes[id(r)], ValueError) for r in failed)
    rest = [r for r in reqs if r not in failed]
    refs = [_engine(zoo_target, zoo_draft, zoo_captioner, inputs).generate(r) for r in rest]
    for r, ref in zip(rest, refs):
        res = outcomes[id(r)]
        assert res.tokens == ref.tokens and _close(res.state.stats.ensemble["block_weights"],
                                                   ref.state.stats.ensemble["block_weights"])


def test_batched_tabed_samples_as_each_request_alone(zoo_target, zoo_draft, zoo_captioner,
                                                     requests_):
    """T > 0: a row draws its proposals from its own mixture with its own draft generator
    and is verified with its own target generator: the same tokens, proposals and weights
    as the request alone (whose law test_tabed.py checks against the target's)."""
    params = SamplingParams(0.9, top_p=0.95)
    reqs = requests_[:7]
    kw = dict(policy="softmax", sampling=params)
    refs = [_engine(zoo_target, zoo_draft, zoo_captioner, MTCP, **kw).generate(r) for r in reqs]
    results, live = _batched(_engine(zoo_target, zoo_draft, zoo_captioner, MTCP, 3, **kw), reqs)
    _check_rows_equal_alone(results, refs, 3, live, len(MTCP))
    assert sum(r.state.stats.num_draft_tokens - r.state.stats.num_accepted_tokens
               for r in results) > 0          # some proposals were rejected: residuals drawn


@pytest.mark.parametrize("batch_size", [3, 8])
def test_auto_length_rows_equal_the_target_alone(zoo_target, zoo_draft, zoo_captioner,
                                                 requests_, batch_size):
    """``drafting.length: auto``: each row chooses its k by its own length model (per row,
    as for chain: round_policy.AutoLength.admit), and each still emits the target's own
    greedy tokens, its weights a vector per block it drafted."""
    plain = SpeculativeEngine(zoo_target, create_drafter("none"), 1, GREEDY)
    refs = [plain.generate(r) for r in requests_]
    engine = _engine(zoo_target, zoo_draft, zoo_captioner, ["multimodal", "text"], batch_size,
                     gamma=6)
    drafter = engine.drafter
    policy = Recording(AutoGamma(6, feed_size=drafter.feed_size), batch=True)
    engine.use_policy(policy)
    results, live = _batched(engine, requests_)
    assert max(live) == min(batch_size, len(requests_)) - 1
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.tokens == ref.tokens, f"request {i} differs from the target alone"
        got = res.state.stats.draft_length
        assert got is not None and sum(got["gamma_hist"]) == \
            got["rounds_drafted"] + got["rounds_plain"]
        assert len(res.state.stats.ensemble["block_weights"]) == got["rounds_drafted"]
    assert any(len(set(ks.values())) > 1 for ks in policy.rounds if len(ks) > 1)


def _records(output: str) -> dict[str, dict]:
    return {r["input"]: r for r in map(json.loads, output.splitlines())}


def _shape(record: dict) -> set:
    return set(record) | {f"stats.{k}" for k in record["stats"]}


def test_cli_tabed_batch_size_records_trace_and_resume(tmp_path):
    """`vlmspec caption folder -m tabed --batch-size 3` (the tabed profile: MTCP with
    captions, fixed γ) writes B = 1's records: outputs, their shape, each input's weights
    block by block and its --trace lines; --compare finds them identical to the target
    alone; --out resumes, and a record removed is decoded again."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, (_, image) in enumerate(fresh_scenes(5, seed=611)):
        image.save(folder / f"s{i}.png")
    args = ["caption", str(folder), "--json", "-q", "--max-new-tokens", "16", "-p",
            "tinyworld-tabed", "-m", "tabed"]
    runner = CliRunner()
    one = runner.invoke(cli, args)
    trace = tmp_path / "trace.jsonl"
    many = runner.invoke(cli, args + ["--batch-size", "3", "--compare", "--trace", str(trace)])
    assert one.exit_code == 0 and many.exit_code == 0, many.output
    a, b = _records(one.stdout), _records(many.stdout)
    assert set(a) == set(b) and len(a) == 5
    blocks = [json.loads(line) for line in trace.read_text().splitlines()]
    for key in a:
        assert a[key]["output"] == b[key]["output"] and b[key]["compare"]["identical"]
        assert _shape(a[key]) == _shape(b[key]) - {"compare"}
        ens_a, ens_b = a[key]["stats"]["ensemble"], b[key]["stats"]["ensemble"]
        assert ens_b["inputs"] == MTCP and _close(ens_a["block_weights"], ens_b["block_weights"])
        assert [t["weights"] for t in blocks if t["request"] == key] == ens_b["block_weights"]
    out = tmp_path / "caps.jsonl"
    batch = args + ["--batch-size", "3", "--out", str(out)]
    first = runner.invoke(cli, batch)
    again = runner.invoke(cli, batch)
    assert first.exit_code == 0 and again.exit_code == 0 and again.stdout == "", again.output
    lines = out.read_text().splitlines()
    assert len(lines) == 5
    out.write_text("\n".join(lines[1:]) + "\n")
    redo = runner.invoke(cli, batch)
    assert redo.exit_code == 0, redo.output
    assert list(_records(redo.stdout)) == [json.loads(lines[0])["input"]]
    kept = {r["input"]: r["output"] for r in map(json.loads, out.read_text().splitlines())}
    assert kept == {k: r["output"] for k, r in a.items()}


FAMILY_CASES = {   # family → the drafting inputs its draft can batch
    "llava_next": [["multimodal", "text"]],    # anyres images embedded, beside a text row
    # 3-D positions: the image read as the target reads it, one input alone; or two text rows
    "qwen2_vl": [["multimodal"], ["text", "caption"]],
}


@pytest.fixture(scope="module", params=sorted(FAMILY_CASES))
def family_models(request, tmp_path_factory):
    from test_batch_families import FAMILIES

    build = FAMILIES[request.param][0]
    root = tmp_path_factory.mktemp(request.param)
    return request.param, build(root / "target", seed=1), build(root / "draft", seed=2, layers=1)


@pytest.mark.parametrize("batch_size", [3, 8])
def test_families_batch_tabed_as_alone(family_models, batch_size):
    """TABED on a LLaVA-NeXT target (its M and T rows in the batch's draft cache) and a
    Qwen2-VL one (the multimodal row read with its own prompt's rope offset, a video among
    the requests; or its text and caption rows): rows of different lengths equal each
    request alone, with its weights. The draft is the target itself, so proposals are
    accepted and weights move."""
    from families import family_session
    from test_batch_families import _requests

    family, target, _ = family_models
    for inputs in FAMILY_CASES[family]:
        session = family_session(target, target, "tabed", f"generation.batch_size={batch_size}",
                                 f"drafting.inputs=[{','.join(inputs)}]", "drafting.gamma=3")
        # a video has no caption (the captioner reads images): not for input C, alone either
        reqs = [r for r in _requests(family) if "caption" not in inputs or not r.videos]
        singles = [session.engine.generate(r) for r in reqs]
        results, live = _batched(session.batched_engine(), reqs)
        _check_rows_equal_alone(results, singles, batch_size, live, len(inputs))
