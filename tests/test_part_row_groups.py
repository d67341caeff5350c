"""A metric part's row groups end where its key changes (once they hold enough rows), so
that a query for one key, its filter pushed down to the row groups' statistics, reads
that key's rows and little else; and the views push such filters down."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tracklake
from tracklake._format.part import KEY_GROUP_MIN_ROWS, ROW_GROUP_ROWS, key_row_groups


def _check_groups(groups: list[pa.Table], rows: int) -> None:
    assert sum(g.num_rows for g in groups) == rows
    for i, group in enumerate(groups):
        assert 0 < group.num_rows <= ROW_GROUP_ROWS
        keys = _texts(group.column("key"))
        # inside a group, the key changes only while it holds fewer than the minimum
        # (NumPy over the rows: a Python loop took 15 s for a seed's 18 M rows)
        changes = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        assert (changes < KEY_GROUP_MIN_ROWS).all(), (i, changes[-1:])
        if i + 1 < len(groups):  # it ended at a key change, or full
            following = groups[i + 1].column("key")[0].as_py()
            assert group.num_rows == ROW_GROUP_ROWS or keys[-1] != following


def _texts(column: pa.ChunkedArray) -> np.ndarray:
    """The values of a string column (dictionary-encoded or not) as a NumPy array."""
    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return np.asarray(array.to_numpy(zero_copy_only=False))


@pytest.mark.parametrize("seed", range(12))
def test_row_groups_end_where_the_key_changes_whatever_the_chunks(seed: int) -> None:
    rng = random.Random(seed)
    counts = [rng.choice([1, 7, 3000, KEY_GROUP_MIN_ROWS, 40_000, 300_000])
              for _ in range(rng.choice([1, 2, 9, 60]))]
    keys = np.repeat([f"k{i:03d}" for i in range(len(counts))], counts)
    table = pa.table({"key": pa.array(keys), "step": np.arange(len(keys))})
    if seed % 2:
        table = table.set_column(0, "key", table.column("key").dictionary_encode())
    cuts = sorted(rng.sample(range(1, len(keys)), min(len(keys) - 1, rng.choice([0, 3, 40]))))
    chunks = [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, len(keys)],
                                                    strict=True)]
    groups = list(key_row_groups(chunks))
    _check_groups(groups, len(keys))
    # each group one chunk: Parquet's writer pays per chunk it is handed
    assert all(g.column(c).num_chunks == 1 for g in groups for c in range(g.num_columns))
    steps = pa.concat_tables(groups).column("step").to_numpy()
    assert np.array_equal(steps, np.arange(len(keys)))


def test_a_compacted_part_has_a_row_group_per_key_of_many_steps(root: Path) -> None:
    steps = 3 * KEY_GROUP_MIN_ROWS // 2
    rng = np.random.default_rng(7)
    with tracklake.init(project="p", run_id="long", root=root, capture_identity=False) as run:
        for step, row in enumerate(rng.random((steps, 4)).tolist()):
            run.log({"a": row[0], "b": row[1], "c": row[2], "d": row[3]}, step=step)
    tracklake.compact(root=root)
    (part,) = sorted((root / "metrics").rglob("*.parquet"))
    meta = pq.ParquetFile(part).metadata
    key = meta.schema.to_arrow_schema().get_field_index("key")
    spans = [(meta.row_group(i).column(key).statistics.min,
              meta.row_group(i).column(key).statistics.max,
              meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    assert spans == [(k, k, steps) for k in "abcd"]
    # the view pushes a filter on the key down to the dataset: DuckDB shows it at the scan
    plan = tracklake.query("EXPLAIN SELECT max(value) FROM metrics WHERE key = 'c'",
                           root=root).column(1)[0].as_py()
    assert "Filters:" in plan and "'c'" in plan.split("Filters:")[1], plan
    got = tracklake.query("SELECT count(*) AS n, max(step) AS last FROM metrics "
                          "WHERE key = 'c'", root=root).to_pylist()
    assert got == [{"n": steps, "last": steps - 1}]
