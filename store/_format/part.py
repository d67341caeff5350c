"""Integrity of compacted Parquet parts: page checksums and a checksum of the footer.

Parquet's page checksums (CRC-32 of each page as stored) cover the column data; the
footer (schema, row-group statistics, offsets and tracklake's metadata such as the metric
summary) has none. So a part also carries, in its key-value metadata, the CRC-32 of its
footer (the thrift FileMetaData), computed while the ten digits read ``##########`` and
written over them afterwards, as segments do for their batches. See docs/format.md.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._errors import FormatError
from tracklake._format.files import fsync_file
from tracklake._format.schema import check_version

#: Key-value metadata key holding the footer's CRC-32 (10 decimal digits).
FOOTER_CRC_KEY = "tracklake.footer_crc32"
_PLACEHOLDER = b"##########"
_MAGIC = b"PAR1"
#: What pyarrow raises for bytes that do not decode as Parquet.
_DECODE_ERRORS = (pa.ArrowException, OSError, ValueError, EOFError)


def _footer_span(f: Any, size: int) -> tuple[int, int]:
    """(offset, length) of the thrift footer of the open Parquet file `f` of `size` bytes."""
    if size < 12:
        raise FormatError("too short to be a Parquet file")
    f.seek(size - 8)
    tail = f.read(8)
    if tail[4:] != _MAGIC:
        raise FormatError("no Parquet end marker (the file is truncated or not Parquet)")
    length = int.from_bytes(tail[:4], "little")
    if length > size - 12:
        raise FormatError("footer length points outside the file (truncated?)")
    return size - 8 - length, length


def stamp_footer_crc(path: Path) -> None:
    """Write the footer's CRC-32 over the placeholder left in its metadata (before fsync)."""
    with open(path, "r+b") as f:
        offset, length = _footer_span(f, os.fstat(f.fileno()).st_size)
        f.seek(offset)
        footer = bytearray(f.read(length))
        at = footer.find(_PLACEHOLDER)
        if at < 0 or footer.find(_PLACEHOLDER, at + 1) >= 0:
            raise FormatError(f"{path}: expected one footer checksum placeholder")
        f.seek(offset + at)
        f.write(b"%010d" % zlib.crc32(footer))


#: Rows per Parquet row group: small enough that a query for one key of a part sorted by
#: key skips most of it by the row groups' statistics (benchmarks/sql_scale.py).
ROW_GROUP_ROWS = 1 << 17


def write_part_file(path: Path, table: pa.Table, kind: str) -> None:
    """Write a part's records (`table`, with its schema metadata) to `path` as every part
    is written: zstd, delta-encoded seq/time/step, byte-stream-split values, dictionary
    strings, statistics, page checksums and the footer's CRC-32; fsynced, not renamed."""
    import pyarrow.parquet as pq

    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           **{k.encode(): v.encode()
                                              for k, v in footer_placeholder().items()}})
    encodings = {"seq": "DELTA_BINARY_PACKED", "time": "DELTA_BINARY_PACKED"}
    if "step" in table.column_names:
        encodings["step"] = "DELTA_BINARY_PACKED"
    if kind == "metrics":
        encodings["value"] = "BYTE_STREAM_SPLIT"
    dictionary = [c for c in table.column_names if c not in encodings and c != "end_time"]
    pq.write_table(table, path, compression="zstd", compression_level=3,
                   use_dictionary=dictionary, column_encoding=encodings,
                   row_group_size=ROW_GROUP_ROWS, write_statistics=True,
                   write_page_checksum=True)
    stamp_footer_crc(path)
    fsync_file(path)


def footer_placeholder() -> dict[str, str]:
    """The metadata entry a part is written with, before `stamp_footer_crc`."""
    return {FOOTER_CRC_KEY: _PLACEHOLDER.decode()}


def _footer_crc_matches(footer: bytes, expected: bytes) -> bool:
    if len(expected) != len(_PLACEHOLDER) or not expected.isdigit():
        return False
    copy = bytearray(footer)
    at = copy.find(expected)
    while at != -1:
        copy[at : at + len(expected)] = _PLACEHOLDER
        if zlib.crc32(copy) == int(expected):
            return True
        copy[at : at + len(expected)] = expected
        at = copy.find(expected, at + 1)
    return False


def open_part(path: Path) -> Any:
    """A `pyarrow.parquet.ParquetFile` of a part whose footer is intact, reading with page
    checksums verified; `FormatError` naming the file (or `NewerFormatError`) otherwise.

    Parts written before footer checksums existed carry no `FOOTER_CRC_KEY`: their footer
    is only checked to decode.
    """
    import pyarrow.parquet as pq

    try:
        with path.open("rb") as f:  # a Path, or a path in an object store
            offset, length = _footer_span(f, f.seek(0, os.SEEK_END))
            f.seek(offset)
            footer = f.read(length)
        # a path in an object store carries its pyarrow file system
        parquet = pq.ParquetFile(getattr(path, "fs_path", path),
                                 filesystem=getattr(path, "filesystem", None),
                                 page_checksum_verification=True)
        raw = parquet.metadata.metadata or {}
    except FormatError as exc:
        raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc
    except FileNotFoundError:
        raise  # gone (compacted over, or pruned) since it was listed: not damage
    except _DECODE_ERRORS as exc:
        raise FormatError(f"{path}: damaged Parquet part: footer does not decode ({exc})"
                          ) from exc
    expected = raw.get(FOOTER_CRC_KEY.encode())
    if expected is not None and not _footer_crc_matches(footer, expected):
        raise FormatError(f"{path}: damaged Parquet part: footer checksum mismatch")
    version = raw.get(b"tracklake.format")
    check_version(version.decode(errors="replace") if version is not None else None, path)
    return parquet


def summary_rows(parquet: Any, path: Path) -> list[dict[str, Any]]:
    """The metric summary a part carries (one object per key), from a part opened with
    `open_part`; `FormatError` naming the file if it is not a list of objects."""
    import json

    raw = (parquet.metadata.metadata or {}).get(b"tracklake.summary")
    try:
        rows = json.loads(raw) if raw else []
    except ValueError as exc:
        raise FormatError(f"{path}: its metric summary is not JSON ({exc})") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FormatError(f"{path}: its metric summary is not a list of objects")
    return rows


def read_part_table(path: Path) -> pa.Table:
    """Every row of a part, its footer and page checksums verified (`FormatError` if not)."""
    parquet = open_part(path)
    try:
        return parquet.read()
    except _DECODE_ERRORS as exc:
        raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc
