"""Arrow columns built from Python values through NumPy buffers, never through `pa.array`.

`pa.array()` asks pyarrow's pandas shim whether its argument is a pandas object, which
imports pandas whenever it is installed (hundreds of milliseconds, and a module a training
process did not ask for). Building arrays with `pa.Array.from_buffers` from NumPy arrays
avoids that path entirely. A value that does not fit its column raises `OverflowError`
(or `TypeError`/`ValueError` for a wrong type); the writer counts what it then drops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa


def _validity(values: Sequence[Any]) -> tuple[Any, int]:
    """The validity bitmap of `values` (None where every value is present) and null count."""
    present = np.fromiter((v is not None for v in values), np.bool_, len(values))
    nulls = len(values) - int(present.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(present, bitorder="little")), nulls


def fixed(values: Any, type_: pa.DataType) -> pa.Array:
    """A fixed-width column (int, float, timestamp) from a NumPy array without nulls."""
    dtype = np.float64 if pa.types.is_floating(type_) else (
        np.int32 if type_.bit_width == 32 else np.int64)
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])


def nullable(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """A fixed-width column from Python values that may be None (stored as null)."""
    validity, nulls = _validity(values)
    dtype = np.float64 if pa.types.is_floating(type_) else (
        np.int32 if type_.bit_width == 32 else np.int64)
    data = np.fromiter((0 if v is None else v for v in values), dtype, len(values))
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(data)], nulls)


def strings(values: Sequence[str | None]) -> pa.Array:
    """A string column from str values (None is null)."""
    validity, nulls = _validity(values)
    encoded = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise OverflowError(f"{len(values)} strings of {int(offsets[-1])} bytes do not fit one "
                            "Arrow string column (2 GiB)")
    return pa.Array.from_buffers(
        pa.string(), len(values),
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))],
        nulls)


def lists(values: Sequence[Sequence[Any] | None], type_: pa.ListType) -> pa.Array:
    """A list<int64> or list<float64> column (None is null)."""
    validity, nulls = _validity(values)
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
    if int(lengths.sum()) >= 1 << 31:
        raise OverflowError(f"{len(values)} lists of {int(lengths.sum())} values do not fit "
                            "one Arrow list column")
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=np.int32)
    item = type_.value_type
    dtype = np.float64 if pa.types.is_floating(item) else np.int64
    present = [v for v in values if v is not None]
    flat = np.concatenate([np.asarray(v, dtype=dtype) for v in present]) if present \
        else np.array([], dtype=dtype)
    child = fixed(flat, item)
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(offsets)], nulls,
                                 children=[child])


def column(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """A column of `type_` from Python values (None is null)."""
    if pa.types.is_string(type_):
        return strings(values)
    if pa.types.is_list(type_):
        return lists(values, type_)
    return nullable(values, type_)


def rows_batch(schema: pa.Schema, rows: Sequence[dict[str, Any]]) -> pa.RecordBatch:
    """A record batch of `schema` from row dicts (missing fields are null)."""
    return pa.RecordBatch.from_arrays(
        [column([row.get(f.name) for row in rows], f.type) for f in schema], schema=schema)
