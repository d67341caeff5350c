"""Line charts as text, drawn by uniplot: braille dots where the terminal shows Unicode,
letters where it does not, one chart per key with the runs overlaid and a legend."""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

from uniplot import plot_to_string

from tracklake._report.series import Curve, labelled

#: Lines of a chart that are not the plotting area: title, two borders, x labels, legend.
CHART_FRAME_LINES = 5
#: The smallest plotting area drawn; a taller terminal gives each chart more.
MIN_PLOT_LINES = 3
#: uniplot's ASCII mode draws its points in ASCII but its frame in box-drawing characters.
_ASCII_FRAME = str.maketrans("┌┐└┘╭╮╰╯─│▔▁", "++++++++-|-_")


@dataclass(frozen=True)
class Screen:
    """Where and how charts are drawn: the terminal's size and what it can show."""

    width: int = 80
    height: int = 24
    unicode: bool = True  # braille points and a box frame, else ASCII only
    color: bool = False  # curves told apart by color (else by their letters)
    log: bool = False  # log scale on y
    x_label: str = "step"


def printable(text: str) -> str:
    """`text` with control characters shown as `?`: names from the store must not move
    the cursor or restyle the terminal."""
    return "".join("?" if unicodedata.category(c) == "Cc" else c for c in text)


def _unit(values: list[float]) -> float:
    """1, or the power of ten to divide values by when their range overflows a float
    (values near ±1.8e308), which the drawing cannot scale."""
    if not values or math.isfinite(max(values) - min(values)):
        return 1.0
    return 10.0 ** math.floor(math.log10(max(abs(v) for v in values)))


def draw_charts(charts: dict[str, list[Curve]], screen: Screen) -> str:
    """One chart per key (in the order given), sharing the screen's height."""
    if not charts:
        return ""
    per_chart = max(screen.height // len(charts), CHART_FRAME_LINES + MIN_PLOT_LINES)
    return "\n".join(draw_chart(key, curves, screen, per_chart)
                     for key, curves in charts.items())


def draw_chart(key: str, curves: list[Curve], screen: Screen, lines: int) -> str:
    """One key's curves in `lines` lines of text."""
    notes = []
    kept: list[tuple[Curve, list[float], list[float]]] = []
    left_out = 0
    for curve in curves:
        xs, ys = curve.xs, curve.ys
        if screen.log:
            pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
            left_out += len(xs) - len(pairs)
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        if xs:
            kept.append((curve, xs, ys))
    if left_out:
        notes.append(f"{left_out} points <= 0 left out of the log scale")
    unit = _unit([y for _, _, ys in kept for y in ys])
    if unit != 1.0:
        notes.append(f"values in units of {unit:.0e}")
        kept = [(c, xs, [y / unit for y in ys]) for c, xs, ys in kept]
    if any(c.downsampled for c in curves):
        notes.append(f"{max(c.points for c in curves):,} points in buckets")
    finite = [y for _, _, ys in kept for y in ys if math.isfinite(y)]
    bounds: dict[str, float] = {}
    if finite:
        low, high = min(finite), max(finite)
        notes.append(f"y {low:.4g}…{high:.4g}" if screen.unicode else f"y {low:.4g}..{high:.4g}")
        if not screen.log:  # the axis spans the data: its labels show its range
            pad = (high - low) * 0.05  # a constant gets a band around it
            if not pad:
                pad = abs(low) * 0.1 if low else 1.0
            bounds = {"y_min": low - pad, "y_max": high + pad}
    title = printable(key) + (" (log)" if screen.log else "")
    title += f" [{'; '.join(notes)}]" if notes else ""
    if not kept:
        return f"{title}\n  (nothing to draw)"
    labels = [printable(name) for name, _ in labelled([c for c, _, _ in kept])]
    # without color, several curves are told apart only by ASCII letters
    letters = not screen.unicode or (len(kept) > 1 and not screen.color)
    text = plot_to_string(
        [ys for _, _, ys in kept], [xs for _, xs, _ in kept],
        lines=True, title=title[: screen.width], legend_labels=labels,
        width=screen.width, height=max(lines - CHART_FRAME_LINES, MIN_PLOT_LINES),
        line_length_hard_cap=screen.width, y_as_log=screen.log,
        character_set="ascii" if letters else "braille",
        color=screen.color and len(kept) > 1,
        x_unit=" s" if screen.x_label == "time" else "",
        y_gridlines=[], x_gridlines=[], **bounds)
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return text if screen.unicode else text.translate(_ASCII_FRAME)
