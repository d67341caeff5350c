"""Parts a merge replaces stay readable for a grace period: a plain engine that listed the
parts just before a merge reads every record once, with no file gone under it; one that
lists during the grace period leaves the replaced parts out by the documented rule; the
parts go once the grace period is over, by the next compaction or, for a finished rank,
by the compaction its compactor leaves for that moment."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from _format_doc import block_with, exec_python, set_listings

import tracklake
from tracklake._format import StreamId
from tracklake._read.reader import list_stream

STREAM = StreamId("p", "r", 0, 1, "metrics")


def _doc(name: str, root: Path) -> Any:
    """`name` as docs/format.md defines it (the listing rule and the pyarrow format)."""
    scope: dict[str, Any] = {}
    exec_python("ds.partitioning(", root, scope)
    return scope[name]


def _pyarrow_listing(root: Path) -> Callable[[], pa.Table]:
    import pyarrow.dataset as ds

    files = _doc("part_files", root)(root, "metrics")
    dataset = ds.dataset(files, format=_doc("verified", root),
                         partitioning=_doc("partitioning", root),
                         partition_base_dir=str(root / "metrics"))
    return dataset.to_table


def _polars_listing(root: Path) -> Callable[[], pa.Table]:
    import polars as pl

    schema = {"project": pl.String, "run": pl.String, "rank": pl.Int32, "attempt": pl.Int32}
    frame = pl.scan_parquet(_doc("part_files", root)(root, "metrics"),
                            hive_partitioning=True, hive_schema=schema)
    return lambda: frame.collect().to_arrow()


def _duckdb_listing(root: Path) -> Callable[[], pa.Table]:
    con = duckdb.connect()
    set_listings(con, root, ("metrics",))
    query = block_with("sql", "getvariable('metrics_files')").replace("ROOT", str(root))
    every_row = query.replace("SELECT run, key, max(value) AS best", "SELECT *").replace(
        "GROUP BY ALL", "")
    return lambda: con.sql(every_row).to_arrow_table()


ENGINES = {"pyarrow": _pyarrow_listing, "polars": _polars_listing, "duckdb": _duckdb_listing}


def _live_run(root: Path) -> tracklake.Run:
    return tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                          segment_bytes=1, compact=False)  # every flush seals a segment


def _log_and_compact(run: tracklake.Run, root: Path, steps: range) -> None:
    for step in steps:
        run.log({"loss": float(step), "acc": step / 2}, step=step)
        run.flush()
        tracklake.compact(root=root, project="p", run="r")


def _finished_after_merges(root: Path, monkeypatch: pytest.MonkeyPatch, grace: str
                           ) -> tracklake.CompactionReport:
    """A run compacted after each of 4 steps, finished and compacted once more, with the
    grace period `grace`: the last compaction's report."""
    monkeypatch.setenv("TRACKLAKE_PART_GRACE", grace)
    run = _live_run(root)
    _log_and_compact(run, root, range(4))
    run.finish()
    return tracklake.compact(root=root)


def _seqs(table: pa.Table) -> list[tuple[int, str]]:
    return sorted(zip(table.column("seq").to_pylist(), table.column("key").to_pylist(),
                      strict=True))


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_plain_engine_that_listed_before_a_merge_reads_every_record_once(
        root: Path, engine: str) -> None:
    run = _live_run(root)
    _log_and_compact(run, root, range(3))  # a small part (the newest segment stays live)
    read = ENGINES[engine](root)  # the engine lists the parts now, and reads later
    listed = list_stream(root, STREAM).parts
    _log_and_compact(run, root, range(3, 6))  # merges: the listed parts are replaced
    rows = _seqs(read())  # FileNotFoundError when a replaced part was deleted at once
    assert all(p.path.exists() for p in listed) and list_stream(root, STREAM).merged
    assert len(rows) == len(set(rows)) == 2 * 2  # seq 0 and 1 (2 is the live segment's)
    fresh = _seqs(ENGINES[engine](root)())  # a new listing: the replaced parts left out
    assert len(fresh) == len(set(fresh)) == 2 * 5
    assert fresh == sorted((seq, key) for seq in range(5) for key in ("acc", "loss"))
    run.finish()


def test_replaced_parts_go_after_the_grace_period_and_no_sooner(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _finished_after_merges(root, monkeypatch, "300")
    files = list_stream(root, STREAM)
    (holder,) = files.parts
    assert len(files.merged) >= 2 and report.parts_removed == []
    kept = dict(report.parts_kept)
    assert set(kept) == {p.path for p in files.merged}
    assert all(abs(until - (holder.path.stat().st_mtime + 300)) < 1 for until in kept.values())
    assert tracklake.compact(root=root).parts_removed == []  # within the grace: kept
    past = time.time() - 301
    os.utime(holder.path, (past, past))  # the holder was written over 300 s ago
    report = tracklake.compact(root=root)
    assert sorted(report.parts_removed) == sorted(p.path for p in files.merged)
    assert list_stream(root, STREAM).merged == [] and holder.path.exists()
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root
                           ).to_pylist() == [{"n": 8}]


def test_no_grace_period_deletes_replaced_parts_at_once(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _finished_after_merges(root, monkeypatch, "0")
    files = list_stream(root, STREAM)
    assert len(files.parts) == 1 and files.merged == []


@pytest.mark.parametrize("value", ["soon", "-1", "1e9", "nan"])
def test_a_grace_period_that_is_not_a_number_of_seconds_is_refused_naming_the_variable(
        root: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    run = _live_run(root)
    _log_and_compact(run, root, range(2))
    monkeypatch.setenv("TRACKLAKE_PART_GRACE", value)
    with pytest.raises(tracklake.StoreError, match="TRACKLAKE_PART_GRACE"):
        tracklake.compact(root=root)
    run.finish()


def test_a_finished_rank_deletes_its_replaced_parts_when_the_grace_period_ends(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Automatic compaction: merges while the run lives, then at `finish()`; the parts
    replaced last are deleted a grace period later with nobody running anything."""
    monkeypatch.setenv("TRACKLAKE_PART_GRACE", "4")
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                         segment_bytes=1, compact=True)
    for step in range(6):
        run.log({"loss": float(step)}, step=step)
        run.flush()
        time.sleep(0.3)
    run.finish()
    deadline = time.monotonic() + 120
    seen_replaced = False
    while time.monotonic() < deadline:
        files = list_stream(root, STREAM)
        seen_replaced |= bool(files.merged)
        if seen_replaced and not files.merged and not files.segments:
            break
        time.sleep(0.2)
    files = list_stream(root, STREAM)
    assert seen_replaced, "no merge happened: the test did not test the grace period"
    assert files.merged == [] and files.segments == [] and len(files.parts) == 1
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root
                           ).to_pylist() == [{"n": 6}]


def test_fsck_counts_replaced_parts_apart_and_calls_the_store_clean(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._ops.fsck.check import fsck

    _finished_after_merges(root, monkeypatch, "300")
    report = fsck(root)
    merged = list_stream(root, STREAM).merged
    assert report.clean and report.checked["replaced parts"] == len(merged) >= 2


@pytest.mark.slow
def test_plain_engines_reading_in_a_loop_while_a_live_run_compacts_itself_never_fail(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported case: DuckDB, Polars and pyarrow read as the page says, over and over,
    while a live run seals a segment at every flush and its compactors merge; each read
    succeeds, holds each record once, and holds no fewer records than the read before."""
    import threading

    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                         segment_bytes=1)
    stop = threading.Event()

    def write() -> None:
        step = 0
        while not stop.is_set():
            run.log({"loss": float(step), "acc": step / 2}, step=step)
            step += 1
            if step % 5 == 0:
                run.flush()
                time.sleep(0.02)

    writer = threading.Thread(target=write)
    writer.start()
    reads: dict[str, list[int]] = {name: [] for name in ENGINES}
    rng = random.Random(7)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for name, listing in ENGINES.items():
                if not list(root.glob("metrics/**/part-*.parquet")):
                    continue  # nothing compacted yet: DuckDB refuses an empty listing
                read = listing(root)
                time.sleep(rng.uniform(0, 1))  # a question that takes a while after its listing
                rows = _seqs(read())
                assert len(rows) == len(set(rows)), name
                assert not reads[name] or len(rows) >= reads[name][-1], name
                reads[name].append(len(rows))
    finally:
        stop.set()
        writer.join()
        run.finish()
    assert all(len(counts) >= 3 and counts[-1] > counts[0] for counts in reads.values()), reads


def test_a_part_removed_before_its_summary_is_read_is_gone_not_damaged(
        tmp_path: Path) -> None:
    """A part whose footer carries no summary is read in full for one. Removed by a merge
    or retention between the listing and that read, it was reported as a damaged part,
    its records left out with a warning (a retention test met it once, a question running
    beside a retention). It is gone: the question lists the store again."""
    from tracklake._format.part import open_part, part_summary_columns

    root = tmp_path / "store"
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step in range(5):
            run.log({f"k{i}": float(step) for i in range(200)}, step=step)
    tracklake.compact(root=root, run="r")
    [path] = (root / "metrics").rglob("part-*.parquet")
    parquet = open_part(path)
    if b"tracklake.summary" in (parquet.metadata.metadata or {}):
        pytest.skip("this part carries its summary: nothing is read again")
    os.unlink(path)
    with pytest.raises(FileNotFoundError):
        part_summary_columns(parquet, path)
