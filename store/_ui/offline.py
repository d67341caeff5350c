"""`tracklake report`'s HTML: the dashboard's page in one file, with the answers the page
would ask the server for, computed now by the server's own functions (answers.py,
media.py, traces.py) for the chosen runs and embedded as JSON. The page's `api()` answers
from them, so every view works from the file alone.

What the file holds, and its bounds:
- the curves of the chosen keys, on the step and the wall-time axis (the relative-time
  axis is the wall time less the run's start), downsampled as the server does into as
  many pixel buckets as `POINTS` allows, in one ranks mode (`--ranks`);
- media blobs of at most `MAX_INLINE_IMAGE` bytes, as data: URIs;
- the generations, traces and events the dashboard shows of the runs unfiltered (a
  search in the page looks through these).

Text from the store can never leave the JSON: every ``<``, ``>`` and ``&`` in it is written
as a JSON escape, so neither ``</script>`` nor ``<!--`` can occur; the page's scripts and
styles are allowed by hash in its Content-Security-Policy, which allows no connection.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import hashlib
import html
import math
import re
from importlib import resources
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tracklake._read.query import with_connection
from tracklake._read.reader import ReadProblems, RunRecord
from tracklake._report.content import MAX_INLINE_IMAGE
from tracklake._report.series import CurveQuery, Require, available_keys, chosen_keys
from tracklake._ui import answers, media, traces
from tracklake._ui.json_bytes import json_bytes
from tracklake._ui.series import Ranks, SeriesQuery, XAxis

#: Points a report holds at most over all its curves and both x axes (about 25 bytes of
#: JSON each; a point of the mean of ranks counts twice, for its band). A curve gets as
#: many pixel buckets (each keeps its smallest and largest value) as this allows, between
#: `MIN_BUCKETS` and `MAX_BUCKETS`: zooming into a report of few keys shows fine detail,
#: and 1,000 keys stay a few MB.
POINTS = 160_000
MIN_BUCKETS, MAX_BUCKETS = 30, 500

DATA_ID = "tracklake-data"
_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
            "\u2029": "\\u2029"}


@dataclasses.dataclass(frozen=True)
class Charts:
    """How the report's charts start: ranks mode, x axis and smoothing weight."""

    ranks: Ranks
    rank: int | None  # `--ranks N`: only this rank's curves
    x: str
    smoothing: float

    @classmethod
    def of(cls, spec: CurveQuery) -> Charts:
        """`tracklake report`'s options as the page's controls: `--smooth N` (a trailing
        mean of N steps) as the exponential moving average of the same span
        (w = 1 - 2/(N+1)), `--x time` as the time since the run started."""
        ranks: Ranks = ("first" if spec.ranks is None else
                        spec.ranks if isinstance(spec.ranks, str) else "all")
        rank = spec.ranks if isinstance(spec.ranks, int) else None
        smoothing = math.floor((1 - 2 / (spec.smooth + 1)) * 100) / 100
        return cls(ranks, rank, "relative" if spec.x == "time" else "step", smoothing)


def read_answers(store: Path, records: list[RunRecord], spec: CurveQuery,
                 problems: ReadProblems) -> dict[str, Any]:
    """Everything the page asks the server for about `records`, as the server answers it
    (the charts of `spec.keys` only)."""
    runs = tuple((r.project, r.run) for r in records)
    # every key by default: a run with no metrics is no error then
    require: Require = "nothing" if spec.keys == ("*",) else "some run"
    available = with_connection(store, problems, lambda con: available_keys(
        con, records, spec.keys, require))
    chosen = tuple(chosen_keys(sorted({k for ks in available.values() for k in ks}),
                               spec.keys))
    charts = Charts.of(spec)
    wanted = set(chosen)
    buckets = _buckets(sum(len(wanted.intersection(available[(r.project, r.run)]))
                           * (len(r.ranks) if charts.ranks == "all" and charts.rank is None
                              else 1) for r in records), charts)
    order = {run: i for i, run in enumerate(runs)}  # as asked: the first run's colour first
    listed = answers.runs(store, problems)
    listed["runs"] = sorted((r for r in listed["runs"] if (r["project"], r["run"]) in order),
                            key=lambda r: order[(r["project"], r["run"])])
    series = {}
    axes: tuple[XAxis, ...] = ("step", "time")
    for x in axes:
        q = SeriesQuery(key="", runs=runs, x=x, ranks=charts.ranks, buckets=buckets)
        series[x] = {key: _compact(answer, charts) for key, answer in
                     answers.series_of_keys(store, q, chosen, problems).items()}
    timeout = answers.QUERY_TIMEOUT
    return {
        "report": {"runs": len(records), "keys": len(chosen), "ranks": charts.ranks,
                   "rank": charts.rank, "x": charts.x, "smoothing": charts.smoothing,
                   "buckets": buckets, "root": str(store), "version": version("tracklake"),
                   "written": _dt.datetime.now(_dt.timezone.utc).strftime(
                       "%Y-%m-%d %H:%M:%S UTC")},
        "runs": listed,
        "keys": [k for k in answers.keys(store, runs, problems) if k["key"] in wanted],
        "summaries": answers.summaries(store, chosen, runs, problems),
        "series": series,
        "generations": answers.generations(store, runs, "", problems),
        "histograms": media.histograms(store, runs, timeout, problems),
        "media": media.media(store, runs, timeout, MAX_INLINE_IMAGE, inline=True,
                             problems=problems),
        "traces": traces.traces(store, runs, "", timeout, problems),
        "events": traces.events(store, runs, "", "", timeout, problems),
    }


def _buckets(curves: int, charts: Charts) -> int:
    """The pixel buckets of each of `curves` curves within the budget of `POINTS`: two
    axes, two points a bucket; a point of the mean of ranks holds its band too."""
    per_bucket = 4 * (2 if charts.ranks == "mean" else 1)
    return max(MIN_BUCKETS, min(MAX_BUCKETS, POINTS // (per_bucket * max(curves, 1))))


def _compact(answer: dict[str, Any], charts: Charts) -> dict[str, Any]:
    """A series answer as embedded: with `--ranks N` only rank N's curves (the answer
    holds the band, lo and hi, only where the page draws it, and whole numbers as such)."""
    curves = [c for c in answer["curves"] if charts.rank is None or c["series"] == charts.rank]
    return {**answer, "curves": curves}


def _shared_sql(data: Any, texts: dict[str, int]) -> Any:
    """`data` with the text of each query (a ``{"sql", "params"}`` under ``queries`` or
    ``query``; never a dict from the store, such as a config) replaced by its place in
    `texts`: a query repeated for each key is written once."""
    if isinstance(data, list):
        return [_shared_sql(v, texts) for v in data]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name == "queries" and isinstance(value, list):
            out[name] = [_shared_query(q, texts) for q in value]
        elif name == "query" and isinstance(value, dict):
            out[name] = _shared_query(value, texts)
        else:
            out[name] = _shared_sql(value, texts)
    return out


def _shared_query(query: dict[str, Any], texts: dict[str, int]) -> dict[str, Any]:
    return {**query, "sql": texts.setdefault(query["sql"], len(texts))}


def embedded_json(data: dict[str, Any]) -> str:
    """`data` as the text of a ``<script type="application/json">``: no ``<``, ``>`` or
    ``&`` (JSON escapes instead), so no text from the store can end the element."""
    texts: dict[str, int] = {}
    shared = _shared_sql(data, texts)
    shared["sql"] = list(texts)
    text = json_bytes(shared).decode()
    return re.sub("[<>&\u2028\u2029]", lambda m: _ESCAPES[m.group()], text)


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def to_page(data: dict[str, Any]) -> str:
    """The dashboard's page with `data` embedded, its scripts and styles inline: one file
    that loads nothing from anywhere."""
    folder = resources.files("tracklake._ui") / "static"
    page = (folder / "index.html").read_text()
    styles = [(folder / name).read_text() for name in ("uPlot.min.css", "app.css")]
    scripts = [(folder / name).read_text() for name in ("uPlot.iife.min.js", "app.js")]
    csp = ("default-src 'none'; script-src " + " ".join(_hash(s) for s in scripts)
           + "; style-src " + " ".join(_hash(s) for s in styles)
           + "; img-src data:; media-src data:; connect-src 'none'; base-uri 'none'; "
           "form-action 'none'")
    labels = ", ".join(f"{r['project']}/{r['run']}" for r in data["runs"]["runs"])
    head = (f'<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" '
            f'content="{csp}">')
    page = page.replace('<meta charset="utf-8">', head, 1)
    page = page.replace("<title>tracklake</title>",
                        f"<title>tracklake report: {html.escape(labels)}</title>", 1)
    links = re.compile(r'<link rel="stylesheet" href="[^"]*">\n')
    page = links.sub("", page)
    page = page.replace("</head>", "".join(f"<style>{s}</style>\n" for s in styles)
                        + "</head>", 1)
    tags = re.compile(r'<script src="[^"]*"></script>\n')
    page = tags.sub("", page)
    body = (f'<script type="application/json" id="{DATA_ID}">{embedded_json(data)}'
            "</script>\n" + "".join(f"<script>{s}</script>\n" for s in scripts))
    return page.replace("</body>", body + "</body>", 1)
