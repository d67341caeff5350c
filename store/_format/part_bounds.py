"""Reading a compacted part within a bound on what it decodes to.

A part is input from outside: Parquet's compression and its dictionary and run-length
encodings let a few kilobytes stand for gigabytes (a thousand strings of a megabyte of
one letter, each compressed to a hundred bytes; one long string referenced by every
row). What its footer says its pages take uncompressed is therefore judged before any
page is read (`declared_bytes`): pyarrow decompresses a whole column chunk even to give
a batch of 16 rows. Its strings are read dictionary-encoded, as Parquet holds them; what
they decode to is computed from the dictionary's lengths and the indices, and the rows
are decoded only while the total stays within `part_read_limit()`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError, StoreError
from tracklake._format.bounded_json import quarter_of_memory
from tracklake._format.page_headers import pages_total

#: The environment variable that sets the most bytes one part may decode to when
#: tracklake reads it (a size such as "8GiB"); by default a quarter of this machine's
#: memory, at least 1 GiB.
PART_LIMIT_ENV = "TRACKLAKE_PART_READ_LIMIT"
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 0, "kib": 10, "mib": 20, "gib": 30, "tib": 40}


def env_size(name: str) -> int | None:
    """The size in environment variable `name` (``8GiB``, ``512MiB``, ``4096``), None if
    unset; StoreError naming the variable if it is not a size (a setting to mend, not a
    damaged file: no part is left out over it)."""
    given = os.environ.get(name, "").strip()
    if not given:
        return None
    m = _SIZE.match(given)
    if m is None:
        raise StoreError(f"{name}={given!r} is not a size such as '8GiB'")
    return int(m.group(1)) << _UNITS[(m.group(2) or "b").lower()]


def part_read_limit() -> int:
    """The most bytes one part may decode to when it is read: $TRACKLAKE_PART_READ_LIMIT,
    else a quarter of this machine's memory (at least 1 GiB)."""
    given = env_size(PART_LIMIT_ENV)
    return quarter_of_memory() if given is None else given


def string_columns(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_binary(f.type)]


def declared_bytes(meta: Any) -> int:
    """What the row groups of a part's footer (a `FileMetaData`) say their pages take
    uncompressed: what reading them decompresses, before any dictionary is decoded. Every
    Parquet writer states it; a footer crafted to understate it is caught once read, by
    `decoded_bytes`."""
    return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


def check_declared(meta: Any, where: object, limit: int) -> None:
    """`too_big` if `meta`'s row groups say they decompress to more than `limit`."""
    if declared_bytes(meta) > limit:
        raise too_big(where, limit)


def check_pages(f: IO[bytes], where: object, limit: int, footer: bytes | None = None
                ) -> None:
    """`too_big` if the pages of the open Parquet file `f` (footer bytes `footer`, if
    read already) say in their own headers, which pyarrow allocates by, that they
    decompress to more than `limit`: a footer may understate it (`declared_bytes`)."""
    if pages_total(f, where, footer) > limit:
        raise too_big(where, limit)


def decoded_bytes(batch: pa.RecordBatch | pa.Table) -> int:
    """What `batch` holds once its dictionary-encoded columns are decoded."""
    total = 0
    for column in batch.columns:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        for chunk in chunks:
            if isinstance(chunk, pa.DictionaryArray):
                lengths = pc.take(pc.binary_length(chunk.dictionary), chunk.indices)
                total += (pc.sum(lengths).as_py() or 0) + 4 * len(chunk)
            else:
                total += chunk.nbytes
    return total


def plain(table: Any) -> Any:
    """`table` (a Table or RecordBatch) with its dictionary-encoded columns decoded."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            column = table.column(i)
            if isinstance(column, pa.ChunkedArray):
                decoded: Any = pa.chunked_array([c.dictionary_decode() for c in column.chunks],
                                                field.type.value_type)
            else:
                decoded = column.dictionary_decode()
            table = table.set_column(i, field.with_type(field.type.value_type), decoded)
    return table


def too_big(where: object, limit: int) -> FormatError:
    return FormatError(
        f"{where}: damaged Parquet part: its records decode to more than {limit} bytes, "
        f"the most a part may (a crafted file?); if it is trusted, set {PART_LIMIT_ENV} "
        "higher")


def bounded_batches(encoded: Any, where: object, batch_rows: int,
                    limit: int | None = None) -> Iterator[pa.RecordBatch]:
    """The batches of `encoded` (a ParquetFile opened with its strings read as
    dictionaries), decoded, while their total stays within `limit`."""
    limit = part_read_limit() if limit is None else limit
    total = 0
    if encoded.metadata.num_rows * 8 * max(encoded.metadata.num_columns, 1) > limit:
        raise too_big(where, limit)
    check_declared(encoded.metadata, where, limit)
    for batch in encoded.iter_batches(batch_size=batch_rows):
        total += decoded_bytes(batch)
        if total > limit:
            raise too_big(where, limit)
        yield plain(batch)


def bounded_table(encoded: Any, where: object, limit: int | None = None) -> pa.Table:
    """Every row of `encoded` (see `bounded_batches`), refused beyond `limit` before its
    strings are decoded."""
    limit = part_read_limit() if limit is None else limit
    check_declared(encoded.metadata, where, limit)
    groups = []
    total = 0
    width = 8 * max(encoded.metadata.num_columns, 1)  # the most a row of fixed-width
    for i in range(encoded.metadata.num_row_groups):  # values and indices may take
        if encoded.metadata.row_group(i).num_rows * width > limit:
            raise too_big(where, limit)  # rows that run-length encoding made from nothing
        group = encoded.read_row_group(i)
        total += decoded_bytes(group)
        if total > limit:
            raise too_big(where, limit)
        groups.append(group)
    if not groups:
        return plain(encoded.read())
    return pa.concat_tables([plain(g) for g in groups])
