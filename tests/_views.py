"""Everything a user reads back from a store, as comparable rows: two stores that answer
these alike hold the same data (used to compare a store with its pack or backup)."""

from __future__ import annotations

from pathlib import Path

import tracklake

#: One query per view, as text where NaN must equal itself.
VIEWS = {
    "metrics_all": "SELECT project, run, rank, attempt, seq, step, key, "
                   "CAST(value AS VARCHAR) AS v FROM metrics_all ORDER BY ALL",
    "metrics": "SELECT project, run, rank, attempt, step, key, CAST(value AS VARCHAR) AS v "
               "FROM metrics ORDER BY ALL",
    "counts": "SELECT project, run, rank, attempt, count(*) AS n FROM metrics_all "
              "GROUP BY ALL ORDER BY ALL",
    "summaries": "SELECT project, run, rank, key, count, CAST(max AS VARCHAR) AS m "
                 "FROM metric_summaries ORDER BY ALL",
    "texts": "SELECT * FROM texts_all ORDER BY ALL",
    "configs": "SELECT * FROM configs_all ORDER BY ALL",
    "generations": "SELECT * FROM generations_all ORDER BY ALL",
    "traces": "SELECT project, run, seq, name, span_id, parent_id, token_ids FROM traces_all "
              "ORDER BY ALL",
    "artifacts": "SELECT * FROM artifacts_all ORDER BY ALL",
    "events": "SELECT * FROM events_all ORDER BY ALL",
    "runs": "SELECT project, run, status, attempts FROM runs ORDER BY ALL",
    "attempts": "SELECT project, run, rank, attempt, status, started_at, heartbeat_at "
                "FROM run_attempts ORDER BY ALL",
}


def views(root: Path) -> dict[str, list[dict[str, object]]]:
    """Every view's rows for the store at `root`."""
    return {name: tracklake.query(sql, root=root).to_pylist() for name, sql in VIEWS.items()}
