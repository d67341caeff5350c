"""Writing one part from many sources in bounded memory.

A part is written as its chunks come, never held whole: memory depends on the chunk size
and the sort's memory limit, not on the stream's length (docs/performance.md).

- Metric parts are ordered by (key, step, seq), but their sources are not: segments come
  in seq order and each earlier part by key within its own seq range. DuckDB sorts them
  under `SORT_MEMORY_LIMIT`, spilling sorted runs to a temporary directory beside the part
  and merging them (an external merge sort, in C++, on every core), and hands the result
  back in chunks of `CHUNK_ROWS`, each written as Parquet row groups at once. The metric
  summary is built from each chunk's summary (the last chunk holding a key holds its
  last value, since chunks come in key, step, seq order).
- The other kinds are stored in seq order, the order their sources are already in: their
  batches are written straight through, without sorting.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, SCHEMAS, StreamId, fsync_dir, part_name
from tracklake._format.part import open_part, write_part_stream

#: DuckDB's memory limit for sorting one metric part; beyond it, sorted runs spill to disk.
SORT_MEMORY_LIMIT = "192MB"
#: Rows handed from the sort to the Parquet writer at a time (8 row groups).
CHUNK_ROWS = 1 << 20

SUMMARY_SQL = """
SELECT key, count(*) AS count, min(value) AS min, max(value) AS max,
       min(step) AS first_step, max(step) AS last_step,
       arg_max(value, (step, seq)) AS last_value, max(seq) AS last_seq,
       epoch_us(arg_max(time, (step, seq))) AS last_time_us
FROM batch GROUP BY key ORDER BY key
"""


@dataclass
class SeqRange:
    """What went into a part: rows, and the lowest and highest seq among them."""

    rows: int = 0
    first: int = -1
    last: int = -1

    def observe(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Pass `batches` through, counting their rows and seq range."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            lo, hi = pc.min_max(batch.column("seq")).values()
            self.first = lo.as_py() if self.rows == 0 else min(self.first, lo.as_py())
            self.last = max(self.last, hi.as_py())
            self.rows += batch.num_rows
            yield batch


def _duck_min(a: Any, b: Any) -> Any:
    """min as DuckDB orders doubles (NaN above every number), as `SUMMARY_SQL` computes it."""
    if a is None or b is None:
        return b if a is None else a
    return a if (_nan_last(a) <= _nan_last(b)) else b


def _duck_max(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    return a if (_nan_last(a) >= _nan_last(b)) else b


def _nan_last(v: Any) -> tuple[bool, Any]:
    return (isinstance(v, float) and math.isnan(v), v)


class SummaryBuilder:
    """The per-key metric summary of a part, from its chunks in (key, step, seq) order."""

    def __init__(self) -> None:
        import duckdb  # imported on use: `import tracklake` stays light for training processes

        self._con = duckdb.connect()
        self._rows: dict[str, dict[str, Any]] = {}

    def add(self, chunk: pa.Table) -> None:
        self._con.register("batch", chunk)
        try:
            rows = self._con.execute(SUMMARY_SQL).fetchall()
            names = [d[0] for d in self._con.description]
        finally:
            self._con.unregister("batch")
        for r in rows:
            new = dict(zip(names, r, strict=True))
            old = self._rows.get(new["key"])
            if old is not None:
                new["count"] += old["count"]
                new["min"] = _duck_min(old["min"], new["min"])
                new["max"] = _duck_max(old["max"], new["max"])
                new["first_step"] = min(old["first_step"], new["first_step"])
                new["last_step"] = max(old["last_step"], new["last_step"])
                new["last_seq"] = max(old["last_seq"], new["last_seq"])
            self._rows[new["key"]] = new  # a later chunk holds the key's later (step, seq)

    def metadata(self) -> dict[str, str]:
        """The part's `tracklake.summary` entry (one object per key, in key order)."""
        rows = sorted(self._rows.values(), key=lambda r: r["key"].encode())
        return {"tracklake.summary": json.dumps(rows, allow_nan=True)}

    def close(self) -> None:
        self._con.close()


def _sorted_metric_chunks(sources: Iterable[pa.RecordBatch], spill: Path,
                          summary: SummaryBuilder, tick: Callable[[], None]
                          ) -> Iterator[pa.Table]:
    """`sources` in (key, step, seq) order, in chunks, sorted by DuckDB in bounded memory."""
    import duckdb

    schema = SCHEMAS["metrics"]
    failed: list[Exception] = []  # what reading the sources raised, inside DuckDB's scan

    def scanned() -> Iterator[pa.RecordBatch]:
        try:
            yield from sources
        except Exception as exc:
            failed.append(exc)
            raise

    con = duckdb.connect(config={"memory_limit": SORT_MEMORY_LIMIT,
                                 "temp_directory": str(spill),
                                 "preserve_insertion_order": False})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("src", pa.RecordBatchReader.from_batches(schema, scanned()))
        query = con.sql("SELECT seq, time, step, key, value FROM src ORDER BY key, step, seq")
        with query.to_arrow_reader(batch_size=CHUNK_ROWS) as result:
            for batch in result:
                chunk = pa.Table.from_batches([batch]).cast(schema)
                summary.add(chunk)
                tick()
                yield chunk
    except duckdb.Error:
        if failed:
            raise failed[0] from None  # the source's own error (a damaged part, a full disk)
        raise
    finally:
        con.close()


def _seq_chunks(kind: str, sources: Iterable[pa.RecordBatch], tick: Callable[[], None]
                ) -> Iterator[pa.Table]:
    """`sources` (already in seq order) gathered into chunks of about CHUNK_ROWS rows."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in sources:
        pending.append(batch)
        rows += batch.num_rows
        if rows >= CHUNK_ROWS:
            yield pa.Table.from_batches(pending, SCHEMAS[kind])
            tick()
            pending, rows = [], 0
    if pending:
        yield pa.Table.from_batches(pending, SCHEMAS[kind])


def part_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The records of a part, a row group at a time, its footer and page checksums
    verified (`FormatError` naming the file if they do not)."""
    parquet = open_part(path)
    schema = SCHEMAS[parquet.schema_arrow.metadata[b"tracklake.kind"].decode()]
    try:
        for batch in parquet.iter_batches(batch_size=CHUNK_ROWS // 8):
            yield batch.replace_schema_metadata(None).cast(schema)
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc


def write_sorted_part(directory: Path, s: StreamId, sources: Iterable[pa.RecordBatch],
                      last_segment: Callable[[], int],
                      tick: Callable[[], None] = lambda: None) -> Path | None:
    """Write the records of `sources` (de-duplicated, no seq twice) as one part of stream
    `s` in `directory`, atomically, in bounded memory; its path, or None if there were
    no records. The part is named after `last_segment()`, asked once `sources` is read
    (a damaged segment may end it early); `tick()` is called after each chunk (the caller
    refreshes its claim)."""
    seen = SeqRange()
    tmp = directory / f".part-new.parquet.{os.getpid()}.tmp"
    spill = directory / f".sort.{platform.node()}.{os.getpid()}.tmp"
    summary = SummaryBuilder() if s.kind == "metrics" else None
    meta = {"tracklake.format": FORMAT_VERSION, "tracklake.kind": s.kind,
            "tracklake.project": s.project, "tracklake.run": s.run,
            "tracklake.rank": str(s.rank), "tracklake.attempt": str(s.attempt)}
    schema = SCHEMAS[s.kind].with_metadata(meta)
    try:
        if summary is not None:
            chunks = _sorted_metric_chunks(seen.observe(sources), spill, summary, tick)
            write_part_stream(tmp, schema, chunks, s.kind, summary.metadata)
        else:
            write_part_stream(tmp, schema, _seq_chunks(s.kind, seen.observe(sources), tick),
                              s.kind)
        if seen.rows == 0:
            tmp.unlink()
            return None
        final = directory / part_name(seen.first, seen.last, last_segment())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # the sources stay; nothing was removed
        raise
    finally:
        if summary is not None:
            summary.close()
        shutil.rmtree(spill, ignore_errors=True)
    fsync_dir(directory)
    return final
