"""SQL over the store: views over compacted and live data, and strict read-only access."""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

import tracklake


def _write_run(root: Path, run_id: str, steps: int, *, rank: int = 0, start: int = 0,
               offset: float = 0.0) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, rank=rank,
                        capture_identity=False) as run:
        for step in range(start, start + steps):
            run.log({"loss": step + offset, "acc": step / 10}, step=step)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


def test_views_cover_live_segments_and_compacted_parts_without_double_counting(root: Path
                                                                               ) -> None:
    _write_run(root, "a", 100)
    live = tracklake.query("SELECT count(*) AS n, sum(value) AS s FROM metrics", root=root)
    tracklake.compact(root=root)
    _write_run(root, "b", 50)  # live, not compacted
    both = tracklake.query("SELECT run, count(*) AS n FROM metrics GROUP BY run ORDER BY run",
                           root=root).to_pylist()
    assert live.to_pylist()[0]["n"] == 200
    assert both == [{"run": "a", "n": 200}, {"run": "b", "n": 100}]


def test_nan_and_infinities_are_stored_as_they_are(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        run.log({"nan": math.nan, "pinf": math.inf, "ninf": -math.inf}, step=0)
    for when in ("live", "compacted"):
        if when == "compacted":
            tracklake.compact(root=root)
        rows = {r["key"]: r["value"] for r in tracklake.query(
            "SELECT key, value FROM metrics", root=root).to_pylist()}
        assert math.isnan(rows["nan"]), when
        assert rows["pinf"] == math.inf and rows["ninf"] == -math.inf, when


@pytest.mark.parametrize("statement", [
    "COPY metrics TO '{root}/metrics/stolen.parquet'",
    "COPY (SELECT 1) TO '{root}/x.csv'",
    "ATTACH '{root}/new.duckdb' AS db",
    "DELETE FROM metrics",
    "DROP VIEW metrics",
    "CREATE TABLE t AS SELECT 1",
    "INSERT INTO metrics_all VALUES (1)",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "PRAGMA enable_profiling",
    "EXPORT DATABASE '{root}/export'",
    "SELECT 1; COPY metrics TO '{root}/metrics/x.parquet'",
    "CALL checkpoint()",
    "SELECT * FROM read_csv('/etc/hostname')",
])
def test_no_statement_can_modify_create_or_read_outside_the_store(root: Path,
                                                                   statement: str) -> None:
    _write_run(root, "a", 10)
    tracklake.compact(root=root)
    _write_run(root, "b", 10)
    before = _snapshot(root)
    with pytest.raises(tracklake.QueryError):
        tracklake.query(statement.format(root=root), root=root)
    assert _snapshot(root) == before


def test_parquet_overwrite_through_copy_without_temp_file_is_refused(root: Path) -> None:
    """DuckDB's COPY ... (USE_TMP_FILE false) truncates its target first: it must never run."""
    _write_run(root, "a", 10)
    tracklake.compact(root=root)
    part = next(root.glob("metrics/**/*.parquet"))
    before = part.read_bytes()
    with pytest.raises(tracklake.QueryError):
        tracklake.query(f"COPY (SELECT 1 AS x) TO '{part}' (USE_TMP_FILE false)", root=root)
    assert part.read_bytes() == before
    assert pq.read_table(part).num_rows == 20


def test_a_query_over_an_empty_store_sees_empty_views(root: Path) -> None:
    for view in ("runs", "metrics", "configs", "texts", "generations", "traces", "artifacts",
                 "events", "metric_summaries", "run_attempts"):
        assert tracklake.query(f"SELECT count(*) AS n FROM {view}", root=root
                               ).to_pylist() == [{"n": 0}]


def test_a_later_attempt_supersedes_steps_it_logs_again(root: Path) -> None:
    """Attempt 1 logs steps 0..99; a resumed attempt 2 restarts at step 60."""
    _write_run(root, "r", 100, offset=0.0)
    _write_run(root, "r", 60, start=60, offset=1000.0)
    default = tracklake.query(
        "SELECT step, value, attempt FROM metrics WHERE key = 'loss' ORDER BY step",
        root=root).to_pylist()
    assert [r["step"] for r in default] == list(range(120))
    assert all(r["attempt"] == (1 if r["step"] < 60 else 2) for r in default)
    assert default[70]["value"] == 1070.0
    everything = tracklake.query("SELECT count(*) AS n FROM metrics_all WHERE key = 'loss'",
                                 root=root).to_pylist()
    assert everything == [{"n": 160}]
    summary = tracklake.query("SELECT count, last_step, last_value, max FROM metric_summaries "
                              "WHERE key = 'loss'", root=root).to_pylist()
    assert summary == [{"count": 120, "last_step": 119, "last_value": 1119.0, "max": 1119.0}]


def test_rows_without_a_step_are_never_superseded(root: Path) -> None:
    """Only rows at or after the step a later attempt logged again are hidden: a text
    logged before any step (NULL step) of the earlier attempt stays in `texts`."""
    for attempt, start in ((1, 0), (2, 5)):
        with tracklake.init(project="p", run_id="r", root=root,
                            capture_identity=False) as run:
            run.log_text("note", f"attempt {attempt} starts")
            for step in range(start, 10):
                run.log({"loss": float(step)}, step=step)
                run.log_text("note", f"attempt {attempt} step {step}", step=step)
    texts = tracklake.query("SELECT attempt, step, text FROM texts ORDER BY attempt, step",
                            root=root).to_pylist()
    assert [t["text"] for t in texts if t["step"] is None] == [
        "attempt 1 starts", "attempt 2 starts"]
    assert [(t["attempt"], t["step"]) for t in texts if t["step"] is not None] == [
        *((1, s) for s in range(5)), *((2, s) for s in range(5, 10))]


def test_metric_summaries_match_a_full_scan(root: Path) -> None:
    _write_run(root, "a", 300, rank=0)
    _write_run(root, "a", 200, rank=1, offset=-5)
    tracklake.compact(root=root)
    _write_run(root, "b", 50)  # live
    fast = tracklake.query("SELECT project, run, rank, key, count, min, max, last_step, "
                           "last_value FROM metric_summaries ORDER BY ALL", root=root)
    slow = tracklake.query("SELECT project, run, rank, key, count(*) AS count, "
                           "min(value) AS min, max(value) AS max, max(step) AS last_step, "
                           "arg_max(value, step) AS last_value FROM metrics GROUP BY ALL "
                           "ORDER BY ALL", root=root)
    assert fast.to_pylist() == slow.to_pylist()


def test_compacted_parts_are_plain_hive_partitioned_parquet(root: Path) -> None:
    _write_run(root, "a", 100)
    tracklake.compact(root=root)
    rows = duckdb.sql(
        f"SELECT run, rank, attempt, count(*) AS n FROM read_parquet('{root}/metrics/**/*.parquet',"
        " hive_partitioning = true) GROUP BY ALL").fetchall()
    assert rows == [("a", 0, 1, 200)]


def test_runs_view_reports_status_attempts_and_ranks(root: Path) -> None:
    _write_run(root, "r", 5, rank=0)
    _write_run(root, "r", 5, rank=1)
    _write_run(root, "r", 5, rank=0)
    with pytest.raises(RuntimeError), tracklake.init(project="p", run_id="bad", root=root,
                                                     capture_identity=False):
        raise RuntimeError("boom")
    rows = {r["run"]: r for r in tracklake.query("SELECT * FROM runs", root=root).to_pylist()}
    assert rows["r"]["attempts"] == 2 and rows["r"]["status"] == "finished"
    assert rows["bad"]["status"] == "failed"
    assert rows["r"]["ranks"] == 2  # rank 1 still counts: its latest attempt is its 1st


def test_bad_sql_gives_a_query_error_naming_the_problem(root: Path) -> None:
    with pytest.raises(tracklake.QueryError, match=r"does not parse|query failed"):
        tracklake.query("SELEKT 1", root=root)
    with pytest.raises(tracklake.QueryError, match="nosuchview"):
        tracklake.query("SELECT * FROM nosuchview", root=root)


@pytest.mark.parametrize("root", ["does-not-exist", "s3://bucket/store"])
def test_a_root_that_is_not_a_store_is_an_error_not_an_empty_answer(
        tmp_path: Path, root: str) -> None:
    where = root if "://" in root else str(tmp_path / root)
    with pytest.raises(tracklake.StoreError, match=re.escape(where)) as err:
        tracklake.query("SELECT count(*) FROM metrics", root=where)
    assert ("object store" in str(err.value)) == ("://" in root)
    with pytest.raises(tracklake.StoreError):
        tracklake.connect(where)


def test_a_one_rank_restart_keeps_the_runs_ranks_and_whole_duration(root: Path) -> None:
    """A 2-rank job whose rank 1 alone is restarted: `runs` says 2 ranks, 2 attempts and
    the span from the first start to the last end (before: the latest attempt's 1 rank
    and its own duration)."""
    for rank in (0, 1):
        with tracklake.init(project="p", run_id="job", root=root, rank=rank) as run:
            run.log({"loss": 1.0}, step=0)
    time.sleep(1.1)
    with tracklake.init(project="p", run_id="job", root=root, rank=1) as run:
        run.log({"loss": 0.5}, step=1)
    [row] = tracklake.query(
        "SELECT ranks, attempts, status, epoch(duration) AS seconds, started_at = "
        "(SELECT min(CAST(started_at AS TIMESTAMPTZ)) FROM run_attempts) AS from_first "
        "FROM runs", root=root).to_pylist()
    assert (row["ranks"], row["attempts"], row["status"]) == (2, 2, "finished")
    assert row["seconds"] >= 1.0 and row["from_first"] is True
