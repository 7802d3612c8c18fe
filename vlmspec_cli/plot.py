"""Simple line charts written to PNG with Pillow only (no matplotlib).

``line_chart(path, panels, title=...)`` lays panels out side by side in one row; each
panel gets an axes box, "nice" 1-2-5 ticks, axis labels, a title, one polyline with
markers per series and a legend placed in whichever corner covers the fewest points.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont

from vlmspec_cli.fileio import atomic_write_bytes
from vlmspec_cli.png_mark import mark_png

PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40),
           (148, 103, 189), (140, 86, 75), (227, 119, 194), (23, 190, 207)]
WHITE, BLACK, GRID, FRAME = (255, 255, 255), (0, 0, 0), (232, 232, 232), (150, 150, 150)


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    log_x: bool = False


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: fixed-size bitmap font only
        return ImageFont.load_default()


def _fmt(v: float) -> str:
    v = round(v, 10)
    return f"{0.0 if v == 0 else v:g}"


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round 1-2-5 step tick values whose first/last tick cover [lo, hi]."""
    if lo > hi:
        lo, hi = hi, lo
    if lo == hi:
        pad = abs(lo) * 0.5 or 1.0
        lo, hi = (lo - pad if lo != 0 else 0.0), hi + pad
    raw = (hi - lo) / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering [lo, hi] (lo, hi > 0), with 2 and 5 when few decades."""
    a, b = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    if a == b:
        b += 1
    mults = (1, 2, 5) if b - a <= 2 else (1,)
    ticks = [m * 10.0 ** k for k in range(a, b) for m in mults] + [10.0 ** b]
    return [t for t in ticks if 10.0 ** a <= t <= 10.0 ** b]


def _clean(points, log_x: bool) -> list[tuple[float, float]]:
    out = []
    for x, y in points:
        x, y = float(x), float(y)
        if math.isfinite(x) and math.isfinite(y) and (x > 0 or not log_x):
            out.append((x, y))
    return out


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[int, int]:
    l, t, r, b = draw.textbbox((0, 0), text, font=font)
    return r - l, b - t


def _draw_panel(img: Image.Image, box: tuple[int, int, int, int], panel: Panel, fonts) -> None:
    small, big = fonts
    draw = ImageDraw.Draw(img)
    left, top, right, bottom = _draw_frame(img, draw, box, panel, fonts)
    data = [(s, _clean(s.points, panel.log_x)) for s in panel.series]
    data = [(i, s, pts) for i, (s, pts) in enumerate(data) if pts]
    if not data:
        w, h = _text_size(draw, "no data", big)
        draw.text(((left + right - w) // 2, (top + bottom - h) // 2), "no data", fill=FRAME, font=big)
        return
    px = _draw_axes(draw, (left, top, right, bottom), data, panel.log_x, small)
    pixels = []
    for i, _, pts in data:
        colour = PALETTE[i % len(PALETTE)]
        xy = [px(x, y) for x, y in sorted(pts)]
        pixels += xy
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for qx, qy in xy:
            draw.ellipse((qx - 3, qy - 3, qx + 3, qy + 3), fill=colour)
    _draw_legend(draw, (left, top, right, bottom), [(i, s.label) for i, s, _ in data if s.label],
                 pixels, small)


def _draw_frame(img: Image.Image, draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int],
                panel: Panel, fonts) -> tuple[int, int, int, int]:
    """Title, axes box and axis labels; returns the axes box (left, top, right, bottom)."""
    small, big = fonts
    x0, y0, x1, y1 = box
    tw, th = _text_size(draw, panel.title, big)
    draw.text(((x0 + x1 - tw) // 2, y0 + 4), panel.title, fill=BLACK, font=big)
    left, top, right, bottom = x0 + 62, y0 + th + 14, x1 - 14, y1 - 42
    draw.rectangle((left, top, right, bottom), outline=FRAME)
    # x label centred under the axes, y label rotated along the left edge
    w, h = _text_size(draw, panel.xlabel, small)
    draw.text(((left + right - w) // 2, bottom + 22), panel.xlabel, fill=BLACK, font=small)
    if panel.ylabel:
        w, h = _text_size(draw, panel.ylabel, small)
        lab = Image.new("RGB", (w + 4, h + 6), WHITE)
        ImageDraw.Draw(lab).text((2, 0), panel.ylabel, fill=BLACK, font=small)
        lab = lab.rotate(90, expand=True)
        img.paste(lab, (x0 + 4, max(top, (top + bottom - lab.height) // 2)))
    return left, top, right, bottom


def _draw_axes(draw: ImageDraw.ImageDraw, axes: tuple[int, int, int, int], data, log_x: bool, small):
    """Ticks, tick labels and grid lines for the points of ``data``; returns the function
    mapping a data point (x, y) to pixels."""
    left, top, right, bottom = axes
    xs = [p[0] for _, _, pts in data for p in pts]
    ys = [p[1] for _, _, pts in data for p in pts]
    ylo, yhi = (0.0 if min(ys) >= 0 else min(ys)), max(ys)
    yt = nice_ticks(ylo, yhi)
    if log_x:
        xt = log_ticks(min(xs), max(xs))
        tx = math.log10
    else:
        xt = nice_ticks(min(xs), max(xs))
        tx = float
    xa, xb, ya, yb = tx(xt[0]), tx(xt[-1]), yt[0], yt[-1]

    def px(x: float, y: float) -> tuple[float, float]:
        return (left + (tx(x) - xa) / (xb - xa) * (right - left),
                bottom - (y - ya) / (yb - ya) * (bottom - top))

    for t in yt:
        _, py = px(xt[0], t)
        if top < py < bottom:
            draw.line((left + 1, py, right - 1, py), fill=GRID)
        draw.line((left - 4, py, left, py), fill=BLACK)
        w, h = _text_size(draw, _fmt(t), small)
        draw.text((left - 7 - w, py - h / 2 - 1), _fmt(t), fill=BLACK, font=small)
    for t in xt:
        qx, _ = px(t, yt[0])
        if left < qx < right:
            draw.line((qx, top + 1, qx, bottom - 1), fill=GRID)
        draw.line((qx, bottom, qx, bottom + 4), fill=BLACK)
        w, h = _text_size(draw, _fmt(t), small)
        draw.text((qx - w / 2, bottom + 6), _fmt(t), fill=BLACK, font=small)
    return px


def _draw_legend(draw: ImageDraw.ImageDraw, axes: tuple[int, int, int, int],
                 labelled: list[tuple[int, str]], pixels: list[tuple[float, float]], small) -> None:
    """The legend of the ``labelled`` series (palette index, label), in the corner of the
    axes that covers the fewest plotted points."""
    if not labelled:
        return
    left, top, right, bottom = axes
    sizes = [_text_size(draw, lab, small) for _, lab in labelled]
    row = max(h for _, h in sizes) + 5
    lw, lh = max(w for w, _ in sizes) + 34, row * len(labelled) + 6
    corners = [(left + 6, top + 6), (right - 6 - lw, top + 6),
               (left + 6, bottom - 6 - lh), (right - 6 - lw, bottom - 6 - lh)]

    def covered(c: tuple[float, float]) -> int:
        return sum(c[0] - 4 <= qx <= c[0] + lw + 4 and c[1] - 4 <= qy <= c[1] + lh + 4
                   for qx, qy in pixels)

    bx, by = min(corners, key=covered)  # min() keeps the first (upper-left) on ties
    draw.rectangle((bx, by, bx + lw, by + lh), fill=WHITE, outline=FRAME)
    for k, (i, lab) in enumerate(labelled):
        cy = by + 4 + k * row + row / 2
        colour = PALETTE[i % len(PALETTE)]
        draw.line((bx + 6, cy, bx + 24, cy), fill=colour, width=2)
        draw.ellipse((bx + 12, cy - 3, bx + 18, cy + 3), fill=colour)
        draw.text((bx + 29, cy - sizes[k][1] / 2 - 2), lab, fill=BLACK, font=small)


def line_chart(path: str | os.PathLike, panels: list[Panel], title: str | None = None,
               width_per_panel: int = 420, height: int = 320) -> None:
    """Draw ``panels`` side by side into an RGB PNG at ``path``, written atomically."""
    atomic_write_bytes(path, line_chart_png(panels, title, width_per_panel, height))


def line_chart_png(panels: list[Panel], title: str | None = None, width_per_panel: int = 420,
                   height: int = 320) -> bytes:
    """:func:`line_chart`'s PNG as bytes (for a caller that decides how it is written)."""
    if not panels:
        raise ValueError("line_chart needs at least one panel")
    fonts = (_font(11), _font(13))
    img = Image.new("RGB", (width_per_panel * len(panels), height), WHITE)
    band = 0
    if title:
        draw = ImageDraw.Draw(img)
        w, h = _text_size(draw, title, fonts[1])
        draw.text(((img.width - w) // 2, 4), title, fill=BLACK, font=fonts[1])
        band = h + 10
    for n, panel in enumerate(panels):
        x0 = n * width_per_panel
        _draw_panel(img, (x0, band, x0 + width_per_panel, height), panel, fonts)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return mark_png(buffer.getvalue())


# viridis at five stops: low values dark purple, high values yellow
_RAMP = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]


def _ramp(t: float) -> tuple[int, int, int]:
    t = min(max(t, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    a, b = _RAMP[i], _RAMP[i + 1]
    return tuple(round(a[c] + (b[c] - a[c]) * f) for c in range(3))


def grid_heatmap(grid: list[list[float]], image_size: tuple[int, int] = (0, 0),
                 min_side: int = 256) -> Image.Image:
    """A value per cell of a token grid (rows of equal length) as coloured squares, at
    least ``min_side`` px (and the image's size) on the long side, each cell labelled
    with its value when there is room; colours span 1 .. the largest value."""
    rows, cols = len(grid), max(len(r) for r in grid)
    side = max(min_side, *image_size)
    cell = max(1, side // max(rows, cols))
    top = max(max(r) for r in grid)
    img = Image.new("RGB", (cols * cell, rows * cell), WHITE)
    draw = ImageDraw.Draw(img)
    font = _font(max(8, cell // 2))
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            colour = _ramp((v - 1) / (top - 1) if top > 1 else 0.0)
            box = (c * cell, r * cell, (c + 1) * cell - 1, (r + 1) * cell - 1)
            draw.rectangle(box, fill=colour)
            if cell >= 16:
                text = _fmt(v)
                w, h = _text_size(draw, text, font)
                ink = BLACK if sum(colour) > 380 else WHITE
                draw.text((box[0] + (cell - w) / 2, box[1] + (cell - h) / 2 - 1), text,
                          fill=ink, font=font)
    return img


@dataclass
class Bars:
    """One series of a grouped bar chart: a value per group (None: no bar) and a short note
    drawn above each bar."""

    label: str
    values: list[float | None]
    notes: list[str] = field(default_factory=list)


def bar_chart_png(groups: list[str], series: list[Bars], title: str = "", ylabel: str = "",
                  reference: float | None = None, reference_label: str = "",
                  height: int = 380) -> bytes:
    """Grouped bars (one group per entry of ``groups``, one bar per series), each note
    above its bar, a dashed line at ``reference`` and the legend above the axes (the
    dashed line's entry named ``reference_label``); returns the PNG's bytes."""
    if not groups or not series:
        raise ValueError("bar_chart_png needs at least one group and one series")
    small, big = _font(11), _font(13)
    bar_w = 18
    group_w = max(110, bar_w * len(series) + 30)
    left, right_pad = 62, 16
    img = Image.new("RGB", (left + group_w * len(groups) + right_pad, height), WHITE)
    draw = ImageDraw.Draw(img)
    if title:
        w, _ = _text_size(draw, title, big)
        draw.text(((img.width - w) // 2, 4), title, fill=BLACK, font=big)
    legend = [(s.label, PALETTE[i % len(PALETTE)]) for i, s in enumerate(series)]
    if reference is not None and reference_label:
        legend.append((reference_label, None))
    top = _bar_legend(draw, (left, 26), legend, small, img.width - right_pad) + 8
    axes = (left, top, img.width - right_pad, height - 44)
    values = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
    longest = max((_text_size(draw, n, small)[0] for s in series for n in s.notes), default=0)
    room = (longest + 8) / max(axes[3] - axes[1], 1)      # the notes' share of the height
    ticks = nice_ticks(0.0, max(values + [reference or 0.0, 1e-9]) / max(1 - room, 0.3))
    py = _bar_axes(img, draw, axes, ticks, ylabel, small)
    if reference is not None:
        _dashed(draw, axes[0], axes[2], py(reference))
    for g, name in enumerate(groups):
        x0 = left + g * group_w + (group_w - bar_w * len(series)) // 2
        for i, s in enumerate(series):
            v = s.values[g] if g < len(s.values) else None
            if v is None or not math.isfinite(v):
                continue
            bx = x0 + i * bar_w
            draw.rectangle((bx, py(v), bx + bar_w - 3, axes[3]), fill=PALETTE[i % len(PALETTE)])
            note = s.notes[g] if g < len(s.notes) else ""
            if note:
                _vertical_text(img, (bx + bar_w // 2 - 1, py(v) - 3), note, small)
        w, _ = _text_size(draw, name, small)
        draw.text((left + g * group_w + (group_w - w) / 2, axes[3] + 8), name, fill=BLACK, font=small)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return mark_png(buffer.getvalue())


def _bar_axes(img, draw, axes, ticks, ylabel, small):
    """Frame, y ticks, grid and y label; returns value -> pixel row."""
    left, top, right, bottom = axes
    lo, hi = ticks[0], ticks[-1]

    def py(v: float) -> float:
        return bottom - (v - lo) / (hi - lo) * (bottom - top)

    for t in ticks:
        y = py(t)
        if top < y < bottom:
            draw.line((left + 1, y, right - 1, y), fill=GRID)
        draw.line((left - 4, y, left, y), fill=BLACK)
        w, h = _text_size(draw, _fmt(t), small)
        draw.text((left - 7 - w, y - h / 2 - 1), _fmt(t), fill=BLACK, font=small)
    draw.rectangle((left, top, right, bottom), outline=FRAME)
    if ylabel:
        w, h = _text_size(draw, ylabel, small)
        lab = Image.new("RGB", (w + 4, h + 6), WHITE)
        ImageDraw.Draw(lab).text((2, 0), ylabel, fill=BLACK, font=small)
        lab = lab.rotate(90, expand=True)
        img.paste(lab, (4, max(top, (top + bottom - lab.height) // 2)))
    return py


def _dashed(draw, x0: float, x1: float, y: float) -> None:
    x = x0 + 1
    while x < x1 - 1:
        draw.line((x, y, min(x + 6, x1 - 1), y), fill=BLACK)
        x += 10


def _vertical_text(img: Image.Image, bottom_centre: tuple[float, float], text: str, small) -> None:
    """``text`` turned 90° (reading upwards), its bottom at ``bottom_centre``."""
    draw = ImageDraw.Draw(img)
    w, h = _text_size(draw, text, small)
    lab = Image.new("RGB", (w + 4, h + 6), WHITE)
    ImageDraw.Draw(lab).text((2, 0), text, fill=BLACK, font=small)
    lab = lab.rotate(90, expand=True)
    x, y = bottom_centre
    img.paste(lab, (round(x - lab.width / 2), max(0, round(y - lab.height))))


def _bar_legend(draw, origin: tuple[int, int], entries: list[tuple[str, tuple | None]], small,
                right: int) -> int:
    """Legend entries (label, colour; None: the dashed reference line) in rows from
    ``origin``, wrapped at ``right``; returns the bottom of the last row."""
    x0, y = origin
    x = x0
    for label, colour in entries:
        w, h = _text_size(draw, label, small)
        if x + w + 24 > right and x > x0:
            x, y = x0, y + 18
        if colour is None:
            draw.line((x, y + 7, x + 4, y + 7), fill=BLACK)
            draw.line((x + 8, y + 7, x + 12, y + 7), fill=BLACK)
        else:
            draw.rectangle((x, y + 2, x + 12, y + 12), fill=colour)
        draw.text((x + 16, y), label, fill=BLACK, font=small)
        x += w + 34
    return y + 18
