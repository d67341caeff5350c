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


def summary_from_rows(table: pa.Table) -> list[dict[str, Any]]:
    """One object per key, in key order: count, min, max, first_step, last_step,
    last_value, last_seq, last_time_us of the metric records in `table`."""
    if table.num_rows == 0:
        return []
    table = table.select(["key", "step", "seq", "value", "time"])
    table = table.take(pc.sort_indices(table, sort_keys=[
        ("key", "ascending"), ("step", "ascending"), ("seq", "ascending")]))
    keys = table.column("key").combine_chunks()
    if pa.types.is_dictionary(keys.type):
        keys = keys.cast(pa.string())
    starts = np.flatnonzero(np.r_[True, pc.not_equal(keys[1:], keys[:-1]).to_numpy(
        zero_copy_only=False)])
    ends = np.r_[starts[1:], table.num_rows] - 1
    step = table.column("step").to_numpy()
    seq = table.column("seq").to_numpy()
    value = table.column("value").to_numpy()
    time_us = table.column("time").cast(pa.int64()).to_numpy()
    columns = {
        "key": keys.take(pa.array(starts)).to_pylist(),
        "count": (ends - starts + 1).tolist(),
        "min": np.fmin.reduceat(value, starts).tolist(),  # NaN only if every value is
        "max": np.maximum.reduceat(value, starts).tolist(),  # NaN if any value is
        "first_step": step[starts].tolist(),
        "last_step": step[ends].tolist(),
        "last_value": value[ends].tolist(),
        "last_seq": np.maximum.reduceat(seq, starts).tolist(),
        "last_time_us": time_us[ends].tolist(),
    }
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
