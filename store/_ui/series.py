"""The curves of one key for a set of runs, downsampled on the server: each pixel bucket
keeps its smallest and largest finite value (the extremes stay visible) and one point of
each non-finite kind it holds (NaN, +inf, -inf are never hidden)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

XAxis = Literal["step", "time", "relative"]
Ranks = Literal["first", "mean", "all"]

#: What x is, per axis: the step, the wall time (seconds since the epoch) or the seconds
#: since the run started.
_X = {"step": "CAST(step AS DOUBLE)",
      "time": "epoch(time)",
      "relative": "epoch(time) - epoch(started)"}


@dataclass(frozen=True)
class SeriesQuery:
    """One chart's request: the key, the runs (`project`, `run`), the x axis, what to do
    with several ranks, an optional x range (zoom) and the number of pixel buckets."""

    key: str
    runs: tuple[tuple[str, str], ...]
    x: XAxis = "step"
    ranks: Ranks = "first"
    lo: float | None = None
    hi: float | None = None
    buckets: int = 1000
    #: a config key: the runs with one value of it make one curve, their mean per step,
    #: with the range over the runs as its band (project "group", run the value)
    group: str | None = None


def series_sql(q: SeriesQuery, many: bool = False) -> str:
    """The SQL (parameters $key, $runs, $lo, $hi, $buckets, and $group if grouped; each
    also works given as text, as the SQL console gives them): one row
    per curve with its points in x order; `lo`/`hi` are the range over ranks or over a
    group's runs (the mean's band). With `many`, the curves of every key in the list
    $keys instead of $key, each key's computed apart (a report asks for all at once).

    The runs and keys asked for are numbered first, from their summaries: each point then
    carries its curve's number, not its project, run and key, through the passes. One pass
    counts each curve's points in the range, one more sums each pixel bucket up (its
    finite extremes with their x, the first x of each non-finite kind, the band): 10 M
    points of one key take about six times what DuckDB takes to read them
    (benchmarks/dashboard_series.py). A curve's points are put in x order once, as one
    list of (x, y, lo, hi), then split: four lists each sorted on its own took the query
    for five charts of a thousand runs 0.72 s, not 0.52. Values get `+ 0.0`: a zero is
    sent as 0, never -0 (DuckDB's min of -0.0 and 0.0 is either, by its threads' order,
    so a band's edge changed sign from one answer to the next)."""
    grouped = q.group is not None
    config = ("" if not grouped else
              "LEFT JOIN (SELECT project, run, any_value(value ORDER BY rank) AS g "
              "FROM run_configs WHERE key = $group GROUP BY ALL) c USING (project, run)")
    started = "" if q.x != "relative" else "JOIN starts USING (project, run)"
    relative = ", started" if q.x == "relative" else ""
    # a curve is a run's key, or a group's: the runs with one value of the config key
    curve = ("cid" if not grouped else
             "dense_rank() OVER (ORDER BY coalesce(g, '(unset)'), key)")
    return f"""
WITH starts AS MATERIALIZED (SELECT project, run, started_at AS started FROM runs),
asked AS (
  SELECT project, run, key, min(rank) AS first_rank FROM metric_summaries
  WHERE {_keys(many, "key")} AND list_contains($runs, project || chr(31) || run)
  GROUP BY ALL),
curves AS MATERIALIZED (
  SELECT *, {curve} AS curve
  FROM (SELECT a.*{", g" if grouped else ""}{relative}, row_number() OVER () AS cid
        FROM asked a {config} {started})),
shown AS MATERIALIZED (
  SELECT DISTINCT curve, {"'group'" if grouped else "project"} AS project,
         {"coalesce(g, '(unset)')" if grouped else "run"} AS run, key FROM curves),
raw AS (
  SELECT c.cid, c.curve, c.first_rank, m.rank, m.step, {_X[q.x]} AS x, m.value
  FROM metrics m JOIN curves c USING (project, run, key)
  WHERE {_keys(many, "m.key")} AND m.step IS NOT NULL),
points AS MATERIALIZED (
  SELECT curve, series, x, value, lo, hi FROM ({_per_x(q)})
  WHERE x BETWEEN $lo::DOUBLE AND $hi::DOUBLE),
sized AS MATERIALIZED (
  SELECT curve, series, count(*) AS n, min(x) AS x0, max(x) AS x1
  FROM points GROUP BY ALL),
bucketed AS MATERIALIZED (
  SELECT p.*, s.n, CASE WHEN s.n <= 2 * $buckets::BIGINT OR s.x1 = s.x0 THEN NULL
                        ELSE least(CAST(floor((p.x - s.x0) * $buckets::BIGINT / (s.x1 - s.x0))
                                        AS BIGINT), $buckets::BIGINT - 1) END AS bucket
  FROM points p JOIN sized s USING (curve, series)),
summed AS MATERIALIZED (
  SELECT curve, series, n,
         min(value) FILTER (WHERE isfinite(value)) AS vmin,
         max(value) FILTER (WHERE isfinite(value)) AS vmax,
         arg_min(x, (value, x)) FILTER (WHERE isfinite(value)) AS xmin,
         arg_max(x, (value, -x)) FILTER (WHERE isfinite(value)) AS xmax,
         min(lo) FILTER (WHERE isfinite(value)) AS lo_f,
         max(hi) FILTER (WHERE isfinite(value)) AS hi_f,
         {_first_of("isnan(value)", "nan")}, {_first_of("value = 'inf'::DOUBLE", "inf")},
         {_first_of("value = '-inf'::DOUBLE", "ninf")}
  FROM bucketed WHERE bucket IS NOT NULL GROUP BY curve, series, n, bucket),
kept AS (
  SELECT curve, series, n, x, value, lo, hi FROM bucketed WHERE bucket IS NULL
  UNION ALL SELECT curve, series, n, xmin, vmin, lo_f, hi_f FROM summed
            WHERE xmin IS NOT NULL
  UNION ALL SELECT curve, series, n, xmax, vmax, lo_f, hi_f FROM summed
            WHERE xmax IS NOT NULL
  UNION ALL SELECT curve, series, n, x_nan, 'nan'::DOUBLE, lo_nan, hi_nan
            FROM summed WHERE x_nan IS NOT NULL
  UNION ALL SELECT curve, series, n, x_inf, 'inf'::DOUBLE, lo_inf, hi_inf
            FROM summed WHERE x_inf IS NOT NULL
  UNION ALL SELECT curve, series, n, x_ninf, '-inf'::DOUBLE, lo_ninf, hi_ninf
            FROM summed WHERE x_ninf IS NOT NULL),
lines AS (
  SELECT curve, series, any_value(n) AS n,
         list({{'x': x, 'y': value, 'lo': lo, 'hi': hi}} ORDER BY x, value) AS xy
  FROM (SELECT DISTINCT * FROM kept) GROUP BY curve, series)
SELECT s.project, s.run, l.series, [p.x FOR p IN l.xy] AS xs,
       [p.y + 0.0 FOR p IN l.xy] AS ys, [p.lo + 0.0 FOR p IN l.xy] AS los,
       [p.hi + 0.0 FOR p IN l.xy] AS his, l.n, s.key
FROM lines l JOIN shown s USING (curve) ORDER BY s.key, s.project, s.run, l.series
"""


def _keys(many: bool, column: str) -> str:
    return f"list_contains($keys, {column})" if many else f"{column} = $key"


def _first_of(kind: str, name: str) -> str:
    """A bucket's first x of one kind of non-finite value, with the band of those rows."""
    return (f"min(x) FILTER (WHERE {kind}) AS x_{name}, "
            f"min(lo) FILTER (WHERE {kind}) AS lo_{name}, "
            f"max(hi) FILTER (WHERE {kind}) AS hi_{name}")


def _mean() -> str:
    import duckdb

    exact = int(duckdb.__version__.split(".")[0]) >= 2  # 1.5's fsum depends on order
    total = "fsum(value)" if exact else "fsum(value ORDER BY value)"
    return ("CASE WHEN bool_or(isnan(value)) OR (bool_or(value = 'inf'::DOUBLE) AND "
            "bool_or(value = '-inf'::DOUBLE)) THEN 'nan'::DOUBLE "
            "WHEN bool_or(value = 'inf'::DOUBLE) THEN 'inf'::DOUBLE "
            "WHEN bool_or(value = '-inf'::DOUBLE) THEN '-inf'::DOUBLE "
            f"ELSE {total} / count(value) END AS value")


_MEAN = _mean()


def _per_x(q: SeriesQuery) -> str:
    """One row per curve and x: a rank's, the ranks' mean (per run: `cid`), or a group's
    mean over its runs. A mean's sum is `fsum`'s: a plain float sum depends on the order
    DuckDB's threads add in, and its last bit moved tied extremes to another x from one
    answer to the next. DuckDB 2's `fsum` is exact in any order; 1.5's (Python 3.10's)
    is not (125 of 300 sums of three thirds differed by order), so there it sums the
    values sorted, which takes a 10 M-point mean 4.3 s, not 2.9. Non-finite values get
    IEEE's mean, spelled out: 1.5's `fsum` of 1 and inf is NaN."""
    if q.ranks == "mean":
        rows = (f"SELECT curve, -1 AS series, step, min(x) AS x, {_MEAN}, "
                "min(value) AS lo, max(value) AS hi FROM raw GROUP BY cid, curve, step")
    else:
        rows = ("SELECT curve, rank AS series, step, x, value, value AS lo, value AS hi "
                "FROM raw" + (" WHERE rank = first_rank" if q.ranks == "first" else ""))
    if q.group is None:
        return rows
    return (f"SELECT curve, -1 AS series, step, min(x) AS x, {_MEAN}, "
            f"min(lo) AS lo, max(hi) AS hi FROM ({rows}) GROUP BY curve, step")


#: Where a resumed attempt took over in each run: the first step of each later attempt
#: that the default views show (the steps it logged again hide the earlier attempt's).
ATTEMPTS_SQL = """
SELECT m.project, m.run, m.attempt, min(m.step) AS step, arg_min({x}, m.step) AS x, m.key
FROM metrics m JOIN (SELECT project, run, started_at AS started FROM runs) r
     USING (project, run)
WHERE {keys} AND m.step IS NOT NULL AND m.attempt > 1
  AND list_contains($runs, m.project || chr(31) || m.run)
GROUP BY ALL ORDER BY ALL
"""


def attempts_sql(q: SeriesQuery, many: bool = False) -> str:
    """`ATTEMPTS_SQL` for `q`'s x axis, of $key (with `many`: of each key in $keys)."""
    return ATTEMPTS_SQL.replace("{x}", _X[q.x].replace("step", "m.step")
                                .replace("epoch(time)", "epoch(m.time)")).replace(
        "{keys}", _keys(many, "m.key"))


def run_ids(runs: tuple[tuple[str, str], ...]) -> list[str]:
    """The `$runs` parameter: each run as ``project || chr(31) || run`` (a byte no name
    holds), for ``list_contains($runs, project || chr(31) || run)``."""
    return [f"{p}\x1f{r}" for p, r in runs]


def series_params(q: SeriesQuery) -> dict[str, Any]:
    params = {"key": q.key, "runs": run_ids(q.runs),
              "lo": -math.inf if q.lo is None else q.lo,
              "hi": math.inf if q.hi is None else q.hi, "buckets": q.buckets}
    if q.group is not None:
        params["group"] = q.group
    return params


def whole_numbers(xs: np.ndarray) -> list[float | int]:
    """`xs` as a list, each whole number that a double holds exactly as an int: a step is
    sent as ``12``, not ``12.0`` (the answers of a thousand runs' charts are JSON of tens
    of megabytes). Decided for the whole array at once (a million points a request)."""
    with np.errstate(invalid="ignore"):
        exact = (xs == np.floor(xs)) & (np.abs(xs) < 2**53)
    if exact.all():
        return list(xs.astype(np.int64).tolist())
    if not exact.any():
        return list(xs.tolist())
    return [int(v) if e else v for v, e in zip(xs.tolist(), exact.tolist(), strict=True)]


def finite_or_none(values: np.ndarray) -> list[float | None]:
    """`values` as a list, a non-finite one as None (a gap)."""
    out: list[float | None] = values.tolist()
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        out[i] = None
    return out


def finite_or_mark_array(xs: np.ndarray, ys: np.ndarray
                         ) -> tuple[list[float | None], list[list[Any]]]:
    """`finite_or_mark` of arrays without nulls, decided for the whole array at once."""
    out: list[float | None] = ys.tolist()
    marks: list[list[Any]] = []
    for i in np.flatnonzero(~np.isfinite(ys)).tolist():
        y, out[i] = out[i], None
        assert y is not None
        marks.append([float(xs[i]), "NaN" if math.isnan(y) else ("inf" if y > 0 else "-inf")])
    return out, marks


def finite_or_mark(xs: list[float], ys: list[float]) -> tuple[list[float | None],
                                                              list[list[Any]]]:
    """JSON has no NaN or infinity: such a value becomes a gap (null) in the curve and a
    mark [x, "NaN" | "inf" | "-inf"] that the page draws and shows under the cursor."""
    out: list[float | None] = []
    marks: list[list[Any]] = []
    for x, y in zip(xs, ys, strict=True):
        if y is None or math.isfinite(y):
            out.append(y)
            continue
        out.append(None)
        marks.append([x, "NaN" if math.isnan(y) else ("inf" if y > 0 else "-inf")])
    return out, marks
