"""Pillow-only line charts: valid PNGs, distinct series colours, nice ticks, atomic writes."""

from __future__ import annotations

import math

import pytest
from PIL import Image

from vlmspec_cli import plot
from vlmspec_cli.plot import PALETTE, Panel, Series, line_chart, log_ticks, nice_ticks


def _panel(n_series: int = 3, log_x: bool = False) -> Panel:
    xs = [1, 2, 4, 8, 16, 32]
    series = [Series(f"run {k}", [(x, (k + 1) * math.sqrt(x)) for x in xs]) for k in range(n_series)]
    return Panel("accept rate", "draft length", "tokens/s", series, log_x=log_x)


def _colours(path) -> set[tuple[int, int, int]]:
    with Image.open(path) as im:
        return {c for _, c in im.getcolors(maxcolors=1 << 20)}


def test_writes_valid_png_of_expected_size(tmp_path):
    out = tmp_path / "chart.png"
    line_chart(out, [_panel(), _panel(log_x=True)], title="speed", width_per_panel=400, height=300)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out) as im:
        im.verify()
    with Image.open(out) as im:
        assert im.format == "PNG"
        assert im.size == (800, 300)
        assert im.mode == "RGB"


def test_default_size_and_str_path(tmp_path):
    out = str(tmp_path / "c.png")
    line_chart(out, [_panel(1)])
    with Image.open(out) as im:
        assert im.size == (420, 320)


def test_several_series_get_distinct_colours(tmp_path):
    out = tmp_path / "c.png"
    line_chart(out, [_panel(4)])
    colours = _colours(out)
    present = [c for c in PALETTE[:4] if c in colours]
    assert len(present) == 4
    assert len(set(present)) == 4
    assert all(c not in ((0, 0, 0), (255, 255, 255)) for c in present)
    assert PALETTE[5] not in colours  # only the colours of series actually drawn


def test_single_point_constant_and_empty_panels(tmp_path):
    out = tmp_path / "c.png"
    panels = [
        Panel("one point", "x", "y", [Series("a", [(3.0, 5.0)])]),
        Panel("constant", "x", "y", [Series("flat", [(0, 2.0), (1, 2.0), (2, 2.0)])]),
        Panel("zeros", "x", "y", [Series("z", [(1, 0.0), (1, 0.0)])]),
        Panel("empty", "x", "y", []),
        Panel("empty series", "x", "y", [Series("e", [])]),
        Panel("log nonpositive", "x", "y", [Series("n", [(0, 1.0), (-1, 2.0)])], log_x=True),
        Panel("nan", "x", "y", [Series("n", [(float("nan"), 1.0), (1, float("inf"))])]),
        Panel("negative", "x", "y", [Series("neg", [(0, -3.0), (1, 4.0)])]),
    ]
    line_chart(out, panels, width_per_panel=200, height=200)
    with Image.open(out) as im:
        assert im.size == (200 * len(panels), 200)
    assert PALETTE[0] in _colours(out)


def test_no_panels_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        line_chart(tmp_path / "c.png", [])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "lo, hi",
    [(0, 7.3), (0, 1), (0.013, 0.87), (-3.2, 4.1), (12, 12), (0, 0), (250, 1_930_000), (5, 3)],
)
def test_nice_ticks_are_round_and_cover(lo, hi):
    ticks = nice_ticks(lo, hi)
    assert 2 <= len(ticks) <= 12
    assert ticks[0] <= min(lo, hi) and ticks[-1] >= max(lo, hi)
    steps = [b - a for a, b in zip(ticks, ticks[1:])]
    step = steps[0]
    assert all(math.isclose(s, step, rel_tol=1e-9) for s in steps)
    mant = step / 10 ** math.floor(math.log10(step) + 1e-12)
    assert any(math.isclose(mant, m, rel_tol=1e-9) for m in (1, 2, 5))
    assert all(math.isclose(t / step, round(t / step), abs_tol=1e-9) for t in ticks)


def test_nice_ticks_examples():
    assert nice_ticks(0, 7.3) == [0, 2, 4, 6, 8]
    assert nice_ticks(0, 1) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0, 0) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])


def test_log_ticks():
    assert log_ticks(1, 1000) == [1, 10, 100, 1000]
    assert log_ticks(1, 32) == [1, 2, 5, 10, 20, 50, 100]
    ticks = log_ticks(3, 3)
    assert ticks[0] <= 3 <= ticks[-1]


def test_atomic_write_leaves_no_temp_file(tmp_path):
    out = tmp_path / "c.png"
    line_chart(out, [_panel()])
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]
    # overwriting an existing chart also leaves only the target behind
    line_chart(out, [_panel(2)])
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]


def test_failed_save_leaves_no_partial_file(tmp_path, monkeypatch):
    out = tmp_path / "c.png"
    out.write_bytes(b"old")

    def boom(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG partial")
        raise OSError("disk full")

    monkeypatch.setattr(plot.Image.Image, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        line_chart(out, [_panel()])
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]
    assert out.read_bytes() == b"old"
