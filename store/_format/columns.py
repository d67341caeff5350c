"""Arrow columns built from Python values through NumPy buffers, and read back as NumPy
arrays, never through `pa.array`, `pa.scalar`, `pa.table` or `to_numpy`.

Those ask pyarrow's pandas shim whether their argument is a pandas object, which imports
pandas whenever it is installed (0.2 s and more, apache/arrow#34994): a module a training
process did not ask for, and a cost a question asked from Python should not pay unless
its caller wants a DataFrame. Refusing the import instead would change how pyarrow treats
the caller's own pandas objects for the rest of the process. Building arrays with
`pa.Array.from_buffers` from NumPy arrays, and reading their buffers, avoids that path
entirely. A value that does not fit its column raises `OverflowError` (or
`TypeError`/`ValueError` for a wrong type); the writer counts what it then drops.

What the write and read paths need: fixed-width numbers, booleans, strings, and lists and
structs of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa


def _validity(values: Sequence[Any]) -> tuple[Any, int]:
    """The validity bitmap of `values` (None where every value is present) and null count."""
    present = np.fromiter((v is not None for v in values), np.bool_, len(values))
    nulls = len(values) - int(present.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(present, bitorder="little")), nulls


def _dtype(type_: pa.DataType) -> Any:
    """The NumPy type of a fixed-width column's values (a timestamp's: its int64 ticks)."""
    if pa.types.is_floating(type_):
        return np.float64 if type_.bit_width == 64 else np.float32
    if pa.types.is_integer(type_):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(type_) else 'u'}"
                        f"{type_.bit_width // 8}")
    if pa.types.is_timestamp(type_) or pa.types.is_duration(type_):
        return np.int64
    raise TypeError(f"no NumPy form for Arrow type {type_}")


def fixed(values: Any, type_: pa.DataType) -> pa.Array:
    """A fixed-width column (int, float, timestamp) from a NumPy array without nulls."""
    data = np.ascontiguousarray(values, dtype=_dtype(type_))
    return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])


def nullable(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """A fixed-width column from Python values that may be None (stored as null)."""
    validity, nulls = _validity(values)
    data = np.fromiter((0 if v is None else v for v in values), _dtype(type_), len(values))
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(data)], nulls)


def booleans(values: Sequence[Any] | np.ndarray) -> pa.Array:
    """A boolean column (None is null)."""
    if isinstance(values, np.ndarray):
        validity, nulls = None, 0
        flags = values.astype(np.bool_)
    else:
        validity, nulls = _validity(values)
        flags = np.fromiter((bool(v) for v in values), np.bool_, len(values))
    return pa.Array.from_buffers(pa.bool_(), len(flags), [
        validity, pa.py_buffer(np.packbits(flags, bitorder="little"))], nulls)


_STRING = pa.string()


def strings(values: Sequence[str | None], type_: pa.DataType = _STRING) -> pa.Array:
    """A string (or large string) column from str values (None is null)."""
    if not all(v is None or isinstance(v, str) for v in values):
        raise TypeError(f"a value that is not a string in a column of {type_}")
    validity, nulls = _validity(values)
    encoded = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    large = pa.types.is_large_string(type_)
    if not large and offsets[-1] >= 1 << 31:
        raise OverflowError(f"{len(values)} strings of {int(offsets[-1])} bytes do not fit one "
                            "Arrow string column (2 GiB)")
    return pa.Array.from_buffers(
        type_, len(values),
        [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)),
         pa.py_buffer(b"".join(encoded))], nulls)


def lists(values: Sequence[Sequence[Any] | None], type_: pa.ListType) -> pa.Array:
    """A list column (None is null): of numbers through one NumPy array, of anything else
    `column` takes through its items."""
    validity, nulls = _validity(values)
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
    if int(lengths.sum()) >= 1 << 31:
        raise OverflowError(f"{len(values)} lists of {int(lengths.sum())} values do not fit "
                            "one Arrow list column")
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=np.int32)
    item = type_.value_type
    present = [v for v in values if v is not None]
    if pa.types.is_floating(item) or pa.types.is_integer(item):
        dtype = _dtype(item)
        flat = np.concatenate([np.asarray(v, dtype=dtype) for v in present]) if present \
            else np.array([], dtype=dtype)
        child = fixed(flat, item)
    else:
        child = column([x for v in present for x in v], item)
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(offsets)], nulls,
                                 children=[child])


def structs(values: Sequence[dict[str, Any]], type_: pa.StructType) -> pa.Array:
    """A struct column from mappings, none of them None (a missing field is null)."""
    if not all(isinstance(v, dict) for v in values):
        raise TypeError(f"a value that is not a mapping in a column of {type_}")
    fields = [type_.field(i) for i in range(type_.num_fields)]
    return pa.StructArray.from_arrays(
        [column([v.get(f.name) for v in values], f.type) for f in fields], fields=fields)


def column(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """A column of `type_` from Python values (None is null)."""
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return strings(values, type_)
    if pa.types.is_list(type_):
        return lists(values, type_)
    if pa.types.is_struct(type_):
        return structs(values, type_)
    if pa.types.is_boolean(type_):
        return booleans(values)
    return nullable(values, type_)


def rows_batch(schema: pa.Schema, rows: Sequence[dict[str, Any]]) -> pa.RecordBatch:
    """A record batch of `schema` from row dicts (missing fields are null)."""
    return pa.RecordBatch.from_arrays(
        [column([row.get(f.name) for row in rows], f.type) for f in schema], schema=schema)


def rows_table(schema: pa.Schema, rows: Sequence[dict[str, Any]]) -> pa.Table:
    """A table of `schema` from row dicts (`pa.Table.from_pylist`)."""
    return pa.Table.from_batches([rows_batch(schema, rows)], schema=schema)


def table_of(columns: dict[str, pa.Array | pa.ChunkedArray],
             schema: pa.Schema | None = None) -> pa.Table:
    """A table of named arrays (`pa.table`, which asks pandas whether it was given a
    DataFrame)."""
    if schema is not None:
        return pa.Table.from_arrays([columns[n] for n in schema.names], schema=schema)
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A record batch of `schema` with no rows."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def scalar_of(value: Any, type_: pa.DataType) -> pa.Scalar:
    """`value` as an Arrow scalar of `type_`, for a compute function (given a Python value,
    one converts it with `pa.scalar`)."""
    return column([value], type_)[0]


def combined(values: pa.ChunkedArray) -> pa.Array:
    """`values` as one array (`combine_chunks` makes an empty one with `pa.array` when
    there is no chunk)."""
    return values.combine_chunks() if values.num_chunks else pa.nulls(0, values.type)


def numpy_of(values: pa.Array | pa.ChunkedArray, null: Any = None) -> np.ndarray:
    """`values` (numbers, booleans, timestamps as their int64 ticks) as a NumPy array;
    nulls read as `null`, which must be given if there are any."""
    if isinstance(values, pa.ChunkedArray):
        parts = [numpy_of(c, null) for c in values.chunks]
        if parts:
            return np.concatenate(parts)
        return np.empty(0, np.bool_ if pa.types.is_boolean(values.type)
                        else _dtype(values.type))
    n, start = len(values), values.offset
    if values.null_count and null is None:
        raise ValueError(f"{values.null_count} nulls in an array read as plain numbers")
    if pa.types.is_boolean(values.type):
        out = _bits(values.buffers()[1], start, n)
    else:
        dtype = np.dtype(_dtype(values.type))
        out = (np.frombuffer(values.buffers()[1], dtype, count=n,
                             offset=start * dtype.itemsize) if n else np.empty(0, dtype))
    if values.null_count:
        out = out.copy()
        out[~_bits(values.buffers()[0], start, n)] = null
    return out


def _bits(buffer: pa.Buffer | None, start: int, n: int) -> np.ndarray:
    """Bits `start` to `start + n` of a bitmap (all set if there is none)."""
    if buffer is None:
        return np.ones(n, np.bool_)
    if n == 0:
        return np.zeros(0, np.bool_)
    return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[
        start:start + n].astype(np.bool_)


Rows = TypeVar("Rows", pa.Table, pa.RecordBatch)


def gathered(items: Iterable[Rows], rows: int) -> Iterator[list[Rows]]:
    """`items` (tables or batches) in lists of at least `rows` rows each, as they come,
    the last one of fewer (none if there are no items)."""
    pending: list[Rows] = []
    held = 0
    for item in items:
        pending.append(item)
        held += item.num_rows
        if held >= rows:
            yield pending
            pending, held = [], 0
    if pending:
        yield pending
