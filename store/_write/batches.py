"""Turning buffered calls into record batches, one call group at a time if need be.

A metric call is buffered as (seq, step, time, key tuple, value list); rows of the other
kinds as dicts sharing the `seq` of their call. Building a batch never takes more than
one call's data down with it: if a batch cannot be built, each call is built on its own
and only the calls that fail are dropped, counted by the writer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tracklake._format import SCHEMAS
from tracklake._format.columns import fixed, rows_batch

_METRICS = SCHEMAS["metrics"]
MetricCall = tuple[int, int, int, tuple[str, ...], list[float]]  # seq, step, time_us, keys, values
Rows = list[dict[str, Any]]
#: Called with (kind, records dropped, the exception) for each call that cannot be built.
OnDrop = Callable[[str, int, Exception], None]


def _floats(values: list[float]) -> Any:
    try:
        return np.array(values, np.float64)
    except (OverflowError, TypeError, ValueError):
        # a Python int beyond float64 range (or a float()-able object) slipped through
        return np.fromiter(map(_clamp, values), np.float64, len(values))


def _clamp(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float64 range
        return math.inf if value > 0 else -math.inf


class KeyColumn:
    """The `key` column of metric batches, with each key tuple encoded once."""

    def __init__(self) -> None:
        self._encoded: dict[tuple[str, ...], tuple[bytes, Any]] = {}

    def encoded(self, keys: tuple[str, ...]) -> tuple[bytes, Any]:
        found = self._encoded.get(keys)
        if found is None:
            parts = [k.encode() for k in keys]
            found = (b"".join(parts), np.fromiter(map(len, parts), np.int64, len(parts)))
            self._encoded[keys] = found
        return found

    def column(self, calls: Sequence[MetricCall]) -> pa.Array:
        pieces = [self.encoded(c[3]) for c in calls]
        lengths = np.concatenate([p[1] for p in pieces])
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] >= 1 << 31:
            raise OverflowError("metric keys of one batch exceed 2 GiB")
        return pa.Array.from_buffers(pa.string(), len(lengths), [
            None, pa.py_buffer(offsets.astype(np.int32)),
            pa.py_buffer(b"".join(p[0] for p in pieces))])


def metric_batch(keys: KeyColumn, calls: Sequence[MetricCall]) -> pa.RecordBatch:
    """One record batch holding every value of `calls` (each call non-empty)."""
    counts = np.fromiter((len(c[4]) for c in calls), np.int64, len(calls))
    meta = np.array([c[:3] for c in calls], dtype=np.int64)  # OverflowError outside int64
    values = _floats([v for c in calls for v in c[4]])
    return pa.RecordBatch.from_arrays([
        fixed(np.repeat(meta[:, 0], counts), pa.int64()),
        fixed(np.repeat(meta[:, 2], counts), _METRICS.field("time").type),
        fixed(np.repeat(meta[:, 1], counts), pa.int64()),
        keys.column(calls),
        fixed(values, pa.float64()),
    ], schema=_METRICS)


def metric_batches(keys: KeyColumn, calls: list[MetricCall], batch_values: int,
                   on_drop: OnDrop) -> Iterator[pa.RecordBatch]:
    """Batches of at most `batch_values` values (a larger single call is one batch)."""
    start = 0
    while start < len(calls):
        end, n = start, 0
        while end < len(calls) and (n == 0 or n + len(calls[end][4]) <= batch_values):
            n += len(calls[end][4])
            end += 1
        yield from _built(lambda group: metric_batch(keys, group), calls[start:end],
                          lambda group: sum(len(c[4]) for c in group), "metrics", on_drop)
        start = end


def row_batches(kind: str, rows: Rows, on_drop: OnDrop) -> Iterator[pa.RecordBatch]:
    """One batch of `rows` of `kind`, or, if that fails, one per call (rows sharing a seq)."""
    schema = SCHEMAS[kind]
    groups: list[Rows] = []
    for row in rows:
        if groups and groups[-1][0]["seq"] == row["seq"]:
            groups[-1].append(row)
        else:
            groups.append([row])
    yield from _built(lambda group: rows_batch(schema, [r for g in group for r in g]),
                      groups, lambda group: sum(len(g) for g in group), kind, on_drop)


#: Row batches are cut (between calls) to about this size, a quarter of what a reader
#: decodes of one batch (`segment.MAX_BATCH_BYTES`).
WRITE_BATCH_BYTES = 64 << 20


def cut_rows(batch: pa.RecordBatch, target: int = WRITE_BATCH_BYTES) -> list[pa.RecordBatch]:
    """`batch` in pieces of about `target` bytes, cut only where `seq` changes (the rows
    of one call stay together)."""
    if batch.nbytes <= target or batch.num_rows < 2:
        return [batch]
    seqs = batch.column(0).to_numpy(zero_copy_only=False)
    per_row = batch.nbytes / batch.num_rows
    pieces, start, size = [], 0, 0.0
    for i in range(1, batch.num_rows):
        size += per_row
        if size >= target and seqs[i] != seqs[i - 1]:
            pieces.append(batch.slice(start, i - start))
            start, size = i, 0.0
    pieces.append(batch.slice(start))
    return pieces


def _built(build: Callable[[Any], pa.RecordBatch], group: Sequence[Any],
           size: Callable[[Any], int], kind: str, on_drop: OnDrop) -> Iterator[pa.RecordBatch]:
    try:
        yield build(group)
        return
    except Exception as exc:  # a value the column cannot hold: fall back to one call each
        if len(group) == 1:
            on_drop(kind, size(group), exc)
            return
    for one in group:
        try:
            yield build([one])
        except Exception as exc:  # only this call's records are lost, and counted
            on_drop(kind, size([one]), exc)
