"""`columns` builds and reads arrays as pyarrow's own conversions do (`pa.array`,
`pa.Table.from_pylist`, `to_numpy`), nulls, offsets and slices included, refuses values
that do not fit, and never loads pandas."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracklake._format.columns import (
    booleans,
    column,
    combined,
    empty_batch,
    gathered,
    numpy_of,
    rows_table,
    scalar_of,
    strings,
)

_INTS = {pa.int32(): 32, pa.int64(): 64}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(_INTS)), st.data())
def test_integers_with_nulls_are_what_pa_array_makes(t: pa.DataType, data: Any) -> None:
    bits = _INTS[t]
    values = data.draw(st.lists(st.none() | st.integers(-(2 ** (bits - 1)),
                                                        2 ** (bits - 1) - 1)))
    made = column(values, t)
    made.validate(full=True)
    assert made.equals(pa.array(values, t))
    if None not in values:
        assert numpy_of(made).tolist() == values
    start = data.draw(st.integers(0, len(values)))
    assert numpy_of(made.slice(start), null=0).tolist() == [
        0 if v is None else v for v in values[start:]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.floats(allow_nan=True)), st.integers(0, 5))
def test_floats_and_booleans_are_what_pa_array_makes(values: list[Any], start: int) -> None:
    made = column(values, pa.float64())
    made.validate(full=True)
    assert repr(made.to_pylist()) == repr(pa.array(values, pa.float64()).to_pylist())  # NaN
    assert made.null_count == values.count(None)
    flags = [None if v is None else bool(v == v and v > 0) for v in values]
    made_flags = column(flags, pa.bool_())
    made_flags.validate(full=True)
    assert made_flags.equals(pa.array(flags, pa.bool_()))
    assert numpy_of(made_flags.slice(start), null=False).tolist() == [
        bool(f) for f in flags[start:]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.text()), st.sampled_from([pa.string(), pa.large_string()]))
def test_strings_with_nulls_are_what_pa_array_makes(values: list[Any],
                                                    t: pa.DataType) -> None:
    made = strings(values, t)
    made.validate(full=True)
    assert made.equals(pa.array(values, t))


@pytest.mark.parametrize(("values", "t", "error"), [
    ([2 ** 31], pa.int32(), OverflowError),
    ([2 ** 64], pa.int64(), OverflowError),
    (["x"], pa.int64(), ValueError),
    ([b"bytes"], pa.string(), TypeError),
    ([1], pa.string(), TypeError),
    ([None], pa.list_(pa.string()), None),
    (["not a mapping"], pa.struct([("a", pa.int64())]), TypeError),
])
def test_what_does_not_fit_its_type_is_refused(values: list[Any], t: pa.DataType,
                                               error: type[Exception] | None) -> None:
    if error is None:  # a null list is a null
        assert column(values, t).to_pylist() == [None]
        return
    with pytest.raises(error):
        column(values, t)


def test_numpy_of_chunks_timestamps_and_nulls() -> None:
    chunked = pa.chunked_array([pa.array([1, 2], pa.int64()), pa.array([3], pa.int64())])
    assert numpy_of(chunked).tolist() == [1, 2, 3]
    assert numpy_of(pa.chunked_array([], pa.int64())).tolist() == []
    assert numpy_of(pa.array([0, 10], pa.timestamp("us", "UTC"))).tolist() == [0, 10]
    assert numpy_of(pa.array([True, False, True])[1:]).tolist() == [False, True]
    with pytest.raises(ValueError, match="1 nulls"):
        numpy_of(pa.array([1, None], pa.int64()))
    with pytest.raises(TypeError, match="no NumPy form"):
        numpy_of(pa.array(["a"]))
    assert len(combined(pa.chunked_array([], pa.list_(pa.string())))) == 0
    assert scalar_of("x", pa.string()).equals(pa.scalar("x", pa.string()))
    import numpy as np

    assert booleans(np.array([True, False])).to_pylist() == [True, False]


def test_rows_of_nested_lists_and_structs_are_what_from_pylist_makes() -> None:
    part = pa.struct([("path", pa.string()), ("first_seq", pa.int64())])
    schema = pa.schema([("run", pa.string()), ("tags", pa.list_(pa.string())),
                        ("parts", pa.list_(part)), ("ok", pa.bool_()),
                        ("rank", pa.int32()), ("ids", pa.list_(pa.int64()))])
    rows = [{"run": "a", "tags": ["x", "y"], "parts": [{"path": "p", "first_seq": 0}],
             "ok": True, "rank": 0, "ids": [1, 2]},
            {"run": None, "tags": [], "parts": [{"path": "q"}, {"first_seq": 2 ** 40}]},
            {"run": "ü", "tags": ["z"], "parts": [], "ok": False, "rank": 3, "ids": []}]
    made = rows_table(schema, rows)
    made.validate(full=True)
    assert made.equals(pa.Table.from_pylist(rows, schema))
    assert rows_table(schema, []).equals(pa.Table.from_pylist([], schema))
    assert empty_batch(schema).num_rows == 0 and empty_batch(schema).schema == schema


def test_nothing_here_loads_pandas() -> None:
    import subprocess
    import sys

    code = """
import sys, numpy as np, pyarrow as pa
from tracklake._format.columns import column, fixed, numpy_of, rows_table, scalar_of
numpy_of(column([1, None], pa.int64()), null=0)
numpy_of(fixed(np.arange(3), pa.int32()))
scalar_of("a", pa.string())
rows_table(pa.schema([("a", pa.list_(pa.string())), ("b", pa.bool_())]), [{"a": ["x"]}])
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_gathered_lists_hold_at_least_the_rows_asked_but_the_last() -> None:
    tables = [pa.table({"x": list(range(n))}) for n in (3, 0, 5, 1, 1, 7, 2)]
    lists = list(gathered(tables, 6))
    assert [[t.num_rows for t in group] for group in lists] == [[3, 0, 5], [1, 1, 7], [2]]
    assert [t for group in lists for t in group] == tables  # each once, in order
    assert list(gathered([], 6)) == []
    assert [len(g) for g in gathered(tables, 1)] == [1, 2, 1, 1, 1, 1]
