#!/usr/bin/env python
"""The dashboard's pictures in docs/: `tracklake ui` on the demo store (`make demo`),
shown by the system's headless Chromium (driven as the browser tests drive it,
tests/_cdp.py) at 1400 x 900 pixels:

- docs/dashboard.png: the Charts view with smoothing 0.9, the mean of the ranks with
  their min-max band and the values under the cursor on the first chart;
- docs/dashboard-traces.png: the Traces view, its first span folded open.

Usage (from the repository root, after ``make demo``)::

    python benchmarks/dashboard_pictures.py [--root tracklake-demo] [--out docs]
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
from pathlib import Path

# the browser tests' Chromium driver, a test helper
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _cdp import Browser

from tracklake._ui.server import Dashboard

WIDTH, HEIGHT = 1400, 900
FIRST = "[...tracklake.charts.values()][0]"


def shoot(page: Browser, path: Path) -> None:
    page.js("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    shot = page.call("Page.captureScreenshot", format="png")
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"wrote {path}")


def control(page: Browser, name: str, value: str, event: str) -> None:
    page.js(f"(() => {{ const e = document.getElementById('{name}'); e.value = '{value}';"
            f"e.dispatchEvent(new Event('{event}')); }})()")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("tracklake-demo"))
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    board = Dashboard(args.root).start()
    with tempfile.TemporaryDirectory() as profile:
        page = Browser(Path(profile))
        try:
            page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                      deviceScaleFactor=1, mobile=False)
            page.open(board.url)
            page.wait(f"window.tracklake && tracklake.charts.size && {FIRST}.plot",
                      "the first chart")
            control(page, "ranks", "mean", "change")
            control(page, "smoothing", "0.9", "input")
            page.js("document.getElementById('smoothing-value').textContent = '0.9'")
            page.wait("[...tracklake.charts.values()].filter(c => c.visible)"
                      ".every(c => c.plot && c.loaded && c.meta.some(m => m && m.role === 'hi'))",
                      "the charts in view, with the ranks' band")
            x, y = page.js(f"""(() => {{ const u = {FIRST}.plot;
                const r = u.over.getBoundingClientRect(), i = Math.floor(u.data[0].length * 0.55);
                return [r.left + u.valToPos(u.data[0][i], 'x'), r.top + r.height / 2]; }})()""")
            page.mouse("mouseMoved", x, y)
            page.wait(f"!{FIRST}.hover.hidden", "the values under the cursor")
            shoot(page, args.out / "dashboard.png")
            page.mouse("mouseMoved", 0, 0)
            page.click_element('nav button[data-view="traces"]')
            page.wait("!!document.querySelector('#trace-list details.span')", "the spans")
            page.js("document.querySelector('#trace-list details.span').open = true")
            shoot(page, args.out / "dashboard-traces.png")
        finally:
            page.close()
            board.close()


if __name__ == "__main__":
    main()
