"""What each JSON endpoint answers, read through `tracklake.query` (the CLI's read path:
DuckDB views over the store, the live tail included, on a connection that cannot write)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import QueryError
from tracklake._read.query import first_rows_sql, query, with_connection
from tracklake._read.reader import ReadProblems
from tracklake._read.scope import scope_of_views
from tracklake._ui.series import (
    SeriesQuery,
    attempts_sql,
    finite_or_mark,
    finite_or_mark_array,
    finite_or_none,
    run_ids,
    series_params,
    series_sql,
    whole_numbers,
)
from tracklake._ui.shown import shown

if TYPE_CHECKING:
    import duckdb

#: The SQL console shows at most this many rows (it says when there were more).
SQL_ROWS = 1000
#: A query from the page is stopped after this many seconds.
QUERY_TIMEOUT = 30.0


def _ask(store: Path, sql: str, params: dict[str, Any] | None = None,
         problems: ReadProblems | None = None) -> pa.Table:
    """`sql` over the store; a damaged file left out is noted in `problems` (by default in
    a list nobody reads: the page shows what could be read)."""
    return query(sql, root=store, params=params, timeout=QUERY_TIMEOUT,
                 problems=ReadProblems() if problems is None else problems)


def _cut(column: str, limit: int) -> str:
    """SQL of `column` cut past `limit` characters, with its length and md5 (so that two
    texts differing past the cut still differ)."""
    return (f"CASE WHEN length({column}) <= {limit} THEN {column} ELSE left({column}, "
            f"{limit}) || '… (' || length({column}) || ' characters, md5 ' || "
            f"left(md5({column}), 12) || ')' END")


_RUNS_SQL = f"""
SELECT r.project, r.run, r.name, r.status, r.attempts, r.ranks, r.tags,
       epoch(r.started_at) AS started, epoch(r.ended_at) AS ended, r.host, r.git_commit,
       i.git_dirty, i.command, i.python, coalesce(c.config, MAP {{}}) AS config
FROM runs r LEFT JOIN (
  SELECT project, run, map(list(key ORDER BY key), list(value ORDER BY key)) AS config
  FROM (SELECT project, run, key, {_cut("v", 300)} AS value
        FROM (SELECT project, run, key, any_value(value ORDER BY rank) AS v
              FROM run_configs GROUP BY ALL))
  GROUP BY ALL) c USING (project, run)
LEFT JOIN (
  SELECT project, run, arg_min(git_dirty, (rank, -attempt)) AS git_dirty,
         arg_min(command, (rank, -attempt)) AS command,
         arg_min(json_extract_string(identity, '$.python'), (rank, -attempt)) AS python
  FROM run_attempts GROUP BY ALL) i USING (project, run)
ORDER BY r.started_at DESC, r.project, r.run
"""


def runs(store: Path, problems: ReadProblems | None = None) -> dict[str, Any]:
    """Every run: identity (the lowest rank's latest attempt's command, Python and git
    state), status, attempts, ranks, tags, times and config (rank 0's), and the query
    they came from. A config value past 300 characters is cut, with its length and md5
    (two that differ still show as different): the page asks for this every second, and
    a prompt template of a megabyte in each of 20 runs made 20 MB of every poll."""
    rows: list[dict[str, Any]] = _ask(store, _RUNS_SQL, None, problems).to_pylist()
    for row in rows:
        row["config"] = dict(row["config"] or [])
    return {"runs": rows, "queries": [shown(_RUNS_SQL, {})]}


def _keys_sql(runs: bool) -> str:
    where = "WHERE list_contains($runs, project || chr(31) || run) " if runs else ""
    return ("SELECT key, max(count) AS points, count(DISTINCT (project, run)) AS runs\n"
            f"FROM metric_summaries {where}GROUP BY key ORDER BY key")


def keys(store: Path, runs: tuple[tuple[str, str], ...] | None = None,
         problems: ReadProblems | None = None) -> list[dict[str, Any]]:
    """Every metric key (of `runs`, if given), with the most points one run's rank logged
    of it."""
    params = None if runs is None else {"runs": run_ids(runs)}
    rows: list[dict[str, Any]] = _ask(store, _keys_sql(runs is not None), params,
                                          problems).to_pylist()
    return rows


def _summary_sql(many: bool) -> str:
    where = ("key = $key" if not many else
             "list_contains($keys, key) AND list_contains($runs, project || chr(31) || run)")
    return ("SELECT project, run, arg_min(last_value, rank) AS last, arg_min(min, rank) AS "
            f"min,\n       arg_min(max, rank) AS max{', key' if many else ''}\n"
            f"FROM metric_summaries WHERE {where} GROUP BY ALL")


def summary(store: Path, key: str) -> dict[str, Any]:
    """Each run's last, smallest and largest value of `key` (its lowest rank's), for the
    runs table to sort by, and the query they came from."""
    return _summary_rows({key: []}, _ask(store, _summary_sql(False), {"key": key}))[key]


def summaries(store: Path, keys: tuple[str, ...], runs: tuple[tuple[str, str], ...],
              problems: ReadProblems | None = None) -> dict[str, dict[str, Any]]:
    """Per key, what `summary` answers for it about `runs`, read by one query for all."""
    asked = {"keys": list(keys), "runs": run_ids(runs)}
    rows = _ask(store, _summary_sql(True), asked, problems) if keys else None
    return _summary_rows({k: [] for k in keys}, rows)


def _summary_rows(out: dict[str, list[dict[str, Any]]], table: pa.Table | None
                  ) -> dict[str, dict[str, Any]]:
    for row in table.to_pylist() if table is not None else []:
        key = row.pop("key") if "key" in row else next(iter(out))
        for name in ("last", "min", "max"):
            row[name] = _jsonable(row[name])
        out[key].append(row)
    return {k: {"rows": rows, "queries": [shown(_summary_sql(False), {"key": k})]}
            for k, rows in out.items()}


def series(store: Path, q: SeriesQuery) -> dict[str, Any]:
    """The key's curves, at most about twice `buckets` points each (plus non-finite marks)."""
    return series_of_keys(store, q, (q.key,))[q.key]


def series_of_keys(store: Path, q: SeriesQuery, keys: tuple[str, ...],
                   problems: ReadProblems | None = None) -> dict[str, dict[str, Any]]:
    """Per key of `keys`, what `series` answers for it (`q` with that key), read by one
    query for the curves of all of them and one for their attempt lines, on one
    connection (its views made once: about 30 ms of each request on a small store).
    Each key's answer shows the queries that read it alone."""
    if not keys:
        return {}
    many = len(keys) > 1
    if not many:
        q = dataclasses.replace(q, key=keys[0])
    params = series_params(q) if not many else {
        **{k: v for k, v in series_params(q).items() if k != "key"}, "keys": list(keys)}
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        one = dataclasses.replace(q, key=key)
        out[key] = {"key": key, "x": q.x, "ranks": q.ranks, "group": q.group, "curves": [],
                    "attempts": [], "queries": [shown(series_sql(one), series_params(one))]}
    asked = {"runs": params["runs"], **({"keys": params["keys"]} if many else {"key": q.key})}

    def read(con: duckdb.DuckDBPyConnection) -> tuple[pa.Table, pa.Table | None]:
        curves = query(series_sql(q, many), params=params, connection=con,
                       timeout=QUERY_TIMEOUT)
        if q.group is not None:  # a group's curve is over runs: no run's attempts on it
            return curves, None
        return curves, query(attempts_sql(q, many), params=asked, connection=con,
                             timeout=QUERY_TIMEOUT)

    views = {"metrics", "metric_summaries", "runs"} | (
        {"run_configs"} if q.group is not None else set())
    curves, attempts = with_connection(store, ReadProblems() if problems is None
                                       else problems, read, scope_of_views(views))
    band = q.ranks == "mean" or q.group is not None  # else lo and hi are y: not sent
    shown_columns = ["project", "run", "series", "n", "xs", "ys", "key"] + (
        ["los", "his"] if band else [])
    # a few rows' values as Python objects at a time: all of a thousand runs' curves at
    # once were several times the answer's JSON
    for batch in curves.select(shown_columns).to_batches(max_chunksize=64):
        for row in _curves_of(batch, band):
            out[row.pop("key")]["curves"].append(row)
    if attempts is not None:
        for row in attempts.to_pylist():
            out[row.pop("key")]["attempts"].append(row)
        for key in keys:
            out[key]["queries"].append(shown(attempts_sql(q),
                                             {"key": key, "runs": params["runs"]}))
    return out


def _curves_of(batch: pa.RecordBatch, band: bool) -> Iterator[dict[str, Any]]:
    """Each row of `batch` as a curve of the answer (with its key), its points made
    lists a whole curve at a time (per point in Python, they were a third of a request
    for a thousand runs' charts)."""
    names = ["xs", "ys", *(["los", "his"] if band else [])]
    lists = {n: batch.column(n) for n in names}
    if any(lists[n].flatten().null_count for n in names):  # a null: point by point
        yield from (_curve_of_row(row, band) for row in batch.to_pylist())
        return
    values = {n: lists[n].flatten().to_numpy() for n in names}
    ends = np.cumsum(pc.list_value_length(lists["xs"]).to_numpy(zero_copy_only=False))
    meta = batch.select(["project", "run", "series", "n", "key"]).to_pylist()
    for i, row in enumerate(meta):
        at = slice(int(ends[i - 1]) if i else 0, int(ends[i]))
        xs = values["xs"][at]
        ys, marks = finite_or_mark_array(xs, values["ys"][at])
        curve = {"project": row["project"], "run": row["run"], "series": row["series"],
                 "points": row["n"], "x": whole_numbers(xs), "y": ys, "marks": marks,
                 "key": row["key"]}
        if band:
            curve["lo"] = finite_or_none(values["los"][at])
            curve["hi"] = finite_or_none(values["his"][at])
        yield curve


def _curve_of_row(row: dict[str, Any], band: bool) -> dict[str, Any]:
    ys, marks = finite_or_mark(row["xs"], row["ys"])
    curve = {"project": row["project"], "run": row["run"], "series": row["series"],
             "points": row["n"], "x": [whole(v) for v in row["xs"]], "y": ys,
             "marks": marks, "key": row["key"]}
    if band:
        curve["lo"] = [v if v is not None and math.isfinite(v) else None for v in row["los"]]
        curve["hi"] = [v if v is not None and math.isfinite(v) else None for v in row["his"]]
    return curve


def whole(value: float) -> float | int:
    """`value` as an int when it is a whole number that a double holds exactly: a step
    is sent as ``12``, not ``12.0`` (the answers of a thousand runs' charts are JSON of
    tens of megabytes)."""
    return int(value) if isinstance(value, float) and value.is_integer() and \
        abs(value) < 2**53 else value


#: The generations view shows this many prompts (the latest first) and at most this many
#: outputs in all.
GENERATION_PROMPTS = 50
GENERATION_ROWS = 2000
#: A prompt or output past this many characters is cut (a search still looks through the
#: whole text): one output of 12 MB made the view's answer 12 MB.
GENERATION_CHARACTERS = 50_000

_GENERATIONS_SQL = f"""
WITH g AS (
  SELECT project, run, step, key, sample, input, output, score FROM generations
  WHERE list_contains($runs, project || chr(31) || run)
    AND ($q = '' OR contains(lower(coalesce(input, '')), lower($q))
         OR contains(lower(coalesce(output, '')), lower($q)))),
prompts AS (SELECT input, max(step) AS last FROM g GROUP BY input
            ORDER BY last DESC NULLS LAST, input LIMIT {GENERATION_PROMPTS})
SELECT g.project, g.run, g.step, g.key, g.sample, {_cut("g.input", GENERATION_CHARACTERS)}
       AS input, {_cut("g.output", GENERATION_CHARACTERS)} AS output, g.score
FROM g JOIN prompts p ON g.input IS NOT DISTINCT FROM p.input
ORDER BY p.last DESC NULLS LAST, g.input, g.step, g.project, g.run, g.sample
LIMIT {GENERATION_ROWS}
"""


def generations(store: Path, runs: tuple[tuple[str, str], ...], search: str,
                problems: ReadProblems | None = None) -> dict[str, Any]:
    """The runs' generations whose prompt or output contains `search` (any case), by
    prompt, latest prompt first: one prompt's outputs across runs and steps together;
    and the query they came from."""
    params = {"runs": run_ids(runs), "q": search}
    queries = [shown(_GENERATIONS_SQL, params)]
    try:
        rows: list[dict[str, Any]] = _ask(store, _GENERATIONS_SQL, params,
                                                   problems).to_pylist()
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
