"""Noise that is not the user's business (issue 36): transformers' `past_key_values`
FutureWarning from vlmspec's own forwards, bitsandbytes' CPU-kernel notice, Ray's C++
core-worker ERROR line; a --dry-run that imported every transformers model class; a
`vlmspec profiles` table that cut paths short and had no task column."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import fresh_scenes
from vlmspec_cli.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.mark.parametrize("profile,sets", [
    ("tinyworld-caption", ["runtime.fast_path=off"]),                # prefill, extend
    ("tinyworld-caption", ["runtime.fast_path=off", "generation.batch_size=2"]),
    ("tinyworld-hidden", ["runtime.fast_path=off"]),                 # hidden states, the head
    ("tinyworld-twig", []),                                           # the split trunk's layers
    ("tinyworld-image", ["runtime.fast_path=off"]),                   # Janus' language model
])
def test_vlmspec_forwards_pass_the_cache_by_the_name_transformers_takes(profile, sets):
    """Every forward vlmspec calls with a cache names it as the installed transformers
    does (``cache`` from 5.2x, ``past_key_values`` in 5.17): no deprecation warning."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.runtime.request import Message, Request
    from vlmspec_cli.session import build_session

    session = build_session(load_profile(profile, sets + ["generation.max_new_tokens=6"]))
    image = fresh_scenes(1, seed=5)[0][1]
    if session.profile.task == "image":
        lm = session.target
        requests = [Request([Message("user", "a red circle")],
                            max_new_tokens=lm.adapter.num_image_tokens(lm))]
    else:
        requests = [Request([Message("user", "describe the image.", (image,))], max_new_tokens=6)
                    for _ in range(2)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values", category=FutureWarning)
        if session.profile.generation.batch_size > 1:
            results = [r for _, r in session.batched_engine().run(requests, lambda r: r)]
        else:
            results = [session.engine.generate(r) for r in requests]
    assert all(not isinstance(r, Exception) and r.tokens for r in results), results


def test_bitsandbytes_cpu_kernel_notice_is_filtered(caplog):
    from vlmspec_cli.cli.noise import silence_library_noise

    silence_library_noise()
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. "
                       "Please make sure you already `pip install kernels`", "No module named 'kernels'")
        logger.warning("something else bitsandbytes says")
    assert [r.getMessage() for r in caplog.records] == ["something else bitsandbytes says"]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs vlmspec[ray]")
def test_ray_core_worker_lines_are_not_shown(tmp_path):
    """Ray's C++ core worker writes an ERROR line about Ray Data's actor pool to descriptor
    2 on every --executor ray run; the records and the summary are unchanged."""
    fresh_scenes(1, seed=6)[0][1].save(tmp_path / "a.png")
    res = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(tmp_path / "a.png"),
                          "--executor", "ray", "--workers", "1", "--max-new-tokens", "6", "--json"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["error"] is None
    assert "core_worker" not in res.stderr and "] core_" not in res.stderr, res.stderr
    assert "Token authentication" not in res.stderr   # a local Ray's notice, not the user's
    assert "vlmspec summary" in res.stderr


@pytest.mark.parametrize("argv", [["caption", "examples/images/"],
                                  ["describe-video", "examples/videos/"],
                                  ["generate-image", "a red circle"]])
def test_dry_run_imports_no_transformers(argv):
    code = ("import sys\nfrom vlmspec_cli.cli import cli\n"
            "try:\n    cli(sys.argv[1:], standalone_mode=False)\nfinally:\n"
            "    print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'),"
            " file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code, *argv, "--dry-run"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# profile from")
    assert res.stderr.strip().splitlines()[-1] == "[]", res.stderr[-2000:]


def test_profiles_table_names_the_task_and_whole_paths():
    from vlmspec_cli.profile import list_profiles, load_profile

    res = CliRunner().invoke(cli, ["profiles"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    header = next(line for line in res.stderr.splitlines() if "name" in line and "path" in line)
    assert "task" in header
    lines = res.stderr.splitlines()
    for name, path, _ in list_profiles():
        row = next((line for line in lines if f" {name} " in line), None)
        assert row is not None and str(path) in row, (name, str(path), res.stderr)
        assert f" {load_profile(str(path)).task} " in row
