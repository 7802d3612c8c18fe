"""--method's help read from the methods' source (vlmspec_cli/method_catalogue.py) says what
the imported registry says, and showing a command's --help imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlmspec_cli import method_catalogue
from vlmspec_cli.drafters import base, method_names

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("task", ["caption", "video", "image", None])   # None: calibrate, profile
def test_the_catalogue_reads_what_the_registry_holds(task):
    assert method_catalogue.method_help(task) == base.method_help(task)
    assert list(method_catalogue.catalogue()) == method_names()


def test_the_catalogue_follows_inheritance_and_import_order(tmp_path, monkeypatch):
    folder = tmp_path / "drafters"
    folder.mkdir()
    (folder / "base.py").write_text("class DraftingMethod:\n    tasks = ('caption',)\n    help = ''\n")
    (folder / "a.py").write_text("from vlmspec_cli.drafters.z import Z\n@register('a')\n"
                                 "class A(Z):\n    help = 'from z'\n")
    (folder / "z.py").write_text("@register('z')\nclass Z(DraftingMethod):\n"
                                 "    tasks: tuple = ('caption', 'video')\n    help = 'zed'\n")
    monkeypatch.setattr(method_catalogue, "DRAFTERS", folder)
    method_catalogue.catalogue.cache_clear()
    try:
        assert method_catalogue.catalogue() == {
            "z": {"tasks": ("caption", "video"), "help": "zed"},       # imported by a.py first
            "a": {"tasks": ("caption", "video"), "help": "from z"}}
    finally:
        method_catalogue.catalogue.cache_clear()


@pytest.mark.parametrize("command", ["caption", "describe-video", "generate-image", "calibrate",
                                     "profile", "bench"])
def test_help_imports_no_torch(command):
    """caption --help took 2.4-5.5 s: the methods' modules (torch, transformers) were
    imported to list them."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom vlmspec_cli.cli import cli\n"
            f"res = CliRunner().invoke(cli, [{command!r}, '--help'])\n"
            "assert res.exit_code == 0 and '--method' in res.output, res.output\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
