"""What a report shows of each run, each part read by one SQL query that the report
prints beside it (so a reader can run it again with `tracklake sql`)."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracklake._read.query import query
from tracklake.read import media_file

if TYPE_CHECKING:
    import duckdb

    from tracklake._read.reader import RunRecord

#: Rows at most per run in the generations table and spans in the trace trees; the
#: report says when a run has more.
MAX_GENERATIONS = 2000
MAX_SPANS = 2000
#: Histograms drawn per key (the latest steps), and images shown per key (the latest).
MAX_HISTOGRAM_STEPS = 40
MAX_IMAGES = 12

RUN_SQL = "SELECT * FROM runs WHERE project = $p AND run = $r"
CONFIG_SQL = """SELECT key, arg_max(value, seq) AS value FROM configs
WHERE project = $p AND run = $r AND rank = $rank GROUP BY key ORDER BY key"""
GENERATIONS_SQL = f"""SELECT step, key, sample, input, output, score, rank FROM generations
WHERE project = $p AND run = $r ORDER BY step, key, rank, sample LIMIT {MAX_GENERATIONS + 1}"""


def traces_sql(search: bool = False) -> str:
    """A run's spans (`$p`, `$r`), at most `MAX_SPANS` + 1; with `search`, only those of
    the traces one of whose spans holds `$q` (any case) in its name, status, error,
    attributes, inputs or outputs."""
    found = "" if not search else """
  AND trace_id IN (SELECT trace_id FROM traces WHERE project = $p AND run = $r
    AND contains(lower(concat_ws(chr(10), name, status, error, attributes, inputs,
                                 outputs)), lower($q)))"""
    return (f"""SELECT trace_id, span_id, parent_id, name, status, error, step, rank,
       attributes, inputs, outputs, epoch_ms(end_time) - epoch_ms(time) AS ms
FROM traces WHERE project = $p AND run = $r{found}"""
            f" ORDER BY step, time, seq LIMIT {MAX_SPANS + 1}")


TRACES_SQL = traces_sql()
HISTOGRAMS_SQL = f"""SELECT key, step, edges, counts FROM histograms
WHERE project = $p AND run = $r AND rank = $rank
QUALIFY row_number() OVER (PARTITION BY key ORDER BY step DESC, seq DESC)
  <= {MAX_HISTOGRAM_STEPS}
ORDER BY key, step, seq"""
EVENTS_SQL = """SELECT time, step, rank, level, kind, title, text FROM events
WHERE project = $p AND run = $r ORDER BY time, seq"""


def media_sql(types: tuple[str, ...]) -> str:
    """The latest `MAX_IMAGES` media items of each key of a run, of the `types` (image,
    audio, video: fixed names, never text from a request)."""
    kinds = ", ".join(f"'{t}'" for t in types)
    return f"""SELECT key, step, rank, type, caption, media_type, digest, size FROM media
WHERE project = $p AND run = $r AND type IN ({kinds})
QUALIFY row_number() OVER (PARTITION BY key ORDER BY step DESC, rank DESC, seq DESC)
  <= {MAX_IMAGES}
ORDER BY key, step, rank, seq"""


IMAGES_SQL = media_sql(("image",))


@dataclass
class Span:
    """A span of a trace with its children, for an expandable tree."""

    row: dict[str, Any]
    children: list[Span] = field(default_factory=list)


@dataclass
class RunParts:
    """Everything a report shows of one run, as rows."""

    record: RunRecord
    run: dict[str, Any]
    config: dict[str, str]
    generations: list[dict[str, Any]]
    traces: list[Span]
    events: list[dict[str, Any]]
    more_generations: bool = False
    more_spans: bool = False
    histograms: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per key
    images: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per key

    @property
    def label(self) -> str:
        return f"{self.record.project}/{self.record.run}"


def read_parts(con: duckdb.DuckDBPyConnection, record: RunRecord) -> RunParts:
    """One run's identity, latest config (lowest rank), generations, traces, events, the
    latest histograms (lowest rank) and images of each key."""
    params: dict[str, Any] = {"p": record.project, "r": record.run}
    runs = query(RUN_SQL, params=params, connection=con).to_pylist()
    config = query(CONFIG_SQL, params={**params, "rank": min(record.ranks)},
                   connection=con).to_pylist()
    generations = query(GENERATIONS_SQL, params=params, connection=con).to_pylist()
    spans = query(TRACES_SQL, params=params, connection=con).to_pylist()
    events = query(EVENTS_SQL, params=params, connection=con).to_pylist()
    return RunParts(
        record=record, run=runs[0] if runs else {},
        config={row["key"]: row["value"] for row in config},
        generations=generations[:MAX_GENERATIONS], traces=trees(spans[:MAX_SPANS]),
        events=events, more_generations=len(generations) > MAX_GENERATIONS,
        more_spans=len(spans) > MAX_SPANS,
        histograms=read_histograms(con, record.project, record.run, min(record.ranks)),
        images=read_media(con, record.project, record.run, IMAGES_SQL))


def read_histograms(con: duckdb.DuckDBPyConnection, project: str, run: str, rank: int,
                    timeout: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per histogram key of the run's `rank`, its latest `MAX_HISTOGRAM_STEPS` records
    (step, edges, counts) in step order."""
    return _by_key(query(HISTOGRAMS_SQL, params={"p": project, "r": run, "rank": rank},
                         connection=con, timeout=timeout).to_pylist())


def read_media(con: duckdb.DuckDBPyConnection, project: str, run: str, sql: str,
               timeout: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per media key of the run, the items `sql` (a `media_sql`) picks, in step order."""
    return _by_key(query(sql, params={"p": project, "r": run}, connection=con,
                         timeout=timeout).to_pylist())


def media_files(root: str | os.PathLike[str], media: dict[str, list[dict[str, Any]]],
                types: Collection[str], limit: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """Per key, its items, each with ``blob``: its file, or None for one whose blob is
    missing, not of the declared size, larger than `limit`, or of a media type not in
    `types` (what may be handed to a browser)."""
    return [(key, [{**row, "blob": media_file(root, row["digest"], row["size"], limit)
                    if row["media_type"] in types else None} for row in rows])
            for key, rows in media.items()]


def _by_key(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["key"], []).append(row)
    return out


def trees(rows: list[dict[str, Any]]) -> list[Span]:
    """Spans as trees: a span whose parent is not among the rows is a root, and so is the
    first span (in row order) of each loop of parents (A's parent B, B's parent A: a
    buggy tracer's, or crafted), cut from its parent, so that no span is left out and
    every tree ends."""
    spans = {(row["trace_id"], row["span_id"]): Span(row) for row in rows}
    roots = []
    parents: dict[int, Span] = {}
    for (trace, _), span in spans.items():
        parent = spans.get((trace, span.row["parent_id"]))
        if parent is None or parent is span:
            roots.append(span)
        else:
            parent.children.append(span)
            parents[id(span)] = parent
    reached: set[int] = set()
    order = {id(span): i for i, span in enumerate(spans.values())}

    def reach(top: Span) -> None:
        todo = [top]
        while todo:
            span = todo.pop()
            reached.add(id(span))
            todo.extend(c for c in span.children if id(c) not in reached)

    for root in roots:
        reach(root)
    for span in spans.values():
        if id(span) in reached:
            continue
        # in a loop of parents or below one: go up into the loop, and cut it at its
        # first span in row order
        cut, seen = span, {id(span)}
        while id(parents[id(cut)]) not in seen:
            cut = parents[id(cut)]
            seen.add(id(cut))
        loop = [cut]
        while parents[id(loop[-1])] is not cut:
            loop.append(parents[id(loop[-1])])
        cut = min(loop, key=lambda s: order[id(s)])
        parents[id(cut)].children.remove(cut)
        roots.append(cut)
        reach(cut)
    return roots


@dataclass(frozen=True)
class ConfigRow:
    key: str
    values: list[str]  # one per run, "" where the run has no such key
    differs: bool


def config_diff(parts: list[RunParts]) -> list[ConfigRow]:
    """Every config key of the runs, differing ones first, then alphabetical."""
    keys = sorted({k for p in parts for k in p.config})
    rows = []
    for key in keys:
        values = [_show(p.config.get(key)) for p in parts]
        rows.append(ConfigRow(key, values, len(set(values)) > 1))
    return sorted(rows, key=lambda r: (not r.differs, r.key))


def _show(value: str | None) -> str:
    """A config value (JSON) as text: strings without their quotes."""
    if value is None:
        return ""
    try:
        decoded = json.loads(value)
        return decoded if isinstance(decoded, str) else json.dumps(decoded)
    except (ValueError, RecursionError):  # not JSON, or nesting past what Python decodes
        return value
