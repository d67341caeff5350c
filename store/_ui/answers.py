"""What each JSON endpoint answers, read through `tracklake.query` (the CLI's read path:
DuckDB views over the store, the live tail included, on a connection that cannot write)."""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._errors import QueryError
from tracklake._read.query import first_rows_sql, query
from tracklake._read.reader import ReadProblems
from tracklake._ui.series import (
    SeriesQuery,
    attempts_sql,
    finite_or_mark,
    run_ids,
    series_params,
    series_sql,
)
from tracklake._ui.shown import shown

#: The SQL console shows at most this many rows (it says when there were more).
SQL_ROWS = 1000
#: A query from the page is stopped after this many seconds.
QUERY_TIMEOUT = 30.0


def _ask(store: Path, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
    return query(sql, root=store, params=params, problems=ReadProblems(),
                 timeout=QUERY_TIMEOUT)


_RUNS_SQL = """
SELECT r.project, r.run, r.name, r.status, r.attempts, r.ranks, r.tags,
       epoch(r.started_at) AS started, epoch(r.ended_at) AS ended,
       coalesce(c.config, MAP {}) AS config
FROM runs r LEFT JOIN (
  SELECT project, run, map(list(key ORDER BY key), list(value ORDER BY key)) AS config
  FROM (SELECT project, run, key, any_value(value ORDER BY rank) AS value
        FROM run_configs GROUP BY ALL)
  GROUP BY ALL) c USING (project, run)
ORDER BY r.started_at DESC, r.project, r.run
"""


def runs(store: Path) -> dict[str, Any]:
    """Every run: identity, status, attempts, ranks, tags, times and config (rank 0's),
    and the query they came from."""
    rows: list[dict[str, Any]] = _ask(store, _RUNS_SQL).to_pylist()
    for row in rows:
        row["config"] = dict(row["config"] or [])
    return {"runs": rows, "queries": [shown(_RUNS_SQL, {})]}


_KEYS_SQL = """
SELECT key, max(count) AS points, count(DISTINCT (project, run)) AS runs
FROM metric_summaries GROUP BY key ORDER BY key
"""


def keys(store: Path) -> list[dict[str, Any]]:
    """Every metric key, with the most points one run's rank logged of it."""
    rows: list[dict[str, Any]] = _ask(store, _KEYS_SQL).to_pylist()
    return rows


_SUMMARY_SQL = """
SELECT project, run, arg_min(last_value, rank) AS last, arg_min(min, rank) AS min,
       arg_min(max, rank) AS max
FROM metric_summaries WHERE key = $key GROUP BY ALL
"""


def summary(store: Path, key: str) -> dict[str, Any]:
    """Each run's last, smallest and largest value of `key` (its lowest rank's), for the
    runs table to sort by, and the query they came from."""
    rows: list[dict[str, Any]] = _ask(store, _SUMMARY_SQL, {"key": key}).to_pylist()
    for row in rows:
        for name in ("last", "min", "max"):
            row[name] = _jsonable(row[name])
    return {"rows": rows, "queries": [shown(_SUMMARY_SQL, {"key": key})]}


def series(store: Path, q: SeriesQuery) -> dict[str, Any]:
    """The key's curves, at most about twice `buckets` points each (plus non-finite marks)."""
    curves = []
    for row in _ask(store, series_sql(q), series_params(q)).to_pylist():
        ys, marks = finite_or_mark(row["xs"], row["ys"])
        curves.append({
            "project": row["project"], "run": row["run"], "series": row["series"],
            "points": row["n"], "x": row["xs"], "y": ys, "marks": marks,
            "lo": [v if v is not None and math.isfinite(v) else None for v in row["los"]],
            "hi": [v if v is not None and math.isfinite(v) else None for v in row["his"]]})
    queries = [shown(series_sql(q), series_params(q))]
    takeovers = []
    if q.group is None:
        params = {"key": q.key, "runs": series_params(q)["runs"]}
        takeovers = _ask(store, attempts_sql(q), params).to_pylist()
        queries.append(shown(attempts_sql(q), params))
    return {"key": q.key, "x": q.x, "ranks": q.ranks, "group": q.group, "curves": curves,
            "attempts": takeovers, "queries": queries}


#: The generations view shows this many prompts (the latest first) and at most this many
#: outputs in all.
GENERATION_PROMPTS = 50
GENERATION_ROWS = 2000

_GENERATIONS_SQL = f"""
WITH g AS (
  SELECT project, run, step, key, sample, input, output, score FROM generations
  WHERE list_contains($runs, project || chr(31) || run)
    AND ($q = '' OR contains(lower(coalesce(input, '')), lower($q))
         OR contains(lower(coalesce(output, '')), lower($q)))),
prompts AS (SELECT input, max(step) AS last FROM g GROUP BY input
            ORDER BY last DESC NULLS LAST, input LIMIT {GENERATION_PROMPTS})
SELECT g.project, g.run, g.step, g.key, g.sample, g.input, g.output, g.score
FROM g JOIN prompts p ON g.input IS NOT DISTINCT FROM p.input
ORDER BY p.last DESC NULLS LAST, g.input, g.step, g.project, g.run, g.sample
LIMIT {GENERATION_ROWS}
"""


def generations(store: Path, runs: tuple[tuple[str, str], ...], search: str
                ) -> dict[str, Any]:
    """The runs' generations whose prompt or output contains `search` (any case), by
    prompt, latest prompt first: one prompt's outputs across runs and steps together;
    and the query they came from."""
    params = {"runs": run_ids(runs), "q": search}
    queries = [shown(_GENERATIONS_SQL, params)]
    try:
        rows: list[dict[str, Any]] = _ask(store, _GENERATIONS_SQL, params).to_pylist()
    except QueryError as exc:
        if not _no_such_view(exc):
            raise
        return {"rows": [], "queries": queries}  # no run logged generations: no such view
    for row in rows:
        row["score"] = _jsonable(row["score"])
    return {"rows": rows, "queries": queries}


def _no_such_view(exc: QueryError) -> bool:
    import duckdb

    return isinstance(exc.__cause__, duckdb.CatalogException)


def sql(store: Path, statement: str, params: dict[str, str] | None = None
        ) -> dict[str, Any]:
    """The console's answer: column names and the first `SQL_ROWS` rows as JSON values;
    anything but a read-only statement raises QueryError. `params` are the values of the
    statement's ``$name`` parameters, as text (`tracklake._read.sql_params`)."""
    first = first_rows_sql(statement, SQL_ROWS + 1)
    table = _ask(store, first or statement, params or None)
    rows = [[_jsonable(v) for v in row.values()] for row in table.to_pylist()]
    return {"columns": table.column_names, "rows": rows[:SQL_ROWS],
            "truncated": len(rows) > SQL_ROWS}


def _jsonable(value: Any) -> Any:
    """A cell as JSON: numbers and text as they are, NaN/inf and everything else as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
