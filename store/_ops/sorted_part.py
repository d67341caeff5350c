"""Writing one part from many sources in bounded memory.

A part is written as its chunks come, never held whole: memory depends on the chunk and
run sizes, not on the stream's length (docs/performance.md).

- Metric parts are ordered by (key, step, seq), but their sources are not: segments come
  in seq order and each earlier part by key within its own seq range. `MetricSorter`
  (metric_sort.py) sorts them externally, spilling sorted runs beside the part, and
  builds the part's summary on the way.
- The other kinds are stored in seq order, the order their sources are already in: their
  batches are written straight through, without sorting.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, SCHEMAS, StreamId, fsync_dir, part_name
from tracklake._format.columns import gathered
from tracklake._format.files import scratch
from tracklake._format.part import (
    open_part,
    remember_summary,
    summary_entry,
    write_part_stream,
)
from tracklake._format.part_bounds import bounded_batches
from tracklake._ops.metric_sort import SORTED_SCHEMA, MetricSorter

#: Rows handed to the Parquet writer at a time (8 row groups).
CHUNK_ROWS = 1 << 20


@dataclass
class SeqRange:
    """What went into a part: rows, and the lowest and highest seq among them."""

    rows: int = 0
    first: int = -1
    last: int = -1

    def observe(self, batches: Iterable[pa.RecordBatch], tick: Callable[[], None]
                ) -> Iterator[pa.RecordBatch]:
        """Pass `batches` through, counting their rows and seq range (and calling `tick`
        every CHUNK_ROWS rows or so)."""
        since_tick = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            lo, hi = pc.min_max(batch.column("seq")).values()
            self.first = lo.as_py() if self.rows == 0 else min(self.first, lo.as_py())
            self.last = max(self.last, hi.as_py())
            self.rows += batch.num_rows
            since_tick += batch.num_rows
            if since_tick >= CHUNK_ROWS:
                tick()
                since_tick = 0
            yield batch


def _sorted_metric_chunks(sources: Iterable[pa.RecordBatch], sorter: MetricSorter,
                          tick: Callable[[], None]) -> Iterator[pa.Table]:
    """`sources` in (key, step, seq) order, in chunks, sorted in bounded memory."""
    sorter.add(sources)
    for chunk in sorter.sorted():
        tick()
        yield chunk


def _seq_chunks(kind: str, sources: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """`sources` (already in seq order) gathered into chunks of about CHUNK_ROWS rows."""
    for batches in gathered(sources, CHUNK_ROWS):
        yield pa.Table.from_batches(batches, SCHEMAS[kind])


def part_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The records of a part, a row group at a time, its footer and page checksums
    verified (`FormatError` naming the file if they do not)."""
    parquet = open_part(path, encoded=True)
    schema = SCHEMAS[parquet.schema_arrow.metadata[b"tracklake.kind"].decode()]
    try:
        for batch in bounded_batches(parquet, path, CHUNK_ROWS // 8):
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
    (a damaged segment may end it early); none is written if that is negative (the
    records held no part and no segment read whole). `tick()` is called after each chunk
    (the caller refreshes its claim)."""
    seen = SeqRange()
    tmp = scratch(directory / "part-new.parquet")
    spill = scratch(directory / f"sort.{platform.node()}")
    sorter = MetricSorter(spill) if s.kind == "metrics" else None
    stored = False  # whether the footer holds the metric summary
    meta = {"tracklake.format": FORMAT_VERSION, "tracklake.kind": s.kind,
            "tracklake.project": s.project, "tracklake.run": s.run,
            "tracklake.rank": str(s.rank), "tracklake.attempt": str(s.attempt)}
    schema = SCHEMAS[s.kind].with_metadata(meta)
    try:
        if sorter is not None:
            chunks = _sorted_metric_chunks(seen.observe(sources, tick), sorter, tick)
            summary = sorter.summary
            stored = write_part_stream(
                tmp, SORTED_SCHEMA.with_metadata(meta), chunks, s.kind,
                lambda written: summary_entry(len(summary), summary.rows, written))
        else:
            write_part_stream(tmp, schema, _seq_chunks(s.kind, seen.observe(sources, tick)),
                              s.kind)
        made_of = last_segment() if seen.rows else -1
        if made_of < 0:  # no records, or only those before a first segment's damage,
            tmp.unlink()  # which that segment, kept for fsck, holds and reads already
            return None
        final = directory / part_name(seen.first, seen.last, made_of)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # the sources stay; nothing was removed
        raise
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    fsync_dir(directory)
    if sorter is not None and not stored:
        with contextlib.suppress(OSError):  # only saves a reader here from summarising it
            remember_summary(final, sorter.summary.columns())
    return final
