"""No timing or speedup figure in vlmspec_cli's docstrings and comments unless it names the
recorded run that measured it: a figure with a unit (``12 ms``, ``40 µs``, ``1.37x``,
``τ 3.6``) must share its paragraph (a docstring's text between blank lines, or a block of
consecutive comment lines) with a path under bench/runs/. Numbers told by hand and never
recorded go as words ("about twice", "by hand, not recorded"), or not at all."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|µs|us)\b"     # a time
                    r"|(?<![\w.])\d+(?:\.\d+)?x(?!\w)"               # a speedup
                    r"|τ\s?=?\s?\d+(?:\.\d+)?")                               # an acceptance length
RUN = "bench/runs/"


def paragraphs(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring paragraph and every comment block."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                line = node.body[0].lineno
                for part in re.split(r"\n\s*\n", doc):
                    out.append((line, part))
                    line += part.count("\n") + 2
    block: list[str] = []
    start = last = -1
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        if block and tok.start[0] != last + 1:
            out.append((start, "\n".join(block)))
            block = []
        if not block:
            start = tok.start[0]
        block.append(tok.string)
        last = tok.start[0]
    if block:
        out.append((start, "\n".join(block)))
    return out


def unbacked(source: str) -> list[tuple[int, str]]:
    return [(line, m.group(0)) for line, text in paragraphs(source) if RUN not in text
            for m in FIGURE.finditer(text)]


def test_figures_in_docstrings_and_comments_name_their_recorded_run():
    found = []
    for path in sorted((ROOT / "vlmspec_cli").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line}: {fig!r}" for line, fig in
                  unbacked(path.read_text(encoding="utf-8"))]
    assert not found, ("a figure with no recorded run beside it (name its file under "
                       "bench/runs/, or say it in words):\n" + "\n".join(found))


def test_the_scan_finds_a_figure_and_accepts_one_with_its_run():
    bare = '"""Fast.\n\nA round took 12.5 ms here."""\n# and 1.37x there\nx = 1  # τ 3.6\n'
    assert [f for _, f in unbacked(bare)] == ["12.5 ms", "1.37x", "τ 3.6"]
    backed = ('"""Fast.\n\nA round took 12.5 ms (bench/runs/2026-12-07/final-load-idle.json)."""\n'
              "# 1.37x, recorded:\n# bench/runs/2026-11-26/draft-step-s45.txt\n")
    assert unbacked(backed) == []
    # the run must be in the figure's own paragraph, not anywhere in the docstring
    apart = '"""A round took 12.5 ms.\n\nSee bench/runs/2026-12-07/final-load-idle.json."""\n'
    assert [f for _, f in unbacked(apart)] == ["12.5 ms"]
    # not figures: versions, shapes, hex, words
    assert unbacked('"""transformers 5.24, 8192 × 8192, 0x1f, τ ≈ 1, twice as long."""') == []
