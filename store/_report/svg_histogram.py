"""A key's histograms over steps as inline SVG: one column per step, each bin a band
whose opacity is its count over the column's largest (TensorBoard's distribution view,
drawn flat). Plain SVG, every text escaped; records that break a histogram's rules
(docs/format.md, "Histograms") are left out, never drawn."""

from __future__ import annotations

import itertools
import math
from html import escape
from typing import Any

from tracklake._format.records import MAX_BINS
from tracklake._report.svg import HEIGHT, PALETTE, WIDTH, XMLNS

_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 28, 40


def drawable(row: dict[str, Any]) -> bool:
    """Whether a histogram record keeps the format's rules (docs/format.md, "Histograms")."""
    edges, counts = row.get("edges") or [], row.get("counts") or []
    return (0 < len(counts) <= MAX_BINS and len(edges) == len(counts) + 1
            and all(isinstance(e, float) and math.isfinite(e) for e in edges)
            and all(a < b for a, b in itertools.pairwise(edges))
            and all(isinstance(c, int) and c >= 0 for c in counts))


def histogram_chart(title: str, rows: list[dict[str, Any]], standalone: bool = False) -> str:
    """`rows` (step, edges, counts; in step order) as one chart titled `title`
    (`standalone`: as a file of its own, with the SVG namespace)."""
    rows = [r for r in rows if drawable(r)]
    parts = [f'<svg{XMLNS if standalone else ""} class="chart" width="{WIDTH}" '
             f'height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">',
             f"<title>{escape(title)}</title>",
             f'<text x="{_LEFT}" y="16" class="t">{escape(title)}</text>']
    if not rows:
        parts.append(f'<text x="{_LEFT}" y="{HEIGHT // 2}">no histogram to draw</text></svg>')
        return "".join(parts)
    lo: float = min(r["edges"][0] for r in rows)
    hi: float = max(r["edges"][-1] for r in rows)
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    column = plot_w / len(rows)

    def y(value: float) -> float:  # halved first: ranges near ±1.8e308 stay finite
        return _TOP + plot_h - (value / 2 - lo / 2) / (hi / 2 - lo / 2) * plot_h

    for i, row in enumerate(rows):
        top = max(row["counts"]) or 1
        x = _LEFT + i * column
        for j, count in enumerate(row["counts"]):
            if count:
                y0, y1 = y(row["edges"][j]), y(row["edges"][j + 1])
                parts.append(f'<rect x="{x:.2f}" y="{y1:.2f}" width="{column:.2f}" '
                             f'height="{max(y0 - y1, 0.5):.2f}" fill="{PALETTE[0]}" '
                             f'fill-opacity="{count / top:.3f}"/>')
    bottom = _TOP + plot_h
    parts += [f'<text x="4" y="{_TOP + 10}">{escape(f"{hi:.4g}")}</text>',
              f'<text x="4" y="{bottom}">{escape(f"{lo:.4g}")}</text>',
              f'<text x="{_LEFT}" y="{bottom + 16}">step {rows[0]["step"]}</text>',
              f'<text x="{WIDTH - _RIGHT}" y="{bottom + 16}" text-anchor="end">step '
              f'{rows[-1]["step"]}</text>',
              f'<text x="{_LEFT}" y="{bottom + 32}" class="note">{len(rows)} histograms'
              "</text></svg>"]
    return "".join(parts)
