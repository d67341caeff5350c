"""Reading Parquet page headers ourselves (Thrift's compact protocol): exactly as long as
the writers make them, and bounded on bytes crafted to make a reader loop, recurse or
allocate."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tracklake
from tracklake._format.page_headers import (
    _struct,
    chunk_ranges,
    footer_span,
    page_header,
    pages_total,
)
from tracklake._format.part import open_part


def _table(rows: int = 120_000) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({
        "i": rng.integers(0, 50, rows), "f": rng.random(rows),
        "s": pa.array([f"v{i % 300}" for i in range(rows)]),
        "b": pa.array([i % 3 == 0 for i in range(rows)]),
        "l": pa.array([[i, None] for i in range(rows)]),
        "m": pa.array([{"k": i, "t": None if i % 5 else "x"} for i in range(rows)]),
    })


@pytest.mark.parametrize("options", [
    {}, {"compression": "zstd"}, {"use_dictionary": False}, {"data_page_version": "2.0"},
    {"write_statistics": False}, {"write_page_index": True, "row_group_size": 20_000},
    {"write_page_checksum": True, "compression": "snappy", "data_page_size": 4096},
], ids=repr)
def test_every_page_of_a_pyarrow_file_is_walked_to_its_chunks_end(
        tmp_path: Path, options: dict[str, object]) -> None:
    """Each chunk's pages, header by header, fill exactly its `total_compressed_size`
    and, headers included, add up to its `total_uncompressed_size`: a header length read
    wrong by one byte would desynchronise the walk and fail both."""
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, **options)  # type: ignore[arg-type]
    _walks_exactly(path)


def test_every_page_of_a_duckdb_file_is_walked(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    duckdb.sql(f"COPY (SELECT range AS a, 'x' || (range % 77) AS s, random() AS f "
               f"FROM range(500000)) TO '{path}' (FORMAT parquet)")
    _walks_exactly(path)


def _walks_exactly(path: Path) -> None:
    meta = pq.read_metadata(path)
    data = path.read_bytes()
    with path.open("rb") as f:
        offset, length = footer_span(f, len(data))
    ranges = chunk_ranges(data[offset:offset + length])
    chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups)
              for c in range(meta.row_group(g).num_columns)]
    assert len(ranges) == len(chunks)  # read from the footer's bytes as pyarrow does
    uncompressed_total = 0
    for (start, end), chunk in zip(ranges, chunks, strict=True):
        expected = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < expected:
            expected = chunk.dictionary_page_offset
        assert (start, end) == (expected, expected + chunk.total_compressed_size)
        pos, pages, uncompressed = start, 0, 0
        while pos < end:
            size, stored, length = page_header(memoryview(data)[pos:end])
            walked = {2: -1, 3: -1}  # the same by the field-by-field walk
            assert _struct(data[pos:end], 0, 0, walked) == length
            assert (walked[2], walked[3]) == (size, stored)
            uncompressed += size + length
            pos += length + stored
            pages += 1
        assert pos == end and pages >= 1
        assert uncompressed == chunk.total_uncompressed_size
        uncompressed_total += uncompressed
    with path.open("rb") as f:
        walked_total = pages_total(f, path)
    assert 0 < walked_total < uncompressed_total  # the pages alone, without their headers


def _sizes(uncompressed: int, compressed: int) -> bytes:
    """Fields 1 to 3 of a page header: DATA_PAGE, then the two sizes (zigzag varints)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes([*out, n])
    return b"\x15\x00\x15" + varint(2 * uncompressed) + b"\x15" + varint(2 * compressed)


@pytest.mark.parametrize(("crafted", "why"), [
    (_sizes(10, 5)[:4], "cut short"),
    (_sizes(10, 5) + b"\x19\xf5" + b"\xff" * 5 + b"\x01", "a list of 2^40 values, 0 there"),
    (_sizes(10, 5) + b"\x1c" * 10_000, "structs nested 10,000 deep"),
    (_sizes(10, 5) + b"\x19" + b"\x99" * 10_000, "lists of lists 10,000 deep"),
    (_sizes(10, 5) + b"\x1b\xff\xff\xff\xff\x0f\x55", "a map of 2^32 entries, 0 there"),
    (_sizes(10, 5) + b"\x18" + b"\xff" * 11, "a varint of 11 bytes"),
    (_sizes(10, 5) + b"\x1d", "a field of type 13"),
    (b"\x15\x00\x15\x13\x00", "a negative size"),
    (b"\x15\x00\x00", "no compressed size"),
    (b"\x15\x00\x15\x13\x15\x02\x2c\x15\x02\x00\x00", "a negative size, usual shape"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_crafted_header_is_refused_at_once(crafted: bytes, why: str) -> None:
    """Each is refused by what is there, not by what it claims: a count of 2^40 ends
    where the bytes do, nesting 10,000 deep at the depth bound (not in a RecursionError,
    which is no ValueError)."""
    with pytest.raises(ValueError, match=r"."):  # a RecursionError is none: it fails
        page_header(crafted)


def test_a_part_whose_first_page_header_is_garbage_is_named_damaged(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root) as run:
        for step in range(50):
            run.log({"x": float(step)}, step=step)
    tracklake.compact(root=root)
    [part] = root.glob("metrics/**/part-*.parquet")
    meta = pq.read_metadata(part)
    at = meta.row_group(0).column(0).data_page_offset
    if meta.row_group(0).column(0).has_dictionary_page:
        at = min(at, meta.row_group(0).column(0).dictionary_page_offset)
    data = bytearray(part.read_bytes())
    data[at:at + 4] = b"\x1d\x1d\x1d\x1d"  # unknown types
    part.write_bytes(bytes(data))
    with pytest.raises(tracklake.FormatError,
                       match=rf"{part.name}.*page header at byte {at} does not decode"):
        open_part(part)


def test_a_chunk_of_no_values_is_not_walked(tmp_path: Path) -> None:
    """pyarrow writes an empty table's column chunk with its data page offset 0 (the
    file's magic) and reads no page of it: walking from there refused an honest file."""
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), path)
    assert pq.read_metadata(path).row_group(0).column(0).data_page_offset == 0
    assert pq.read_table(path).num_rows == 0
    with path.open("rb") as f:
        assert pages_total(f, path) == 0
