"""What `tracklake show` prints of a run's histograms (the last one of each key drawn as a
line of bars) and media (per key: items, steps, bytes, distinct files, last caption)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracklake._cli.cells import cell
from tracklake._cli.fit import Column, Whole, fitted_table
from tracklake._cli.sparkline import ASCII_LEVELS, UNICODE_LEVELS
from tracklake._read.query import query

if TYPE_CHECKING:
    import duckdb

    from tracklake._cli.drawn_table import PlainTable

#: Bars at most in the drawing of a histogram (bins are summed in groups beyond it).
BARS = 32

HISTOGRAMS_SQL = """SELECT key, count(*) AS n, min(step) AS first, max(step) AS last,
       arg_max(count, (step, seq)) AS "values", arg_max(min, (step, seq)) AS lo,
       arg_max(max, (step, seq)) AS hi, arg_max(counts, (step, seq)) AS counts
FROM histograms WHERE project = $p AND run = $r AND rank = $rank GROUP BY key ORDER BY key"""
MEDIA_SQL = """SELECT key, type, count(*) AS n, min(step) AS first, max(step) AS last,
       sum(size) AS bytes, count(DISTINCT digest) AS files,
       arg_max(caption, (step, seq)) AS caption
FROM media WHERE project = $p AND run = $r GROUP BY key, type ORDER BY key, type"""


def media_rows(con: duckdb.DuckDBPyConnection, project: str, run: str, rank: int
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(histograms of `rank` per key, media of every rank per key and type)."""
    params = {"p": project, "r": run}
    histograms = query(HISTOGRAMS_SQL, params={**params, "rank": rank},
                       connection=con).to_pylist()
    media = query(MEDIA_SQL, params=params, connection=con).to_pylist()
    return histograms, media


def bars(counts: list[int], unicode: bool = True) -> str:
    """`counts` as a line of bars, at most `BARS` (neighbouring bins summed)."""
    if not counts:
        return ""
    group = -(-len(counts) // BARS)
    summed = [sum(counts[i:i + group]) for i in range(0, len(counts), group)]
    levels = UNICODE_LEVELS if unicode else ASCII_LEVELS
    top = max(summed) or 1
    return "".join(levels[min(len(levels) - 1, c * len(levels) // (top + 1))] if c else " "
                   for c in summed)


def histograms_table(rows: list[dict[str, Any]], rank: int, width: int | None,
                     unicode: bool) -> tuple[PlainTable, list[str]]:
    """Per key: histograms, steps, and the last one: values, min, max, bins drawn."""
    cells = [[r["key"], cell(r["n"]), f"{r['first']}..{r['last']}", cell(r["values"]),
              cell(r["lo"]), cell(r["hi"]), bars(r["counts"] or [], unicode)] for r in rows]
    headers = ("key", "histograms", "steps", "values", "min", "max", "last")
    columns = [Column(h, [c[i] for c in cells], "shorten" if i == 0 else "never")
               for i, h in enumerate(headers)]
    key, n, steps, values, low, high, last = range(len(headers))
    return fitted_table(columns, [key, last, steps, Whole(key), low, high, values, n], width,
                        title=f"histograms (rank {rank}; the last of each key)")


def media_table(rows: list[dict[str, Any]], width: int | None) -> tuple[PlainTable, list[str]]:
    """Per key and type: items, steps, bytes, distinct files, the last caption."""
    cells = [[r["key"], r["type"], cell(r["n"]), f"{r['first']}..{r['last']}",
              cell(r["bytes"]), cell(r["files"]), r["caption"] or ""] for r in rows]
    headers = ("key", "type", "items", "steps", "bytes", "files", "last caption")
    columns = [Column(h, [c[i] for c in cells],
                      "shorten" if i == 0 else "wrap" if i == 6 else "never")
               for i, h in enumerate(headers)]
    key, type_, n, steps, size, files, caption = range(len(headers))
    return fitted_table(columns, [key, type_, n, steps, Whole(key), size, files, caption],
                        width, title="media (all ranks)")
