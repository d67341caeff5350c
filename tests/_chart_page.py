"""What the dashboard's page does with its loss chart, checked the same way whether a
server answers it (`tracklake ui`) or a report file holds its answers
(`tracklake report`): helpers over a `_cdp.Browser` on that page."""

from __future__ import annotations

import json

from _cdp import Browser

LOSS = "tracklake.charts.get('loss')"


def series_of(page: Browser, run: str) -> list[int]:
    """The uPlot series indices of `run`'s curves (`project/run`) in the loss chart."""
    return page.js(f"{LOSS}.meta.map((m, i) => m && m.run === {json.dumps(run)} ? i : -1)"
                   ".filter(i => i >= 0)")


def canvas(page: Browser) -> str:
    return str(page.js(f"{LOSS}.plot.ctx.canvas.toDataURL()"))


def plot_point(page: Browser, x: float, series: int) -> tuple[float, float]:
    """The page coordinates of the point at `x` on `series`."""
    return tuple(page.js(f"""(() => {{
        const u = {LOSS}.plot;
        u.root.scrollIntoView({{block: 'center'}});
        const i = u.data[0].indexOf({x});
        const r = u.over.getBoundingClientRect();
        return [r.left + u.valToPos({x}, 'x'), r.top + u.valToPos(u.data[{series}][i], 'y')];
    }})()"""))


def set_control(page: Browser, control: str, value: str, event: str = "change") -> None:
    page.js(f"(() => {{ const e = document.getElementById('{control}'), "
            f"v = {json.dumps(value)}; if (e.type === 'checkbox') e.checked = v === 'true';"
            f"else e.value = v; e.dispatchEvent(new Event('{event}')); }})()")


def toggling_hides_and_shows(page: Browser, run: str, other: str) -> None:
    """Unticking `run` hides its curves (and only its), ticking it shows them again."""
    indices = series_of(page, run)
    assert indices
    before = canvas(page)
    page.click_element(f'#runs input[data-run="{run}"]')
    page.wait(f"{json.dumps(indices)}.every(i => !{LOSS}.plot.series[i].show)",
              f"{run}'s curves hidden")
    assert canvas(page) != before
    assert all(page.js(f"{LOSS}.plot.series[{i}].show") for i in series_of(page, other))
    page.click_element(f'#runs input[data-run="{run}"]')
    page.wait(f"{json.dumps(indices)}.every(i => {LOSS}.plot.series[i].show)",
              f"{run}'s curves shown again")


def smoothing_changes_the_path(page: Browser, run: str) -> None:
    """The slider draws a smoothed curve over `run`'s raw one, starting on its value."""
    raw, smoothed = series_of(page, run)[:2]
    before = canvas(page)
    set_control(page, "smoothing", "0.9", "input")
    page.wait(f"{LOSS}.plot.series[{smoothed}].stroke() !== 'transparent'",
              "the smoothed curve drawn")
    drawn = page.js(f"(() => {{ const d = {LOSS}.plot.data;"
                    f"return [d[{raw}].filter(v => v != null), d[{smoothed}]"
                    ".filter(v => v != null)]; })()")
    assert drawn[0] != drawn[1] and drawn[0][0] == drawn[1][0]  # debiased: starts on the value
    assert canvas(page) != before
    set_control(page, "smoothing", "0", "input")


def drag_zooms_and_double_click_resets(page: Browser, run: str, lo: int, hi: int) -> None:
    """Dragging from step `lo` to `hi` on `run`'s curve zooms x into that range, and the
    chart asks again for the points of it; a double click shows the whole range again."""
    raw = series_of(page, run)[0]
    full = page.js(f"(() => {{ const s = {LOSS}.plot.scales.x; return [s.min, s.max]; }})()")
    (x0, y), (x1, _) = plot_point(page, lo, raw), plot_point(page, hi, raw)
    page.mouse("mouseMoved", x0, y)
    page.mouse("mousePressed", x0, y, button="left", clickCount=1)
    page.mouse("mouseMoved", (x0 + x1) / 2, y, buttons=1)
    page.mouse("mouseMoved", x1, y, buttons=1)
    page.mouse("mouseReleased", x1, y, button="left", clickCount=1)
    zoomed = page.wait(f"(() => {{ const s = {LOSS}.plot.scales.x;"
                       f"return s.max - s.min < {(hi - lo) * 1.5} && [s.min, s.max]; }})()",
                       "a zoomed x range")
    assert lo - 1 <= zoomed[0] < zoomed[1] <= hi + 1
    page.wait(f"{LOSS}.zoom !== null && {LOSS}.curves.length && "
              f"{LOSS}.curves.every(c => c.x.length && c.x.every(v => v >= {LOSS}.zoom[0] "
              f"&& v <= {LOSS}.zoom[1]))", "the zoomed range's points")
    page.click(x0, y, count=2)
    page.wait(f"(() => {{ const s = {LOSS}.plot.scales.x;"
              f"return {LOSS}.zoom === null && s.min <= {full[0]} && s.max >= {full[1]}; }})()",
              "the full range again")
