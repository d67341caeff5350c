"""`tracklake report --format md`: the runs' parts read from the store, for markdown.py to
write as Markdown with SVG files (charts are built escaped by svg.py). The HTML report is
the dashboard's page with its answers embedded (`tracklake._ui.offline`), which also takes
`MAX_INLINE_IMAGE` from here."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracklake._read.query import with_connection
from tracklake._read.reader import ReadProblems, RunRecord
from tracklake._report.sections import (
    CONFIG_SQL,
    EVENTS_SQL,
    GENERATIONS_SQL,
    HISTOGRAMS_SQL,
    IMAGES_SQL,
    RUN_SQL,
    TRACES_SQL,
    ConfigRow,
    RunParts,
    config_diff,
    media_files,
    read_parts,
)
from tracklake._report.series import (
    Curve,
    CurveQuery,
    Require,
    chosen_keys,
    collect,
    curves_sql,
    labelled,
    run_keys,
)
from tracklake._report.svg import line_chart

#: Largest media blob a report holds (an HTML report as a data: URI, a Markdown report as
#: a file); a larger one is named, not shown.
MAX_INLINE_IMAGE = 2 << 20
#: The image types a report shows, and the extension of each in a Markdown report's folder.
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif",
              "image/webp": "webp"}

#: Points per curve: a report of many keys gets fewer, so that 1,000 keys stay a few MB.
POINTS_FEW_KEYS, POINTS_MANY_KEYS, MANY_KEYS = 400, 120, 50


@dataclass
class Report:
    """What a report shows, read from the store."""

    root: Path
    runs: list[RunParts]
    charts: dict[str, list[Curve]]
    spec: CurveQuery

    @property
    def config(self) -> list[ConfigRow]:
        return config_diff(self.runs)

    def identity(self) -> list[tuple[str, list[str]]]:
        """(field, value per run) rows of the runs table."""
        rows: list[tuple[str, list[str]]] = []
        fields = ("name", "status", "attempts", "ranks", "started_at", "ended_at", "host",
                  "git_commit", "tags")
        for name in fields:
            rows.append((name, [_text(p.run.get(name)) for p in self.runs]))
        for name, pick in (("command", lambda i: " ".join(i.get("command") or [])),
                           ("python", lambda i: i.get("python")),
                           ("git dirty", lambda i: (i.get("git") or {}).get("dirty"))):
            rows.append((name, [_text(pick(_identity(p.record))) for p in self.runs]))
        rows.append(("SQL parameters", [sql_params(p.record) for p in self.runs]))
        return rows

    def chart_params(self) -> str:
        """The `tracklake sql` parameters of the charts' SQL besides a run's."""
        keys = "[" + ", ".join(self.charts) + "]"
        since = self.spec.since if self.spec.since is not None else -2**63
        return (f"--param keys={shlex.quote(keys)} --param since={since} "
                f"--param buckets={self.spec.buckets}")


def sql_params(record: RunRecord) -> str:
    """`tracklake sql`'s parameters of a run in the report's SQL: $p, $r, and $rank, the
    run's lowest rank (whose config and histograms the report shows)."""
    return (f"--param p={shlex.quote(record.project)} --param r={shlex.quote(record.run)} "
            f"--param rank={min(record.ranks)}")


def _identity(record: RunRecord) -> dict[str, Any]:
    rank0 = [a for a in record.attempts if a["rank"] == min(record.ranks)][-1]
    identity = rank0.get("identity")
    return identity if isinstance(identity, dict) else {}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def read_report(root: Path, records: list[RunRecord], spec: CurveQuery,
                problems: ReadProblems) -> Report:
    """Read every part of the report for the runs (the charts of `spec.keys`, with fewer
    points per curve when there are many keys)."""
    def read(con: Any) -> Report:
        runs = [read_parts(con, r) for r in records]
        keys = {k for r in records for k in chosen_keys(run_keys(con, r.project, r.run),
                                                        spec.keys)}
        points = POINTS_MANY_KEYS if len(keys) > MANY_KEYS else POINTS_FEW_KEYS
        chart_spec = dataclasses.replace(spec, buckets=min(spec.buckets, points))
        # every key by default: a run with no metrics is no error then
        require: Require = "nothing" if spec.keys == ("*",) else "some run"
        return Report(root, runs, collect(con, records, chart_spec, require),
                      chart_spec)
    return with_connection(root, problems, read)


def chart_svgs(report: Report, standalone: bool = False) -> dict[str, str]:
    """Per key, its chart as SVG."""
    x_label = "seconds since the run started" if report.spec.x == "time" else "step"
    return {key: line_chart(key, labelled(curves), x_label, standalone)
            for key, curves in report.charts.items()}


def image_files(root: Path, parts: RunParts) -> list[tuple[str, list[dict[str, Any]]]]:
    """Per image key of a run, its latest images, each with ``blob``: its file, or None
    for one whose blob is missing, not of the declared size, larger than
    `MAX_INLINE_IMAGE`, or of a media type a browser should not be handed."""
    return media_files(root, parts.images, EXTENSIONS, MAX_INLINE_IMAGE)


def section_sql(report: Report) -> dict[str, str]:
    """The SQL of each part of the report, as shown in it."""
    return {"run": RUN_SQL, "config": CONFIG_SQL,
            "charts": curves_sql(report.spec).strip(), "generations": GENERATIONS_SQL,
            "traces": TRACES_SQL, "events": EVENTS_SQL, "histograms": HISTOGRAMS_SQL,
            "images": IMAGES_SQL}
