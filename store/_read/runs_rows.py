"""The runs view: its SQL over the attempts (`attempt_rows.attempts_view`), and its rows
computed a group of runs at a time, for a question on the runs view alone that reads the
run catalog's files one at a time (`run_index`): it then holds a row a run, not every
attempt and DuckDB's grouping of them all (1.5 KB a run at 38,778 tiny runs)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

from tracklake._format.columns import gathered
from tracklake._format.schema import empty_table
from tracklake._read.attempt_rows import ATTEMPTS_SCHEMA, FIRST_OF_RANK, LATEST, attempts_view
from tracklake._read.readonly import question_connection

if TYPE_CHECKING:
    import duckdb

#: A row a run of the attempts registered as ``_attempts`` (each run's every attempt).
RUNS_SELECT = f"""
WITH a AS (
  SELECT *, CAST(started_at AS TIMESTAMPTZ) AS started,
         CAST(coalesce(finished_at, heartbeat_at) AS TIMESTAMPTZ) AS ended,
         {LATEST} AS latest
  FROM _attempts)
SELECT project, run, any_value(name) FILTER (WHERE latest) AS name,
       CASE WHEN bool_or(status = 'running' AND latest) THEN 'running'
            WHEN bool_or(status = 'crashed' AND latest) THEN 'crashed'
            WHEN bool_or(status = 'failed' AND latest) THEN 'failed'
            WHEN bool_or(status = 'killed' AND latest) THEN 'killed'
            ELSE 'finished' END AS status,
       max(attempt) AS attempts, count(*) FILTER (WHERE {FIRST_OF_RANK}) AS ranks,
       max(world_size) FILTER (WHERE latest) AS world_size, min(started) AS started_at,
       max(ended) AS ended_at, max(ended) - min(started) AS duration,
       any_value(tags) FILTER (WHERE latest) AS tags,
       any_value(host) FILTER (WHERE latest) AS host,
       any_value(git_commit) FILTER (WHERE latest) AS git_commit
FROM a
GROUP BY project, run
"""


#: Attempts held before they are grouped: grouping costs 6.5 ms however few they are, and
#: 1 µs an attempt (at 2¹⁶, a count at 42,000 tiny runs held 27 MB more than at 2¹⁴).
GROUP_AT = 1 << 14


def runs_rows(groups: Iterable[pa.Table], now: float) -> pa.Table:
    """The runs view's rows of `groups` (`ATTEMPTS_SCHEMA` rows, statuses as recorded,
    every attempt of a run in one group), with statuses as at `now`: groups are grouped
    once `GROUP_AT` attempts wait, so at most that many more are held than runs."""
    con = question_connection()  # a cursor on the process's database, not one more
    try:
        rows = [_grouped(con, pa.concat_tables(waiting), now)
                for waiting in gathered(groups, GROUP_AT)]
        return pa.concat_tables(rows) if rows else \
            _grouped(con, empty_table(ATTEMPTS_SCHEMA), now)
    finally:
        con.close()


def _grouped(con: duckdb.DuckDBPyConnection, attempts: pa.Table, now: float) -> pa.Table:
    con.register("_attempts", attempts_view(attempts, now))
    try:
        return con.sql(RUNS_SELECT).to_arrow_table()
    finally:
        con.unregister("_attempts")
