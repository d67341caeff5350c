"""A line chart as inline SVG: a few hundred points per curve, axes with their ranges, a
legend, and a note when the curve was downsampled. Plain SVG with no fonts, scripts or
links, so a report opens anywhere; every text is escaped."""

from __future__ import annotations

import math
from html import escape

from tracklake._report.series import Curve

#: Colors of the curves of one chart, in order (Tableau 10, readable on white).
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
WIDTH, HEIGHT = 440, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 28, 58


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _bounds(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def _scale(value: float, lo: float, hi: float, size: float) -> float:
    # halved first so that ranges near ±1.8e308 do not overflow to inf
    return (value / 2 - lo / 2) / (hi / 2 - lo / 2) * size


#: The namespace a standalone .svg file declares (inline SVG in HTML needs none).
XMLNS = ' xmlns="http://www.w3.org/2000/svg"'


def line_chart(title: str, curves: list[tuple[str, Curve]], x_label: str = "step",
               standalone: bool = False) -> str:
    """An SVG chart of (legend label, curve) pairs; `standalone` for an .svg file."""
    drawn = [(label, c) for label, c in curves if c.xs]
    height = chart_height(len(drawn))
    parts = [f'<svg{XMLNS if standalone else ""} class="chart" role="img" '
             f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
             'font-family="sans-serif" font-size="11">',
             f"<title>{escape(title)}</title>",
             f'<text x="{_LEFT}" y="16" class="t">{escape(title)}</text>']
    if not drawn:
        parts.append(f'<text x="{_LEFT}" y="{height // 2}">no finite values</text></svg>')
        return "".join(parts)
    x_lo, x_hi = _bounds([x for _, c in drawn for x in c.xs])
    y_lo, y_hi = _bounds([y for _, c in drawn for y in c.ys])
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    parts.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" '
                 'fill="none" stroke="#999"/>')
    for value, y in ((y_hi, _TOP + 4), (y_lo, _TOP + plot_h)):
        parts.append(f'<text x="{_LEFT - 4}" y="{y}" text-anchor="end">{_fmt(value)}</text>')
    base = _TOP + plot_h + 14
    parts.append(f'<text x="{_LEFT}" y="{base}">{_fmt(x_lo)}</text>')
    parts.append(f'<text x="{WIDTH - _RIGHT}" y="{base}" text-anchor="end">{_fmt(x_hi)}</text>')
    parts.append(f'<text x="{_LEFT + plot_w // 2}" y="{base}" text-anchor="middle">'
                 f"{escape(x_label)}</text>")
    legend_y = base + 16
    for i, (label, curve) in enumerate(drawn):
        color = PALETTE[i % len(PALETTE)]
        points = " ".join(
            f"{_LEFT + _scale(x, x_lo, x_hi, plot_w):.1f},"
            f"{_TOP + plot_h - _scale(y, y_lo, y_hi, plot_h):.1f}"
            for x, y in zip(curve.xs, curve.ys, strict=True)
            if math.isfinite(x) and math.isfinite(y))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" '
                     f'points="{points}"/>')
        note = (f" ({curve.points:,} points, drawn as {len(curve.xs)} bucket means)"
                if curve.downsampled else "")
        parts.append(f'<text x="{_LEFT + 14}" y="{legend_y + 14 * i}" class="l">'
                     f'<tspan fill="{color}">■</tspan> {escape(label)}{escape(note)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def chart_height(curves: int) -> int:
    """Height the chart needs with `curves` legend lines (the SVG grows past two)."""
    return HEIGHT + 14 * max(curves - 2, 0)
