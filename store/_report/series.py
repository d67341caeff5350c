"""The curves to draw: one SQL query per run that smooths, selects ranks and downsamples
inside DuckDB, so that a chart of a million steps or a report of 1,000 keys costs one
pass over the data and a bounded number of points."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tracklake._errors import QueryError
from tracklake._read.query import query

if TYPE_CHECKING:
    import duckdb

    from tracklake._read.reader import RunRecord

#: How several ranks of a run are drawn: each rank its own curve, their mean per step, one
#: rank (an int), or None for the run's lowest rank.
RankMode = Literal["all", "mean"] | int | None
XAxis = Literal["step", "time"]
#: Which runs must have a key that a pattern names (else an error).
Require = Literal["every run", "some run", "nothing"]


@dataclass(frozen=True)
class Curve:
    """One line of a chart: a key of a run (one rank, or the mean of its ranks)."""

    run: str
    key: str
    ranks: str  # "rank 0", "mean of 4 ranks"
    xs: list[float]
    ys: list[float]
    points: int  # points before downsampling; len(xs) is what is drawn

    @property
    def downsampled(self) -> bool:
        return self.points > len(self.xs)


@dataclass(frozen=True)
class CurveQuery:
    """What to draw of each run; `buckets` bounds the points per curve."""

    keys: tuple[str, ...] = ("*",)  # names or globs
    ranks: RankMode = None
    smooth: int = 1  # trailing mean over this many points
    since: int | None = None
    x: XAxis = "step"
    buckets: int = 1000

    def __post_init__(self) -> None:
        if self.smooth < 1:
            raise QueryError(f"--smooth must be 1 or more points, not {self.smooth}")
        if self.buckets < 2:
            raise QueryError(f"at least 2 points per curve, not {self.buckets}")


def _sql(spec: CurveQuery, key_filter: str) -> str:
    """The curves of one run ($p, $r), filtered to keys whose names are in $keys."""
    if spec.ranks == "all":
        per_step = "SELECT key, rank AS series, step, t, value FROM raw"
    elif spec.ranks == "mean":
        per_step = ("SELECT key, -1 AS series, step, min(t) AS t, avg(value) AS value, "
                    "count(DISTINCT rank) AS ranks FROM raw GROUP BY key, step")
    else:
        per_step = "SELECT key, rank AS series, step, t, value FROM raw WHERE rank = $rank"
    ranks_col = "ranks" if spec.ranks == "mean" else "1 AS ranks"
    return f"""
WITH raw AS (
  SELECT key, rank, step, epoch(time) - (SELECT epoch(min(started_at)) FROM runs
                                        WHERE project = $p AND run = $r) AS t, value
  FROM metrics
  WHERE project = $p AND run = $r AND step IS NOT NULL AND isfinite(value)
    AND step >= $since {key_filter}),
per_step AS ({per_step}),
smoothed AS (
  SELECT key, series, step, t, {ranks_col},
         avg(value) OVER (PARTITION BY key, series ORDER BY step
                          ROWS BETWEEN {spec.smooth - 1} PRECEDING AND CURRENT ROW) AS value
  FROM per_step),
numbered AS (
  SELECT *, min(step) OVER w AS lo, max(step) OVER w AS hi, count(*) OVER w AS n,
         row_number() OVER (w ORDER BY step) - 1 AS i
  FROM smoothed WINDOW w AS (PARTITION BY key, series))
SELECT key, series, max(ranks) AS ranks, any_value(n) AS n,
       list(x ORDER BY bucket) AS xs, list(y ORDER BY bucket) AS ys
FROM (
  SELECT key, series, bucket, max(ranks) AS ranks, any_value(n) AS n,
         avg({"t" if spec.x == "time" else "step"}) AS x, avg(value) AS y
  FROM (SELECT *, CASE WHEN n <= $buckets THEN i
                       ELSE CAST(floor((step - lo) * $buckets::BIGINT / (hi - lo + 1)) AS BIGINT)
                  END AS bucket FROM numbered)
  GROUP BY key, series, bucket)
GROUP BY key, series ORDER BY key, series
"""


def label(curve: Curve, several_runs: bool, several_ranks: bool) -> str:
    """A curve's name in a legend: the run, the ranks, or both, as needed to tell it
    apart from the other curves of its chart."""
    parts = [curve.run] if several_runs else []
    if several_ranks or not several_runs:
        parts.append(curve.ranks)
    return " ".join(parts)


def labelled(curves: list[Curve]) -> list[tuple[str, Curve]]:
    """The curves of one chart with their legend labels."""
    runs = {c.run for c in curves}
    several_ranks = len({(c.run, c.ranks) for c in curves}) > len(runs)
    return [(label(c, len(runs) > 1, several_ranks), c) for c in curves]


def run_keys(con: duckdb.DuckDBPyConnection, project: str, run: str) -> list[str]:
    """The metric keys a run has logged, sorted."""
    rows = query("SELECT DISTINCT key FROM metric_summaries WHERE project = $p AND run = $r "
                 "ORDER BY key", params={"p": project, "r": run}, connection=con)
    return [str(k) for k in rows.column("key").to_pylist()]


def chosen_keys(available: list[str], patterns: tuple[str, ...]) -> list[str]:
    """The keys that `patterns` name (as written, else as globs), in their order."""
    chosen: list[str] = []
    for pattern in patterns:
        # a key named like a glob (`acc[0]`) is that key, not the keys the glob matches
        matches = ([pattern] if pattern in available else
                   [k for k in available if fnmatch.fnmatchcase(k, pattern)])
        chosen += [k for k in matches if k not in chosen]
    return chosen


def curves_sql(spec: CurveQuery) -> str:
    """The SQL that `curves` runs, as shown in a report."""
    return _sql(spec, "AND list_contains($keys, key)")


def curves(con: duckdb.DuckDBPyConnection, project: str, run: str, keys: list[str],
           spec: CurveQuery) -> list[Curve]:
    """The curves of `keys` of one run, at most `spec.buckets` points each (bucket means
    of consecutive steps when there are more)."""
    if not keys:
        return []
    params: dict[str, object] = {"p": project, "r": run, "keys": keys,
                                 "since": spec.since if spec.since is not None else -2**63,
                                 "buckets": spec.buckets}
    if isinstance(spec.ranks, int):
        params["rank"] = spec.ranks
    rows = query(curves_sql(spec), params=params, connection=con).to_pylist()
    out = []
    for row in rows:
        ranks = (f"mean of {row['ranks']} ranks" if spec.ranks == "mean"
                 else f"rank {row['series']}")
        out.append(Curve(run=run, key=row["key"], ranks=ranks, xs=row["xs"], ys=row["ys"],
                         points=row["n"]))
    return out


def available_keys(con: duckdb.DuckDBPyConnection, records: list[RunRecord],
                   patterns: tuple[str, ...], require: Require = "some run"
                   ) -> dict[tuple[str, str], list[str]]:
    """Per run (project, run), the metric keys it has.

    A key pattern that `require`s a match and lacks one is an error naming the run, the
    pattern and the closest keys there are."""
    available = {(r.project, r.run): run_keys(con, r.project, r.run) for r in records}
    for pattern in patterns:
        lacking = [r for r in records
                   if not chosen_keys(available[(r.project, r.run)], (pattern,))]
        if lacking and (require == "every run" or
                        (require == "some run" and len(lacking) == len(records))):
            _no_such_key(lacking[0], available[(lacking[0].project, lacking[0].run)], pattern)
    return available


def collect(con: duckdb.DuckDBPyConnection, records: list[RunRecord], spec: CurveQuery,
            require: Require = "some run"
            ) -> dict[str, list[Curve]]:
    """Per chosen key (in the order of `spec.keys`), the curves of every run that has it
    (`available_keys` says which missing key is an error)."""
    available = available_keys(con, records, spec.keys, require)
    everywhere = sorted({k for keys in available.values() for k in keys})
    by_key: dict[str, list[Curve]] = {k: [] for k in chosen_keys(everywhere, spec.keys)}
    for record in records:
        keys = chosen_keys(available[(record.project, record.run)], spec.keys)
        run_spec = spec if spec.ranks is not None else dataclasses.replace(
            spec, ranks=min(record.ranks))
        for curve in curves(con, record.project, record.run, keys, run_spec):
            by_key[curve.key].append(curve)
    return by_key


def _no_such_key(record: RunRecord, keys: list[str], pattern: str) -> None:
    close = difflib.get_close_matches(pattern, keys, n=3)
    hint = (f"; did you mean {', '.join(close)}?" if close else
            f"; it has {len(keys)} metric keys (`tracklake show {record.run}` lists them)")
    raise QueryError(f"run {record.project}/{record.run} has no metric key matching "
                     f"{pattern!r}{hint}")
