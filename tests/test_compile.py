"""``runtime.compile``: the fast path's steps through torch.compile (runtime/fast/compiled_step.py)
compute what the eager steps compute, decode the target's own tokens, compile once per
bucket (not per round), and ``auto`` compiles only where a measurement says it pays.

Compiling costs seconds per graph on CPU, so these tests use few buckets: a chain with
γ = 3 and a tree of 3 nodes both verify 4 rows, one graph."""

from __future__ import annotations

import pytest
import torch

from conftest import fresh_scenes
from test_fast_path import small_tree
from test_lossless import reference
from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.profile import HardwareSpec, load_profile
from vlmspec_cli.runtime.fast.compiled_step import bucket_for, decide, draft_pays, set_compiled
from vlmspec_cli.runtime.round.engine import SpeculativeEngine, eos_token_ids
from vlmspec_cli.runtime.models.loading import use_fast_path
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import SamplingParams

# `vlmspec profile` timed briefly on one thread (the thread search has its own test)
QUICK = ("--repeats", "3", "--threads", "1")

GREEDY = SamplingParams(0.0)


@pytest.fixture(scope="module")
def compiled(zoo_target, zoo_draft):
    """Both models on the fast path with compiled steps, for the whole module: one
    ``CompiledSteps`` each, so the tests share their graphs (compiling is most of this
    module's time); back to auto afterwards."""
    for lm in (zoo_target, zoo_draft):
        use_fast_path(lm, "on")
        set_compiled(lm.fast)
    yield zoo_target, zoo_draft
    for lm in (zoo_target, zoo_draft):
        use_fast_path(lm, "auto")


def _eager(lm, fn):
    """``fn(lm)`` with the same fast path, its compiled steps set aside."""
    steps, lm.fast.compiled = lm.fast.compiled, None
    try:
        return fn(lm)
    finally:
        lm.fast.compiled = steps


def test_buckets():
    assert [bucket_for(n) for n in (1, 2, 3, 4, 5, 9, 13, 21, 64)] == [1, 2, 4, 4, 8, 12, 16, 24, 64]
    assert bucket_for(65) is None


def _forwards(lm):
    """A decoding step that also returns the last layer's states (the shipped hidden heads
    read hidden_states[-1]), a 3-token verification, rollback, a 4-node tree with its mask
    (bool, as trees pass it on the fast path)."""
    cache = lm.adapter.new_cache(lm)
    ids = torch.tensor([[1, 17, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]])
    lm.adapter.prefill(lm, {"input_ids": ids}, cache)
    outs = list(lm.adapter.extend_hidden(lm, torch.tensor([[50]]), cache, -1))
    outs.append(lm.adapter.extend(lm, torch.tensor([[51, 52, 53]]), cache))
    cache.crop(13)
    past = 13
    mask, pos = small_tree(past)
    outs.append(lm.adapter.extend(lm, torch.tensor([[60, 61, 62, 63]]), cache,
                                  attention_mask=mask == 0, position_ids=pos))
    assert cache.get_seq_length() == past + 4
    return outs


def test_compiled_forwards_match_eager_and_compile_once_per_bucket(compiled):
    target, _ = compiled
    steps = target.fast.compiled
    eager = _eager(target, _forwards)
    got = _forwards(target)
    for e, c in zip(eager, got):
        torch.testing.assert_close(c, e, atol=5e-5, rtol=1e-5)
    # one graph per (bucket, mask kind): 1 row and 3 rows (padded to 4) causal, with masks
    # built in the graph; the 4-node tree with its given mask
    assert {(1, False), (4, False), (4, True)} <= {(shape[1], shape[2] is not None)
                                                   for shape in steps.shapes}
    steps.warm, late = True, steps.late_compiles
    _forwards(target)
    assert steps.late_compiles == late, "a repeated step compiled again"
    # the warm-up compiles the shapes decoding uses: hidden_states[-1] as run() gets it
    known = set(steps.shapes)
    steps.warm_up([1], hidden_layer=-1)
    assert steps.shapes == known and steps.late_compiles == late


def test_padded_rows_compiled_match_eager(compiled):
    """Left-padded rows with a 0/1 mask (a TABED ensemble's draft rows)."""
    def rows(lm):
        cache = lm.adapter.new_cache(lm)
        embeds = lm.model.get_input_embeddings()(torch.tensor([[0, 0, 1, 17, 40], [1, 17, 40, 41, 42]]))
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        lm.adapter.prefill(lm, {"inputs_embeds": embeds, "attention_mask": mask,
                                "position_ids": pos}, cache)
        ids = torch.tensor([[70, 71, 72]]).expand(2, 3)
        mask2 = torch.cat([mask, mask.new_ones(2, 3)], dim=1)
        pos2 = torch.tensor([[3], [5]]) + torch.arange(3)[None]
        return lm.adapter.extend(lm, ids, cache, attention_mask=mask2, position_ids=pos2)
    _, draft = compiled
    torch.testing.assert_close(rows(draft), _eager(draft, rows), atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_compiled_steps_decode_the_target_greedy_tokens(compiled, method):
    target, draft = compiled
    requests = [Request([Message("user", "describe the image.", (image,))], max_new_tokens=20)
                for _, image in fresh_scenes(3, seed=616)]
    kwargs = {"depth": 3, "top_k": 2, "total_tokens": 3,
              "eos_ids": eos_token_ids(target)} if method == "tree" else {}
    drafter = create_drafter(method, draft=draft, sampling=GREEDY, drafting_input="multimodal",
                             image_token=target.adapter.image_token(target), **kwargs)
    engine = SpeculativeEngine(target, drafter, 3, GREEDY)
    accepted = 0
    for req in requests:
        res = engine.generate(req)
        assert res.tokens == reference(target, req)
        accepted += res.state.stats.num_accepted_tokens
    assert accepted > 0
    assert target.fast.compiled.shapes, "the target's steps did not run compiled"
    if method == "chain":   # greedy chains are drafted in one compiled call
        assert ("chain", 1, 3) in draft.fast.compiled.shapes


def test_auto_compiles_only_where_measured_and_worth_the_warm_up():
    measured = dict(target_ms=5.0, compiled_target_ms=2.5, compile_warmup_s=20.0)
    assert decide("off", HardwareSpec(**measured), 10**9) == (False, "runtime.compile is off")
    assert decide("on", HardwareSpec(), 1)[0] is True
    on, why = decide("auto", HardwareSpec(), 10**9)
    assert not on and "vlmspec profile --compile" in why
    on, why = decide("auto", HardwareSpec(target_ms=5.0, compiled_target_ms=6.0,
                                       compile_warmup_s=1.0), 10**9)
    assert not on and "slower" in why
    # 20 s of warm-up at 2.5 ms saved a token: 8001 tokens to break even
    on, why = decide("auto", HardwareSpec(**measured), 48)
    assert not on and "8001" in why
    assert decide("auto", HardwareSpec(**measured), 9000)[0] is True
    # the draft follows only where its own compiled step was measured faster
    assert draft_pays("on", HardwareSpec())
    assert not draft_pays("auto", HardwareSpec(draft_ms=0.5, compiled_draft_ms=0.6))
    assert draft_pays("auto", HardwareSpec(draft_ms=0.8, compiled_draft_ms=0.5))
    assert not draft_pays("auto", HardwareSpec(draft_ms=0.8, compiled_draft_ms=0.5), plain_steps=False)


def test_compile_needs_the_fast_path_and_the_key_is_checked():
    from vlmspec_cli.profile import ProfileError
    from vlmspec_cli.session import SessionError, validate_method
    with pytest.raises(ProfileError, match="runtime.compile"):
        load_profile("tinyworld-caption", ["runtime.compile=yes"])
    with pytest.raises(SessionError, match="runtime.compile: on .* needs runtime.fast_path"):
        validate_method(load_profile("tinyworld-caption", ["runtime.compile=on",
                                                           "runtime.fast_path=off"]))


def test_cli_plan_line_says_whether_steps_are_compiled(tmp_path):
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli
    _, image = fresh_scenes(1, seed=4)[0]
    path = tmp_path / "scene.png"
    image.save(path)
    runner = CliRunner()
    res = runner.invoke(cli, ["caption", str(path), "--set", "generation.max_new_tokens=8"])
    assert res.exit_code == 0, res.output
    # by default one short line (cli/detail.py); the reasons under -v
    assert "tinyworld-caption · chain (γ auto ≤ 12) · fast path on · " in res.stderr
    assert "compiled steps" not in res.stderr and "CPU threads" not in res.stderr
    res = runner.invoke(cli, ["caption", str(path), "--set", "generation.max_new_tokens=8", "-v"])
    assert res.exit_code == 0, res.output
    assert "compiled steps off (auto: not measured on this hardware" in res.stderr
    assert "profile tinyworld-caption: target zoo:tinyworld/" in res.stderr
    res = runner.invoke(cli, ["caption", str(path), "--compile", "on", "--set", "drafting.gamma=3",
                               "--set", "generation.max_new_tokens=8", "--verbose"])
    assert res.exit_code == 0, res.output
    assert "compiled steps on: target, draft (runtime.compile is on)" in res.stderr
    assert "compile warm-up:" in res.stderr


def test_profile_compile_measures_what_auto_reads(tmp_path):
    """`vlmspec profile --compile` writes the compiled step times and the warm-up as
    hardware keys; a profile that includes them lets auto decide from them."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli
    from vlmspec_cli.session import build_session
    hw = tmp_path / "hw.yaml"
    res = CliRunner().invoke(cli, ["profile", "--compile", *QUICK, "--warmup", "1",
                                   "--contexts", "64", "--set", "drafting.gamma=3",
                                   "--write", str(hw), "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    base = tmp_path / "base.yaml"
    base.write_text("include: [tinyworld-caption, hw.yaml]\nname: base\n")
    prof = load_profile(str(base))
    h = prof.hardware
    assert h.compiled_target_ms > 0 and h.compiled_draft_ms > 0 and h.compile_warmup_s > 0
    session = build_session(prof)
    on = session.plan_compile(10**7)
    pays = h.compiled_target_ms < h.target_ms
    assert on == pays and (session.target.fast.compiled is not None) == pays
    assert ("measured" in session.compile_reason) if pays else ("slower" in session.compile_reason)
    assert session.plan_compile(1) is False, "a one-token job never repays a warm-up"


def test_compile_cache_defaults_under_the_users_cache_directory(tmp_path):
    """Compiled kernels persist under $XDG_CACHE_HOME/vlmspec/inductor (set on import,
    before torch writes its temp-directory default); an explicit TORCHINDUCTOR_CACHE_DIR
    wins."""
    import os
    import subprocess
    import sys
    code = "import os, vlmspec_cli; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(tmp_path / "vlmspec" / "inductor")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(tmp_path / "mine")
    # a file where vlmspec's cache directory would go: left alone, torch's default stays
    del env["TORCHINDUCTOR_CACHE_DIR"]
    env["XDG_CACHE_HOME"] = str(tmp_path / "x")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "vlmspec").write_text("mine\n")
    code = "import os, vlmspec_cli; print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "None" and (tmp_path / "x" / "vlmspec").read_text() == "mine\n"


def test_a_file_where_the_compile_cache_goes_is_an_error_and_kept(tmp_path, monkeypatch):
    """`on` names the cache and why, in one line (exit 2); the file is left as it was."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli
    blocker = tmp_path / "cache"
    blocker.write_text("mine\n")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(blocker / "inductor"))
    _, image = fresh_scenes(1, seed=5)[0]
    image.save(tmp_path / "s.png")
    res = CliRunner().invoke(cli, ["caption", str(tmp_path / "s.png"), "--compile", "on"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "runtime.compile: on: the compile cache" in lines[0]
    assert blocker.read_text() == "mine\n"
