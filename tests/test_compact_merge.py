"""Merging small parts: a stream compacted many times ends with one part, every record
exactly once for tracklake's readers, cursors and plain engines; the streaming sort gives
the same order and summary as sorting the whole table; a merge killed before removing its
inputs, or meeting a damaged part, loses nothing."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import tracklake
from tracklake import read
from tracklake._format import StreamId
from tracklake._format import part as part_format
from tracklake._ops import metric_sort, sorted_part
from tracklake._ops.compact import metric_summary
from tracklake._read.reader import list_stream, read_table

STREAM = StreamId("p", "r", 0, 1, "metrics")


@pytest.fixture(autouse=True)
def _no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests pin the files a merge leaves: replaced parts go at once, as with
    TRACKLAKE_PART_GRACE=0 (the grace period is test_replaced_parts.py's)."""
    monkeypatch.setenv("TRACKLAKE_PART_GRACE", "0")


def _parts(root: Path, kind: str = "metrics") -> list[str]:
    return sorted(glob.glob(f"{root}/{kind}/**/part-*.parquet", recursive=True))


def _live_run(root: Path) -> tracklake.Run:
    return tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                          segment_bytes=1, compact=False)  # every flush seals a segment


def test_fifty_compactions_of_a_live_run_leave_one_part_and_every_record_once(
        root: Path) -> None:
    run = _live_run(root)
    cursor = read.Cursor("p", "r")
    delivered: list[int] = []
    before = after = 0
    for round_ in range(50):
        for step in range(round_ * 10, round_ * 10 + 10):
            run.log({"loss": float(step), "acc": step / 2}, step=step)
        run.log({"loss": -1.0}, step=round_ * 10 + 9)  # the same key twice at one step
        run.flush()
        report = tracklake.compact(root=root)
        before += report.bytes_before
        after += report.bytes_after
        assert len(_parts(root)) == (1 if round_ else 0)  # the newest segment is live
        if round_ % 7 == 3:  # an exporter following the run, across merges
            for _, batch in read.read_run(root, cursor, kinds=("metrics",)):
                delivered.extend(batch.column("seq").to_pylist())
    run.finish()
    tracklake.compact(root=root)
    for _, batch in read.read_run(root, cursor, kinds=("metrics",)):
        delivered.extend(batch.column("seq").to_pylist())
    assert sorted(set(delivered)) == list(range(550))  # each log() call, none skipped
    assert len(delivered) == 50 * 21  # one row per value, none twice
    assert len(_parts(root)) == 1
    assert after <= before
    table = ds.dataset(_parts(root), format="parquet").to_table()
    assert table.num_rows == 50 * 21
    assert duckdb.sql(f"SELECT count(*), count(DISTINCT (seq, key)) FROM read_parquet("
                      f"'{root}/metrics/**/*.parquet')").fetchall() == [(1050, 1050)]
    last = tracklake.query("SELECT value FROM metrics WHERE key = 'loss' AND step = 499 "
                           "ORDER BY seq DESC LIMIT 1", root=root).to_pylist()
    assert last == [{"value": -1.0}]


def _metric_batch(rows: list[tuple[int, int, str, float]]) -> pa.RecordBatch:
    seq, step, key, value = zip(*rows, strict=True)
    return pa.record_batch({"seq": pa.array(seq, pa.int64()),
                            "time": pa.array([1_000_000 * s for s in seq],
                                             pa.timestamp("us", tz="UTC")),
                            "step": pa.array(step, pa.int64()), "key": pa.array(key),
                            "value": pa.array(value, pa.float64())})


@pytest.mark.parametrize("run_rows", [17, 1 << 20])
def test_the_streaming_sort_and_summary_equal_sorting_the_whole_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_rows: int) -> None:
    """Runs of 17 rows spilled and merged, chunks of 7: every key spans several runs and
    chunks, its steps go back once (a merge that must sort), and its summary is combined;
    or one run sorted in memory, its summary taken for every key at once."""
    monkeypatch.setattr(metric_sort, "RUN_ROWS", run_rows)
    monkeypatch.setattr(metric_sort, "CHUNK_ROWS", 7)
    # a 200-row part keeps its summary only if told to (it outweighs the values)
    monkeypatch.setattr(part_format, "SUMMARY_MAX_SHARE", 100.0)
    keys = ["loss", "é/ü", "a b", "nan_then_num", "zz"]
    rows: list[tuple[int, int, str, float]] = []
    for seq in range(40):
        step = seq // 2 if seq != 30 else 3  # a key logged twice at one step; a step back
        for k in keys:
            v = {"loss": 1.0 / (seq + 1), "é/ü": -float(seq), "a b": math.inf if seq == 5
                 else (-math.inf if seq == 6 else float(seq % 3)),
                 "nan_then_num": math.nan if seq < 20 else float(seq), "zz": math.nan}[k]
            rows.append((seq, step, k, v))
    batches = [_metric_batch(rows[i:i + 13]) for i in range(0, len(rows), 13)]
    part = sorted_part.write_sorted_part(tmp_path, STREAM, iter(batches), lambda: 3)
    assert part is not None and part.name == "part-000000000000-000000000039-000003.parquet"
    whole = pa.Table.from_batches(batches)
    got = pq.read_table(part)
    expected = whole.sort_by([("key", "ascending"), ("step", "ascending"),
                              ("seq", "ascending")])
    assert got.select(["seq", "step", "key"]).equals(expected.select(["seq", "step", "key"]))
    assert list(map(repr, got.column("value").to_pylist())) == list(
        map(repr, expected.column("value").to_pylist()))  # NaN where NaN was
    stored = json.loads(pq.read_metadata(part).metadata[b"tracklake.summary"])
    assert json.dumps(stored, allow_nan=True) == json.dumps(metric_summary(whole),
                                                            allow_nan=True)
    assert len(pq.ParquetFile(part).metadata.row_group(0).to_dict()["columns"]) == 5


def test_a_merge_killed_before_removing_its_inputs_is_read_once_and_finished_later(
        root: Path) -> None:
    run = _live_run(root)
    for round_ in range(3):
        run.log({"loss": float(round_)}, step=round_)
        run.flush()
        tracklake.compact(root=root)
    run.finish()
    tracklake.compact(root=root)
    # put back what a killed merge leaves: the merged part and the parts it holds
    (merged,) = map(Path, _parts(root))
    directory = merged.parent
    table = pq.read_table(merged)
    for i in range(3):
        one = table.filter(pa.compute.equal(table.column("seq"), i))
        pq.write_table(one, directory / f"part-{i:012d}-{i:012d}-{i:06d}.parquet")
    files = list_stream(root, STREAM)
    assert [p.path for p in files.parts] == [merged] and len(files.merged) == 3
    assert read_table(root, STREAM).column("seq").to_pylist() == [0, 1, 2]
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root
                           ).to_pylist() == [{"n": 3}]
    report = tracklake.compact(root=root)
    assert len(report.parts_removed) == 3 and _parts(root) == [str(merged)]


def test_a_damaged_small_part_is_kept_and_the_segments_are_compacted_without_it(
        root: Path) -> None:
    run = _live_run(root)
    run.log({"loss": 1.0}, step=0)
    run.flush()
    tracklake.compact(root=root)
    run.log({"loss": 2.0}, step=1)
    run.flush()
    tracklake.compact(root=root)  # (the newest segment is live: it stays)
    run.log({"loss": 3.0}, step=2)
    run.finish()
    (damaged,) = map(Path, _parts(root))
    data = bytearray(damaged.read_bytes())
    data[10] ^= 0xFF  # a page of values, not the footer
    damaged.write_bytes(bytes(data))
    report = tracklake.compact(root=root)
    assert any("not merged" in why for _, why in report.skipped)
    assert damaged.exists() and len(_parts(root)) == 2
    assert not list(root.rglob("*.arrows"))
    assert report.records == 2  # seq 1 and 2, from segments; seq 0 stays in the damaged part


def test_compacting_a_compacted_stream_again_rewrites_nothing(root: Path) -> None:
    run = _live_run(root)
    run.log({"loss": 1.0}, step=0)
    run.finish()
    first = tracklake.compact(root=root)
    assert first.parts_written
    again = tracklake.compact(root=root)
    assert again.parts_written == [] and again.parts_merged == []
    assert again.segments_removed == []


def test_a_dry_run_names_the_parts_it_would_merge_and_touches_nothing(root: Path) -> None:
    run = _live_run(root)
    for step in range(3):
        run.log({"loss": float(step)}, step=step)
        run.flush()
        tracklake.compact(root=root)
    run.finish()
    files_before = sorted(p.name for p in root.rglob("*") if p.is_file())
    plan = tracklake.compact(root=root, dry_run=True)
    assert plan.parts_merged == [Path(p) for p in _parts(root)]  # the one small part
    assert plan.segments_removed and plan.parts_written == []
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == files_before


def test_each_row_group_of_a_wide_part_stores_the_keys_it_holds_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream of 3,000 keys sorted in one run shares one dictionary of keys; each row
    group of its part stores only its own keys' (Parquet writes a row group's dictionary
    whole: every group held all 3,000 before), and reads back as written."""
    monkeypatch.setattr(part_format, "KEY_GROUP_MIN_ROWS", 500)
    rows = [(seq, step, f"k{k:04d}", float(k)) for seq, (step, k) in enumerate(
        (step, k) for step in range(2) for k in range(3000))]
    batches = [_metric_batch(rows[i:i + 1000]) for i in range(0, len(rows), 1000)]
    part = sorted_part.write_sorted_part(tmp_path, STREAM, iter(batches), lambda: 0)
    assert part is not None
    parquet = pq.ParquetFile(part, read_dictionary=["key"])
    assert parquet.num_row_groups >= 6
    for i in range(parquet.num_row_groups):
        keys = parquet.read_row_group(i, columns=["key"]).column("key").combine_chunks()
        assert len(keys.dictionary) <= len(keys), (i, len(keys.dictionary), len(keys))
    got = pq.read_table(part)
    assert got.column("key").to_pylist() == sorted(r[2] for r in rows)
    assert got.column("value").to_pylist() == [float(k) for k in range(3000)
                                               for _ in range(2)]


def test_a_summary_too_large_to_store_is_never_made(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A part of 3,000 keys of one value each cannot carry its summary (far more bytes
    than its values): it is written without one, and the per-key objects are never made;
    readers compute the same summary from its rows. A part of few keys stores its summary
    as JSON without spaces."""
    made: list[int] = []
    rows_of = metric_sort.SummaryBuilder.rows
    monkeypatch.setattr(metric_sort.SummaryBuilder, "rows",
                        lambda self: made.append(len(self)) or rows_of(self))
    wide = [(k, 0, f"k{k:04d}", float(k)) for k in range(3000)]
    part = sorted_part.write_sorted_part(tmp_path, STREAM, iter([_metric_batch(wide)]),
                                         lambda: 0)
    assert part is not None and made == []
    assert part_format.SUMMARY_KEY.encode() not in pq.ParquetFile(part).metadata.metadata
    got = part_format.summary_rows(part_format.open_part(part), part)
    assert got == metric_summary(pq.read_table(part))
    narrow = [(seq, seq // 2, f"k{seq % 2}", float(seq)) for seq in range(20_000)]
    (tmp_path / "narrow").mkdir()
    part = sorted_part.write_sorted_part(tmp_path / "narrow", STREAM,
                                         iter([_metric_batch(narrow)]), lambda: 0)
    assert part is not None and made == [2]
    stored = pq.ParquetFile(part).metadata.metadata[part_format.SUMMARY_KEY.encode()]
    assert b" " not in stored
    assert json.loads(stored) == metric_summary(pq.read_table(part))
