"""Your own models, as the README's "Your own models" section walks them: a tiny
random-weight Qwen2.5-VL pair saved with ``save_pretrained`` next to a profile file that
names them by relative path, run from another directory through caption, describe-video
(the caption profile becomes a video one), profile, calibrate and a hidden-state head
trained for it. And the shipped heads and twigs: ``-m hidden`` / ``-m twig`` take the one
trained for the profile's target, or refuse one trained for another target."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from PIL import Image

from conftest import ROOT
from families import qwen2_5_vl
from vlmspec_cli.cli import cli

SHIPPED_DEFAULT = str(ROOT / "profiles" / "tinyworld-caption.yaml")   # the 32-layer target


def invoke(*argv):
    return CliRunner().invoke(cli, [str(a) for a in argv], catch_exceptions=False)


@pytest.mark.parametrize("method,key,shipped", [
    ("hidden", "hidden.model", "zoo:tinyworld/llava-deep-hidden"),
    ("twig", "twig.model", "zoo:tinyworld/llava-deep-twig")])
def test_method_takes_the_head_or_twig_trained_for_the_target(method, key, shipped):
    """The schema's default head and twig were trained on the 8-layer target; on the
    shipped default's 32-layer target, -m picks the ones shipped for it, and says so."""
    res = invoke("caption", ROOT / "examples" / "images", "-p", SHIPPED_DEFAULT, "-m", method,
                 "--dry-run")
    assert res.exit_code == 0, res.output
    section = res.stdout.split(f"\n{method}:\n", 1)[1]
    assert section.splitlines()[0].strip() == f"model: {shipped}"
    assert f"{key} zoo:tinyworld/llava-" in res.stderr and f"using {shipped}" in res.stderr


@pytest.mark.parametrize("method,hint", [("hidden", "python -m vlmspec_cli.zoo.hidden --target"),
                                         ("twig", "--set twig.model=none --set twig.layers=K")])
def test_method_refuses_a_head_or_twig_trained_for_another_target(tmp_path, method, hint):
    res = invoke("caption", ROOT / "examples" / "images", "--set", f"target.model={tmp_path}",
                 "-m", method, "--dry-run")
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert f"was trained for target zoo:tinyworld/llava-target, not {tmp_path}" in line
    assert hint in line
