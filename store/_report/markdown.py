"""The report as Markdown for a wiki: report.md and one SVG file per chart in a folder.
Text from the store is HTML-escaped (Markdown renderers pass raw HTML through) and table
cells have their pipes and line breaks escaped."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

from tracklake._format.files import write_atomic
from tracklake._report.content import EXTENSIONS, Report, chart_svgs, image_files, section_sql
from tracklake._report.sections import Span
from tracklake._report.svg_histogram import histogram_chart

_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def cell(value: object) -> str:
    """A value as one Markdown table cell."""
    text = "" if value is None else str(value)
    return escape(text).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def _sql(text: str) -> list[str]:
    return ["<details><summary>SQL</summary>", "", "```sql", text.strip(), "```", "",
            "</details>", ""]


def _spans(span: Span, depth: int) -> list[str]:
    row = span.row
    line = f"{'  ' * depth}- **{cell(row['name'])}** {cell(row['status'])}, step {row['step']}"
    if row.get("error"):
        line += f": {cell(row['error'])}"
    return [line, *(x for child in span.children for x in _spans(child, depth + 1))]


def chart_file(index: int, key: str) -> str:
    """A chart's file name: its position, then the key with unsafe characters replaced."""
    return f"{index:04d}-{_UNSAFE_FILE_CHARS.sub('_', key)[:80]}.svg"


def _media(report: Report, folder: Path, sql: dict[str, str]) -> list[str]:
    """The histograms and images section: histogram charts as charts/h-*.svg, images as
    images/<digest>.<ext> (only those `image_files` gives a file of)."""
    lines = ["## Histograms and images", ""]
    for p in report.runs:
        if not (p.histograms or p.images):
            continue
        lines += [f"### {cell(p.label)}", ""]
        for i, (key, rows) in enumerate(p.histograms.items()):
            name = "h-" + chart_file(i, key)
            write_atomic(folder / "charts" / name,
                         histogram_chart(key, rows, standalone=True).encode())
            lines += [f"![{cell(key)}](charts/{name})", ""]
        for key, rows in image_files(report.root, p):
            shown = []
            for row in rows:
                caption = cell(f"{key} step {row['step']}: {row['caption'] or ''}").replace(
                    "[", "\\[").replace("]", "\\]")  # alt text ends at a bracket
                if row["blob"] is None:
                    shown.append(f"{caption} (not shown: {cell(row['media_type'])}, "
                                 f"{row['size']} bytes)")
                    continue
                name = f"{row['digest']}.{EXTENSIONS[row['media_type']]}"
                if not (folder / "images" / name).exists():
                    write_atomic(folder / "images" / name, row["blob"].read_bytes())
                shown.append(f"![{caption}](images/{name})")
            lines += [f"**{cell(key)}**", "", " ".join(shown), ""]
    return [*lines, *_sql(sql["histograms"]), *_sql(sql["images"])]


def write_markdown(report: Report, folder: Path) -> Path:
    """Write report.md and charts/*.svg into `folder`; the path of report.md."""
    labels = [p.label for p in report.runs]
    sql = section_sql(report)
    lines = ["# tracklake report", "", "Every part shows the SQL that read it: `tracklake sql` "
             "runs it again, given a run's SQL parameters (the last row of the runs table).",
             "", "## Runs", ""]
    lines += _table(["", *labels], [[name, *values] for name, values in report.identity()])
    lines += _sql(sql["run"])
    config = report.config
    lines += ["## Config", "", f"{sum(r.differs for r in config)} of {len(config)} keys "
              "differ (listed first, marked *).", ""]
    lines += _table(["key", *labels], [[("* " if r.differs else "") + r.key, *r.values]
                                      for r in config])
    lines += _sql(sql["config"])
    lines += ["## Charts", ""]
    charts = folder / "charts"
    for i, (key, svg) in enumerate(chart_svgs(report, standalone=True).items()):
        name = chart_file(i, key)
        write_atomic(charts / name, svg.encode())
        lines += [f"![{cell(key)}](charts/{name})", ""]
    lines += _sql(sql["charts"])
    lines += [f"The charts' SQL takes `{report.chart_params()}` besides a run's parameters.",
              ""]
    lines += _media(report, folder, sql)
    lines += ["## Generations", ""]
    for p in report.runs:
        lines += [f"### {cell(p.label)}", ""]
        lines += _table(["step", "key", "rank", "sample", "input", "output", "score"],
                        [[g["step"], g["key"], g["rank"], g["sample"], g["input"], g["output"],
                          g["score"]] for g in p.generations])
    lines += _sql(sql["generations"])
    lines += ["## Traces", ""]
    for p in report.runs:
        lines += [f"### {cell(p.label)}", ""]
        lines += [x for span in p.traces for x in _spans(span, 0)] + [""]
    lines += _sql(sql["traces"])
    lines += ["## Alerts and events", ""]
    lines += _table(["run", "time", "step", "level", "kind", "title", "text"],
                    [[p.label, e["time"], e["step"], e["level"], e["kind"], e["title"],
                      e["text"]] for p in report.runs for e in p.events])
    lines += _sql(sql["events"])
    path = folder / "report.md"
    write_atomic(path, "\n".join(lines).encode())
    return path
