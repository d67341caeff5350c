"""A metric part's per-key summary, computed from its rows.

A part too small to pay for its summary is written without one (`part.SUMMARY_MAX_SHARE`):
the summary JSON repeats nine field names per key, so for a run of a few steps it is
larger than the values it summarises. Readers then compute it here, from rows they read
anyway in a few kilobytes, with the same definitions as the stored one (compaction's
`SUMMARY_SQL`): the last value is the one with the greatest (step, seq); `max` is NaN if
any value is NaN (DuckDB orders NaN above every number); `min` is NaN only if all are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format.columns import combined, fixed, numpy_of

#: A part's metric summary, one row per key (as `summary_columns` gives it).
SUMMARY_SCHEMA = pa.schema([
    ("key", pa.string()), ("count", pa.int64()), ("min", pa.float64()),
    ("max", pa.float64()), ("first_step", pa.int64()), ("last_step", pa.int64()),
    ("last_value", pa.float64()), ("last_seq", pa.int64()), ("last_time_us", pa.int64())])


def rows_of(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """A summary's columns as one object per key."""
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def summary_columns(table: pa.Table) -> dict[str, list[Any]]:
    """The summary of the metric records in `table`, as columns (`SUMMARY_SCHEMA`'s
    names), one row per key in key order: count, min, max, first_step, last_step,
    last_value, last_seq, last_time_us. No object per key is made (a part of 100,000
    keys); `rows_of` makes them."""
    if table.num_rows == 0:
        return {name: [] for name in SUMMARY_SCHEMA.names}
    table = table.select(["key", "step", "seq", "value", "time"])
    keys = _strings(table.column("key"))
    if not _in_part_order(keys, numpy_of(table.column("step")), numpy_of(table.column("seq"))):
        table = table.take(pc.sort_indices(table, sort_keys=[
            ("key", "ascending"), ("step", "ascending"), ("seq", "ascending")]))
        keys = _strings(table.column("key"))
    starts = np.flatnonzero(np.r_[True, numpy_of(pc.not_equal(keys[1:], keys[:-1]),
                                                 null=False)])
    ends = np.r_[starts[1:], table.num_rows] - 1
    step = numpy_of(table.column("step"))
    seq = numpy_of(table.column("seq"))
    value = numpy_of(table.column("value"))
    time_us = numpy_of(table.column("time").cast(pa.int64()))
    return {
        "key": keys.take(fixed(starts, pa.int64())).to_pylist(),
        "count": (ends - starts + 1).tolist(),
        "min": np.fmin.reduceat(value, starts).tolist(),  # NaN only if every value is
        "max": np.maximum.reduceat(value, starts).tolist(),  # NaN if any value is
        "first_step": step[starts].tolist(),
        "last_step": step[ends].tolist(),
        "last_value": value[ends].tolist(),
        "last_seq": np.maximum.reduceat(seq, starts).tolist(),
        "last_time_us": time_us[ends].tolist(),
    }


def _strings(keys: pa.ChunkedArray) -> pa.Array:
    keys = combined(keys)
    return keys.cast(pa.string()) if pa.types.is_dictionary(keys.type) else keys


def _in_part_order(keys: pa.Array, step: np.ndarray, seq: np.ndarray) -> bool:
    """Whether the rows are in (key, step, seq) order already, as every part tracklake
    writes is (a part from elsewhere may not be): sorting a million rows again cost
    0.1 s of summarising a 100,000-key part."""
    if keys.null_count:
        return False
    if len(keys) < 2:
        return True
    later = numpy_of(pc.greater(keys[1:], keys[:-1]))
    same = numpy_of(pc.equal(keys[1:], keys[:-1]))
    ordered = (step[1:] > step[:-1]) | ((step[1:] == step[:-1]) & (seq[1:] >= seq[:-1]))
    return bool(np.all(later | (same & ordered)))
