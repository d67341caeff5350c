"""`tracklake report` holds a run's histograms over steps (a chart per key in the page)
and the images of each key inline (data: URIs, which the page's CSP allows and nothing
else), and never draws what breaks the format's rules nor inlines what the store does
not hold."""

from __future__ import annotations

import base64
import math
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from test_report import elements, embedded

import tracklake
from tracklake._cli.main import main
from tracklake._format import blob_path
from tracklake._report.svg_histogram import histogram_chart


def _report(root: Path, out: Path) -> str:
    result = CliRunner().invoke(main, ["report", "r", "--root", str(root), "-o", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out.read_text()


def test_histograms_and_images_are_in_the_report_inline(tmp_path: Path) -> None:
    root = tmp_path / "s"
    digests = {}
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step in range(3):
            run.log_histogram("grad/w", np.arange(10.0) + step, step=step, bins=5)
            digests[step] = run.log_image("samples", np.full((3, 3), 40 * step, np.uint8),
                                          step=step, caption=f"<b>epoch {step}</b>")
        missing = run.log_image("gone", np.zeros((2, 2), np.uint8), step=0)
    assert missing is not None
    blob_path(root, missing).unlink()
    html = _report(root, tmp_path / "r.html")
    csp = next(a["content"] for t, a in elements(html).tags
               if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "img-src data:;" in csp and "default-src 'none'" in csp
    data = embedded(html)
    items = {m["key"]: m["items"] for m in data["media"]}
    assert [i["src"] for i in items["samples"]] == [
        "data:image/png;base64," + base64.b64encode(blob_path(root, d).read_bytes()).decode()
        for d in digests.values()]
    assert items["samples"][1]["caption"] == "<b>epoch 1</b>"  # text, held escaped
    assert "<b>epoch" not in html
    [gone] = items["gone"]  # its blob is missing: named, not shown
    assert gone["served"] is False and "src" not in gone
    [hist] = data["histograms"]
    assert hist["key"] == "grad/w" and [len(s["counts"]) for s in hist["steps"]] == [5] * 3


def test_a_histogram_that_breaks_the_rules_is_not_drawn() -> None:
    good = {"step": 1, "edges": [0.0, 1.0, 2.0], "counts": [1, 3]}
    bad = [{"step": 2, "edges": [0.0, math.nan, 2.0], "counts": [1, 3]},
           {"step": 3, "edges": [0.0, 1.0], "counts": [1, 3]},
           {"step": 4, "edges": [0.0, 1.0, 1.0e308 * 10], "counts": [1, 1]},
           {"step": 5, "edges": [2.0, 1.0, 3.0], "counts": [1, 1]}]
    chart = histogram_chart("k", [good, *bad])
    assert chart.count("<rect") == 2 and "1 histograms" in chart
    assert "nan" not in chart and "inf" not in chart
    assert "no histogram to draw" in histogram_chart("k", bad)


def test_the_markdown_report_writes_histogram_charts_and_image_files(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    root = tmp_path / "s"
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        run.log_histogram("w", [1.0, 2.0, 3.0], step=0, bins=3)
        digest = run.log_image("img", np.zeros((2, 2), np.uint8), step=0, caption="a [b]")
    assert digest is not None
    folder = tmp_path / "md"
    result = CliRunner().invoke(main, ["report", "r", "--root", str(root), "-o", str(folder),
                                       "--format", "md"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [chart] = (folder / "charts").glob("h-*.svg")
    assert ET.parse(chart).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    image = folder / "images" / f"{digest}.png"
    assert image.read_bytes() == blob_path(root, digest).read_bytes()
    text = (folder / "report.md").read_text()
    assert f"![img step 0: a \\[b\\]](images/{digest}.png)" in text
    assert f"](charts/{chart.name})" in text
