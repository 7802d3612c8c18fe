"""The docs site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, offline: every
link between pages and every anchor resolves (mkdocs.yml's ``validation`` turns broken ones
into warnings, --strict into a failure), every page of docs/ is in the nav. And the README
stays a front page: at most 400 lines, its links into docs/ pointing at pages that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import ROOT



def test_mkdocs_is_installed():
    """Not skipped when missing: a suite without mkdocs would check no link at all."""
    import importlib.util

    assert importlib.util.find_spec("mkdocs"), "mkdocs is in the test extra: pip install '.[test]'"


def _build(config, site):
    # no -q: mkdocs counts --strict's warnings only at the levels it logs (with -q a broken
    # link built with exit 0; test_a_broken_link_fails_the_build caught it)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300)


def test_the_site_builds_strict(tmp_path):
    res = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stderr
    for page in (ROOT / "docs").glob("*.md"):
        name = "" if page.stem == "index" else page.stem + "/"
        assert (tmp_path / "site" / name / "index.html").is_file(), page


def test_a_broken_link_fails_the_build(tmp_path):
    """The check can fail: a copy of the site with one link to a page that is not there,
    and one to an anchor no heading makes."""
    for bad in ("[gone](no-such-page.md)", "[gone](safety.md#no-such-heading)"):
        copy = tmp_path / bad.split("(")[1][:7]
        shutil.copytree(ROOT / "docs", copy / "docs")
        shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
        page = copy / "docs" / "captioning.md"
        page.write_text(page.read_text() + f"\nSee {bad}.\n")
        res = _build(copy / "mkdocs.yml", copy / "site")
        assert res.returncode != 0 and "no-such" in res.stderr, (bad, res.stderr)


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    for section in ("## Two commands", "## Quick start by task", "## Commands",
                    "## Your own models", "## Methods", "## Documentation"):
        assert f"\n{section}\n" in text, section
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", text)
    assert "docs/cli.md" in links and "ARCHITECTURE.md" in links
    for link in links:
        assert (ROOT / link).is_file(), f"README links {link}, which is not there"
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= {link.split("/")[-1] for link in links if link.startswith("docs/")}, \
        "a page of docs/ the README does not link"
