"""docs/format.md's examples and checkable claims, run against a real store: reading the
files without tracklake (DuckDB, pyarrow, a segment with a torn tail), the reference SQL
for supersession, the footer checksum, the keys of `write_report`."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _format_doc import block_with, exec_python, reference_views, set_listings

import tracklake
from tracklake._format.segment import read_segment


def _write(root: Path, run_id: str, steps: range, **init: Any) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                        **init) as run:
        for step in steps:
            run.log({"loss": step / 2, "acc": float(step)}, step=step)
            if step % 10 == 9:
                run.flush()


@pytest.fixture
def store(root: Path) -> Path:
    """Run a (two attempts, the second resuming at step 30) compacted; run b live."""
    _write(root, "a", range(50))
    _write(root, "a", range(30, 60))
    tracklake.compact(root=root)
    _write(root, "b", range(20))
    assert list(root.glob("metrics/**/*.arrows")) and list(root.glob("metrics/**/*.parquet"))
    return root


def test_the_duckdb_example_reads_the_parts_beside_a_live_segment(store: Path) -> None:
    con = duckdb.connect()
    set_listings(con, store, ("metrics",))
    rows = con.sql(block_with("sql", "AS best").replace("ROOT", str(store))).fetchall()
    assert sorted((run, key) for run, key, _ in rows) == [("a", "acc"), ("a", "loss")]


def test_the_pyarrow_example_reads_the_parts_beside_a_live_segment(store: Path) -> None:
    scope: dict[str, Any] = {}
    exec_python("ds.partitioning(", store, scope)  # the documented example, as written
    table = scope["metrics"]
    assert table.num_rows == 2 * (50 + 30)
    assert set(table.column("run").to_pylist()) == {"a"}
    assert {"project", "rank", "attempt"} <= set(table.column_names)
    plain = ds.dataset(str(store / "metrics"), format="parquet", partitioning="hive").to_table()
    assert plain.num_rows == table.num_rows  # the live `_seg-…` is skipped by discovery


def test_a_format_1_0_store_with_live_segments_is_read_with_the_glob(tmp_path: Path) -> None:
    """1.0 named live segments `seg-…`: the doc says to use the glob there."""
    golden = Path(__file__).parent / "golden" / "1.0"
    assert list(golden.glob("metrics/**/seg-*.arrows"))
    with pytest.raises(pa.ArrowInvalid):
        ds.dataset(str(golden / "metrics"), format="parquet", partitioning="hive").to_table()
    con = duckdb.connect()
    set_listings(con, golden, ("metrics",))
    sql = block_with("sql", "AS best").replace("ROOT", str(golden))
    assert {run for run, _, _ in con.sql(sql).fetchall()} == {"done"}


def test_the_segment_example_reads_every_batch_before_a_torn_tail(store: Path,
                                                                  tmp_path: Path) -> None:
    segment = next(store.glob("metrics/project=p/run=b/**/*.arrows"))
    whole = read_segment(segment)
    assert whole.sealed and len(whole.batches) >= 2
    torn = tmp_path / "torn.arrows"  # the end marker and the end of the last batch cut off
    torn.write_bytes(segment.read_bytes()[:-30])
    with pytest.raises((OSError, pa.ArrowInvalid)):  # as the doc says
        pa.ipc.open_stream(torn.read_bytes()).read_all()
    code = block_with("python", "open_stream").replace("SEGMENT", str(torn))
    scope: dict[str, Any] = {}
    exec(code, scope)  # the documented example, as written
    expected = pa.Table.from_batches(whole.batches[:-1])
    assert scope["table"].equals(expected.replace_schema_metadata(
        scope["table"].schema.metadata))


def test_the_reference_supersession_sql_gives_the_metrics_view(store: Path) -> None:
    tracklake.compact(root=store)  # the reference reads the parts only
    con = duckdb.connect()
    set_listings(con, store, ("metrics",))
    con.execute(block_with("sql", "CREATE VIEW KIND_parts").replace("KIND", "metrics")
                .replace("ROOT", str(store)))
    for name, sql in reference_views():
        if name in ("cutoffs", "metrics"):
            con.execute(f"CREATE VIEW {name} AS {sql}")
    reference = sorted(con.sql("SELECT run, attempt, step, key, value FROM metrics"
                               ).fetchall())
    view = sorted(tuple(r.values()) for r in tracklake.query(
        "SELECT run, attempt, step, key, value FROM metrics", root=store).to_pylist())
    assert reference == view
    assert len([r for r in view if r[0] == "a"]) == 2 * 60


def test_the_footer_checksum_is_computed_as_documented(store: Path) -> None:
    part = next(store.glob("metrics/**/*.parquet")).read_bytes()
    length = int.from_bytes(part[-8:-4], "little")
    footer = bytearray(part[-8 - length : -8])
    at = footer.find(b"tracklake.footer_crc32")
    digits = re.search(rb"\d{10}", footer[at:]).group()  # type: ignore[union-attr]
    start = footer.find(digits, at)
    footer[start : start + 10] = b"##########"
    assert zlib.crc32(footer) == int(digits)


def test_write_report_has_the_documented_keys(store: Path) -> None:
    attempt = json.loads(next(store.glob("runs/**/attempt=*.json")).read_text())
    assert set(attempt["write_report"]) == {
        "status", "complete", "failed_writes", "last_error", "dropped_values",
        "dropped_records", "unwritten_records", "segments_taken", "errors_by_errno"}
