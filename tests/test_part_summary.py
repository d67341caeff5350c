"""A metric part written without a summary answers every summary question exactly as the
stored summary (compaction's DuckDB SQL) would: NaN, infinities, a key logged twice at one
step, steps out of order, keys that sort differently as text and as bytes."""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracklake
from tracklake._format import SCHEMAS
from tracklake._format import part as part_module
from tracklake._format.part import SUMMARY_KEY, open_part, summary_rows
from tracklake._format.part_summary import rows_of, summary_columns
from tracklake._ops.compact import metric_summary

_T0 = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)
_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                    st.sampled_from([math.nan, -0.0, 0.0, 1e308]))
_KEYS = st.sampled_from(["a", "B", "é", "z/x", "a b", "Ä", "k" * 200])


def _summary_from_rows(table: pa.Table) -> list[dict[str, Any]]:
    return rows_of(summary_columns(table))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def _assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [r["key"] for r in got] == [r["key"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        assert all(_same(g[f], w[f]) for f in w), (g, w)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(_KEYS, st.integers(0, 5), _VALUES), min_size=1, max_size=40))
def test_rows_give_the_summary_compaction_would_store(rows: list[tuple[str, int, float]]
                                                      ) -> None:
    table = pa.table({
        "seq": list(range(len(rows))),
        "time": [_T0 + _dt.timedelta(microseconds=i * 3) for i in range(len(rows))],
        "step": [r[1] for r in rows], "key": [r[0] for r in rows],
        "value": [r[2] for r in rows]}, schema=SCHEMAS["metrics"])
    want = metric_summary(table)
    _assert_same(_summary_from_rows(table), want)
    # in part order already (as compaction writes parts), and with keys read back
    # dictionary-encoded: summarised without sorting again, the same
    ordered = table.take(pc.sort_indices(table, sort_keys=[
        ("key", "ascending"), ("step", "ascending"), ("seq", "ascending")]))
    _assert_same(_summary_from_rows(ordered), want)
    encoded = ordered.set_column(3, "key", pc.dictionary_encode(ordered.column("key")))
    _assert_same(_summary_from_rows(encoded), want)


def test_an_empty_table_has_no_summary() -> None:
    assert _summary_from_rows(SCHEMAS["metrics"].empty_table()) == []


def test_a_small_part_is_summarised_from_its_rows_by_every_reader(root: Path) -> None:
    with tracklake.init(project="p", run_id="0042", root=root, capture_identity=False) as run:
        run.log({"loss": 2.0, "acc": math.nan}, step=0)
        run.log({"loss": 1.0}, step=1)
        run.log({"loss": 3.0}, step=1)  # twice at one step: the later seq is the last
    tracklake.compact(root=root)
    (path,) = root.glob("metrics/**/*.parquet")
    assert SUMMARY_KEY.encode() not in pq.ParquetFile(path).metadata.metadata
    rows = {r["key"]: r for r in summary_rows(open_part(path), path)}
    assert rows["loss"]["last_value"] == 3.0 and rows["loss"]["count"] == 3
    assert math.isnan(rows["acc"]["max"]) and math.isnan(rows["acc"]["min"])
    answer = tracklake.query("SELECT run, key, count, last_value, last_step FROM "
                             "metric_summaries WHERE key = 'loss'", root=root).to_pylist()
    assert answer == [{"run": "0042", "key": "loss", "count": 3, "last_value": 3.0,
                       "last_step": 1}]


def test_a_small_part_whose_pages_are_damaged_is_named(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step in range(5):
            run.log({"loss": float(step)}, step=step)
    tracklake.compact(root=root)
    (path,) = root.glob("metrics/**/*.parquet")
    data = bytearray(path.read_bytes())
    data[4 + 40] ^= 0xFF  # a byte of the first data page (its checksum no longer matches)
    path.write_bytes(bytes(data))
    with pytest.raises(tracklake.FormatError, match=re.escape(str(path))):
        summary_rows(open_part(path), path)


def test_a_part_written_without_a_summary_is_not_summarised_again_by_its_writer(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tracklake compact` catalogs what it compacted: the summary of a part too wide for
    its footer comes from what the writer summarised, the same as from the rows, and only
    while the file stays as written."""
    keys = ["a", "B", "é", "Ä", "z/x", "a b", *(f"k{i}" for i in range(300))]
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        compact=False, system_metrics=False) as run:
        for step in range(3):
            run.log({k: (math.nan if (i + step) % 7 == 0 else float(i * step))
                     for i, k in enumerate(keys)}, step=step)
        run.log({"a": -1.0}, step=2)  # twice at one step: the later is the last value
    tracklake.compact(root=root)
    (path,) = root.glob("metrics/**/*.parquet")
    assert SUMMARY_KEY.encode() not in pq.ParquetFile(path).metadata.metadata
    from_rows = _summary_from_rows(pq.read_table(path))
    read: list[Path] = []
    bounded = part_module.bounded_table
    monkeypatch.setattr(part_module, "bounded_table",
                        lambda parquet, p: read.append(p) or bounded(parquet, p))
    _assert_same(summary_rows(open_part(path), path), from_rows)
    assert read == []  # the writer's own summary
    answer = tracklake.query("SELECT key, count, last_value FROM metric_summaries "
                             "WHERE key = 'a'", root=root).to_pylist()
    assert answer == [{"key": "a", "count": 4, "last_value": -1.0}]
    os.utime(path)  # no longer the file as written: summarised from its rows again
    _assert_same(summary_rows(open_part(path), path), from_rows)
    assert read == [path]
