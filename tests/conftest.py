"""Shared fixtures: the embedded tinyworld models, loaded once per test session."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# One intra-op thread: the tests' models are tiny, so a second thread buys nothing, and on
# a machine where other processes share the cores two threads wait on each other at every
# op (measured: 44 ms per request of the hidden-head chi-square test on one thread, 680 ms
# on two at load 8). Tests of thread plans set their own counts. VLMSPEC_TEST_THREADS
# overrides it (e.g. 2, to run the suite as it ran before).
SUITE_THREADS = int(os.environ.get("VLMSPEC_TEST_THREADS", "1"))
torch.set_num_threads(SUITE_THREADS)
# the same for the subprocesses the tests start (`vlmspec …`, bench/gpu.py --tiny: 76 s on
# two threads at load 9, 8.5 s on one); a thread plan they apply still sets its own counts
os.environ.setdefault("OMP_NUM_THREADS", str(SUITE_THREADS))

ROOT = Path(__file__).resolve().parents[1]
# The shipped caption and video profiles run deep targets (32 and 24 layers); under their
# names the suite runs the smaller targets those were grown from (tests/profiles/README.md).
# Subprocesses inherit this; tests of the shipped profiles load them by path.
TEST_PROFILES = Path(__file__).resolve().parent / "profiles"
os.environ["VLMSPEC_PROFILES"] = str(TEST_PROFILES)


@pytest.fixture(autouse=True)
def _torch_threads():
    """A profile with runtime.threads sets the process's thread count (session.py); the
    next test starts from the suite's count again."""
    yield
    if torch.get_num_threads() != SUITE_THREADS:
        torch.set_num_threads(SUITE_THREADS)


@pytest.fixture(scope="session")
def zoo_target():
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import load_model

    return load_model(ModelSpec(model="zoo:tinyworld/llava-target", device="cpu"), "target")


@pytest.fixture(scope="session")
def zoo_draft():
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import load_model

    return load_model(ModelSpec(model="zoo:tinyworld/llava-draft", device="cpu"), "draft")


def fresh_scenes(n: int, seed: int):
    """(scene, image) pairs the models never saw: the build trains on other seeds."""
    from vlmspec_cli.zoo import world

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        scene = world.sample_scene(rng)
        out.append((scene, world.render(scene)))
    return out


@pytest.fixture(scope="session")
def zoo_captioner():
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.captioner import Captioner
    from vlmspec_cli.runtime.models.loading import load_model

    return Captioner(load_model(ModelSpec(model="zoo:tinyworld/captioner", device="cpu"), "captioner"))


def assert_first_two_follow(results, joint: dict, runs: int) -> None:
    """χ² of the first two tokens of ``results`` (``runs`` decodes at T > 0 whose drafts
    a head proposed) against their exact law ``joint`` (token pair -> probability), and
    enough proposals rejected that the test could see a wrong residual."""
    from scipy.stats import chisquare

    counts, rejected = dict.fromkeys(joint, 0), 0
    for res in results:
        key = tuple(res.tokens[:2])
        if key in counts:
            counts[key] += 1
        rejected += res.state.stats.num_draft_tokens - res.state.stats.num_accepted_tokens
    assert rejected > runs // 10, "the head's proposals were barely rejected"
    big = [k for k in joint if joint[k] * runs >= 5]
    assert len(big) >= 3, "too flat or too peaked a law to test"
    obs = [counts[k] for k in big] + [runs - sum(counts[k] for k in big)]
    exp = [joint[k] * runs for k in big] + [runs * (1 - sum(joint[k] for k in big))]
    assert chisquare(obs, exp).pvalue > 1e-3


@pytest.fixture
def one_at_a_time(monkeypatch):
    """The name of a caption method that decodes one request at a time, registered for one
    test (the shipped ones batch, issue 61): test_method_plugin's toy, without ``batches``."""
    from test_method_plugin import RepeatLastToken
    from vlmspec_cli.drafters import base

    solo = type("Solo", (RepeatLastToken,), {"name": "solo", "batches": False})
    monkeypatch.setitem(base._REGISTRY, "solo", solo)
    return "solo"
