"""What a format 1.1 part declares is true (its sort order, its page index, its types), its
metadata and metric summary are stored once, and live segments carry a name that Hive
discovery skips while format 1.0's names are still read."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracklake
from tracklake._format import (
    SCHEMAS,
    parse_part_name,
    parse_segment_name,
    part_name,
    segment_name,
)
from tracklake._format.part import (
    PAYLOAD_COLUMNS,
    SUMMARY_KEY,
    SUMMARY_MAX_SHARE,
    open_part,
    summary_rows,
)
from tracklake._format.schema import FORMAT_VERSION, PART_ORDER


def _every_kind(root: Path, run_id: str = "r") -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                        config={"lr": 0.1}) as run:
        for step in (3, 1, 2):  # logged out of step order: the part still sorts by step
            run.log({"b": float(step), "a": -float(step)}, step=step)
        run.log({"a": 9.0}, step=1)  # a second value at step 1
        run.log_text("note", "hello")
        run.log_generations([("q", "a", 1.0)], step=2)
        with run.span("rollout", step=1, token_ids=[1, 2]):
            pass
        run.log_artifact(b"bytes", name="blob.bin")
        run.alert("title", "text")
        run.log_histogram("weights", [1.0, 2.0, 2.5], step=2, bins=2)
        run.log_image("image", b"GIF89a" + bytes(20), step=2)
    tracklake.compact(root=root)


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[-8 - length : -8]


def _parts(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).parts[0]: p for p in root.rglob("*.parquet")}


def test_every_kind_declares_the_order_its_rows_really_have(root: Path) -> None:
    _every_kind(root)
    parts = _parts(root)
    assert set(parts) == set(SCHEMAS)
    for kind, path in parts.items():
        f = pq.ParquetFile(path)
        names = f.schema_arrow.names
        declared = f.metadata.row_group(0).sorting_columns
        assert [names[c.column_index] for c in declared] == list(PART_ORDER[kind])
        assert not any(c.descending or c.nulls_first for c in declared)
        table = f.read()
        order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in PART_ORDER[kind]])
        assert order.to_pylist() == list(range(table.num_rows)), kind


def test_every_column_chunk_has_a_page_index(root: Path) -> None:
    _every_kind(root)
    for path in _parts(root).values():
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                chunk = meta.row_group(g).column(c)
                name = meta.schema.column(c).path.split(".")[0]
                assert chunk.has_offset_index, (path, name)
                # free text has no statistics, so no column index (nothing to prune by)
                assert chunk.has_column_index == (name not in PAYLOAD_COLUMNS), (path, name)


def test_parts_read_back_as_the_record_schemas_with_their_metadata_once(root: Path) -> None:
    _every_kind(root)
    for kind, path in _parts(root).items():
        parquet = open_part(path)  # its footer checksum verified
        raw = parquet.metadata.metadata
        assert b"ARROW:schema" not in raw  # no base64 second copy of the metadata
        assert raw[b"tracklake.format"] == FORMAT_VERSION.encode()
        assert parquet.schema_arrow.remove_metadata().equals(SCHEMAS[kind]), kind
        footer = _footer(path)
        assert footer.count(b"tracklake.kind") == 1
        if kind == "metrics":
            # five values: a summary would outweigh them, so it is computed from the rows
            assert SUMMARY_KEY.encode() not in raw
            rows = {r["key"]: r for r in summary_rows(parquet, path)}
            assert rows["a"]["last_value"] == -3.0 and rows["a"]["count"] == 4


def test_a_summary_worth_its_bytes_is_stored_once(root: Path) -> None:
    with tracklake.init(project="p", run_id="long", root=root, capture_identity=False,
                        compact=False) as run:
        values = random.Random(0)  # values that do not compress: pages far above the summary
        for step in range(2000):
            run.log({f"group/key-{n:02d}": values.random() for n in range(16)}, step=step)
    tracklake.compact(root=root)
    (path,) = root.glob("metrics/**/*.parquet")
    summary = pq.ParquetFile(path).metadata.metadata[SUMMARY_KEY.encode()]
    assert len(json.loads(summary)) == 16
    footer = _footer(path)
    assert footer.count(b'"last_time_us"') == 16
    # the summary once plus the schema, statistics and offsets of five columns
    assert len(footer) < len(summary) + 4096, (len(footer), len(summary))
    assert len(summary) <= SUMMARY_MAX_SHARE * path.stat().st_size


def test_a_part_of_1000_keys_and_few_steps_carries_no_summary_and_is_smaller(root: Path
                                                                            ) -> None:
    with tracklake.init(project="p", run_id="wide", root=root, capture_identity=False) as run:
        for step in range(3):
            run.log({f"group/key-{n:04d}": n + step / 10 for n in range(1000)}, step=step)
    live = sum(p.stat().st_size for p in root.glob("metrics/**/*.arrows"))
    tracklake.compact(root=root)
    (path,) = root.glob("metrics/**/*.parquet")
    assert SUMMARY_KEY.encode() not in pq.ParquetFile(path).metadata.metadata
    assert path.stat().st_size <= live, (path.stat().st_size, live)
    answer = tracklake.query(
        "SELECT count(*) AS keys, sum(count) AS n, max(last_value) AS top "
        "FROM metric_summaries", root=root).to_pylist()
    assert answer == [{"keys": 1000, "n": 3000, "top": 999.2}]


def test_a_key_spelled_like_the_checksum_placeholder_is_compacted_and_read(root: Path
                                                                          ) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        run.log({"##########": 1.0, "a#b": 2.0}, step=0)
    report = tracklake.compact(root=root)
    assert report.parts_written
    (path,) = root.glob("metrics/**/*.parquet")
    rows = summary_rows(open_part(path), path)
    assert sorted(r["key"] for r in rows) == ["##########", "a#b"]
    answer = tracklake.query("SELECT key, last_value FROM metric_summaries ORDER BY key",
                             root=root).to_pylist()
    assert answer == [{"key": "##########", "last_value": 1.0},
                      {"key": "a#b", "last_value": 2.0}]


def test_compaction_makes_a_run_of_a_few_thousand_values_smaller(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step in range(200):
            run.log({f"k{n}": step * 0.5 + n for n in range(16)}, step=step)
    live = sum(p.stat().st_size for p in root.glob("metrics/**/*.arrows"))
    tracklake.compact(root=root)
    compacted = sum(p.stat().st_size for p in root.glob("metrics/**/*.parquet"))
    assert not list(root.glob("metrics/**/*.arrows"))
    assert compacted < live, (compacted, live)


@pytest.mark.parametrize(("name", "expected"), [
    ("_seg-000003-000000000042.arrows", (3, 42)),
    ("seg-000003-000000000042.arrows", (3, 42)),  # format 1.0
    ("__seg-000003-000000000042.arrows", None),
    (".seg-000003-000000000042.arrows", None),
    ("_seg-3-42.arrows", None),
])
def test_segment_names_of_both_versions_are_read(name: str, expected: Any) -> None:
    assert parse_segment_name(name) == expected


def test_segments_are_named_so_that_hive_discovery_skips_them(tmp_path: Path) -> None:
    name = segment_name(7, 1234)
    assert name.startswith("_") and parse_segment_name(name) == (7, 1234)
    directory = tmp_path / "run=0042"
    directory.mkdir()
    pq.write_table(pa.table({"x": [1]}), directory / "part.parquet")
    (directory / name).write_bytes(b"not parquet: an Arrow IPC stream being written")
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 1


@given(number=st.integers(0, 999_999), first_seq=st.integers(0, 10**12 - 1))
def test_a_segment_name_parses_back_in_both_spellings(number: int, first_seq: int) -> None:
    name = segment_name(number, first_seq)
    assert parse_segment_name(name) == (number, first_seq)
    assert parse_segment_name(name.removeprefix("_")) == (number, first_seq)  # format 1.0


def test_numbers_wider_than_their_padding_still_name_a_file() -> None:
    assert parse_segment_name(segment_name(1_000_000, 10**12)) == (1_000_000, 10**12)
    assert parse_part_name(part_name(10**12, 10**13, 1_000_000)) == (
        10**12, 10**13, 1_000_000)
