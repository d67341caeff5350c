"""A key's curve in one line of the terminal: its values bucketed by step, drawn with
block characters (or ASCII where the terminal cannot show them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tracklake._read.query import query

if TYPE_CHECKING:
    import duckdb

#: Points per sparkline: each is the mean of the finite values of one step bucket.
WIDTH = 16
UNICODE_LEVELS = "▁▂▃▄▅▆▇█"
ASCII_LEVELS = "_.-=+*#"

#: Steps are HUGEINT here: the span of int64 steps (-2**63 to 2**63-1) overflows int64.
_TRENDS = f"""
WITH v AS (
  SELECT key, CAST(step AS HUGEINT) AS step, value,
         min(CAST(step AS HUGEINT)) OVER k AS lo, max(CAST(step AS HUGEINT)) OVER k AS hi
  FROM metrics WHERE project = $p AND run = $r AND rank = $rank AND step IS NOT NULL
    AND list_contains($keys, key)
  WINDOW k AS (PARTITION BY key))
SELECT key, CAST(floor((step - lo) * {WIDTH} / (hi - lo + 1)) AS INTEGER) AS bucket,
       avg(value) FILTER (WHERE isfinite(value)) AS mean
FROM v GROUP BY ALL ORDER BY key, bucket
"""


def trends(con: duckdb.DuckDBPyConnection, project: str, run: str, rank: int,
           unicode: bool, keys: list[str]) -> dict[str, str]:
    """Per metric key of `keys` of one rank of a run, its sparkline."""
    rows = query(_TRENDS, params={"p": project, "r": run, "rank": rank, "keys": keys},
                 connection=con).to_pylist()
    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        series.setdefault(row["key"], []).append((row["bucket"], row["mean"]))
    return {key: sparkline(points, unicode) for key, points in series.items()}


def sparkline(points: list[tuple[int, Any]], unicode: bool = True) -> str:
    """(bucket, mean) points as one character each, scaled between their min and max;
    a bucket with no finite value is a space."""
    levels = UNICODE_LEVELS if unicode else ASCII_LEVELS
    values = [v for _, v in points if v is not None and math.isfinite(v)]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    by_bucket = dict(points)
    out = []
    for bucket in range(max(by_bucket) + 1):
        v = by_bucket.get(bucket)
        if v is None or not math.isfinite(v):
            out.append(" ")
        elif hi == lo:
            out.append(levels[len(levels) // 2])
        else:
            # hi - lo of values near ±1.8e308 overflows to inf: then halve first
            share = ((v - lo) / (hi - lo) if math.isfinite(hi - lo)
                     else (v / 2 - lo / 2) / (hi / 2 - lo / 2))
            out.append(levels[round(share * (len(levels) - 1))])
    return "".join(out)
