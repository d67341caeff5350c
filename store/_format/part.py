"""Integrity of compacted Parquet parts: page checksums and a checksum of the footer.

Parquet's page checksums (CRC-32 of each page as stored) cover the column data; the
footer (schema, row-group statistics, offsets and tracklake's metadata such as the metric
summary) has none. So a part also carries, in its key-value metadata, the CRC-32 of its
footer (the thrift FileMetaData), computed while the ten digits read ``##########`` and
written over them afterwards, as segments do for their batches. See docs/format.md.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._errors import FormatError
from tracklake._format import bounded_json
from tracklake._format.bounded import touch
from tracklake._format.files import fsync_file
from tracklake._format.page_headers import footer_span
from tracklake._format.part_bounds import (
    bounded_table,
    check_declared,
    check_pages,
    declared_bytes,
    decoded_bytes,
    part_read_limit,
    plain,
    string_columns,
)
from tracklake._format.part_summary import SUMMARY_SCHEMA, rows_of, summary_columns
from tracklake._format.schema import PART_ORDER, check_version

#: Key-value metadata key holding a metric part's summary (a JSON list, one object per key).
SUMMARY_KEY = "tracklake.summary"
#: A metric part carries its summary only if the summary's JSON is at most this share of
#: the part's data pages. A small part's summary (about 140 bytes per key) would be
#: larger than its values, and a part larger than the segments it replaces; readers
#: compute such a part's summary from its rows (`summary_rows`), which then costs at most
#: a few times the bytes of the JSON it replaces.
SUMMARY_MAX_SHARE = 0.25
#: Key-value metadata key holding the footer's CRC-32 (10 decimal digits).
FOOTER_CRC_KEY = "tracklake.footer_crc32"
_PLACEHOLDER = b"##########"
#: The placeholder as the footer encodes it in its key-value entry (thrift compact protocol:
#: the key, field 2 of type binary, length 10, the value), so that the same ten characters
#: elsewhere in the footer (a metric key ``##########`` in the summary or in the key
#: column's statistics) are never taken for it.
_STAMPED_ENTRY = FOOTER_CRC_KEY.encode() + b"\x18\x0a" + _PLACEHOLDER
_MAGIC = b"PAR1"
#: What pyarrow raises for bytes that do not decode as Parquet.
_DECODE_ERRORS = (pa.ArrowException, OSError, ValueError, EOFError)


def stamp_footer_crc(path: Path) -> None:
    """Write the footer's CRC-32 over the placeholder left in its metadata (before fsync)."""
    with open(path, "r+b") as f:
        offset, length = footer_span(f, os.fstat(f.fileno()).st_size)
        f.seek(offset)
        footer = bytearray(f.read(length))
        at = footer.find(_STAMPED_ENTRY)
        if at < 0 or footer.find(_STAMPED_ENTRY, at + 1) >= 0:
            raise FormatError(f"{path}: expected one footer checksum placeholder")
        at += len(_STAMPED_ENTRY) - len(_PLACEHOLDER)
        f.seek(offset + at)
        f.write(b"%010d" % zlib.crc32(footer))


#: Rows per Parquet row group at most: small enough that a query for one key of a part
#: sorted by key skips most of it by the row groups' statistics (benchmarks/sql_scale.py).
ROW_GROUP_ROWS = 1 << 17
#: In a part sorted by key, a row group ends where the key changes once it holds this many
#: rows: a query for one key (with its filter pushed down to the row groups' statistics)
#: then reads that key's rows and little else, where a 128 K-row group spanning several
#: keys was read whole (at 1 billion values, one key across all runs: 2.3 s; 0.4 s after).
KEY_GROUP_MIN_ROWS = 1 << 14
#: Columns of free text, lists, digests and a histogram's statistics written without
#: statistics: their min and max (a prompt, a stack trace) prune no query, and would be
#: stored four more times (the chunk's statistics and the column index), more than the
#: value in a part of a few rows. (A histogram's statistics are metrics too: queries that
#: filter by them read `metrics`.)
PAYLOAD_COLUMNS = frozenset({"text", "input", "output", "extra", "error", "attributes",
                             "inputs", "outputs", "token_ids", "metadata", "title",
                             "digest", "edges", "counts", "count", "nonfinite", "min", "max",
                             "mean", "std", "shape", "caption"})
#: A part of fewer rows is written with plain encodings (no dictionary, delta or
#: byte-stream-split): for so few values a dictionary page or an encoding's header per
#: column costs more than it saves (a part of one record per kind would be larger than
#: the segment it replaces).
SMALL_PART_ROWS = 4096
#: A dictionary-encoded column is written with its dictionary as long as that holds at
#: most this many bytes (past it, Parquet writes every row's value out in full).
_ENCODED_DICTIONARY_BYTES = 256 << 20


def write_part_file(path: Path, table: pa.Table, kind: str) -> None:
    """Write a part's records (`table`, sorted by `PART_ORDER[kind]`, with its schema
    metadata) to `path` as every part is written: zstd, delta-encoded seq/time/step,
    byte-stream-split values, dictionary strings, statistics, a page index, the declared
    sort order, page checksums and the footer's CRC-32; fsynced, not renamed.

    The schema metadata (with the metric summary) is stored once, as the footer's
    key-value metadata: no ``ARROW:schema`` copy, whose base64 would hold it a second
    time. The Parquet types alone read back as `SCHEMAS` (UTC microsecond timestamps,
    int32, lists), and pyarrow exposes the key-value metadata as the schema's metadata.
    """
    write_part_stream(path, table.schema, [table], kind)


def write_part_stream(path: Path, schema: pa.Schema, chunks: Iterable[pa.Table], kind: str,
                      trailing: Callable[[int], dict[str, str]] | None = None,
                      order: tuple[str, ...] | None = None, few_pages: bool = False
                      ) -> bool:
    """`write_part_file` for records that come in chunks (already in the part's order),
    each written as row groups as it comes, so memory holds one chunk, not the part.
    `trailing(data_bytes)`, called after the last chunk with the bytes written so far,
    gives metadata known only then (the metric summary, `summary_entry`); it is stored in
    the footer's key-value metadata with the schema's. Whether the footer holds a metric
    summary.
    `order`: the columns the records are sorted by, if not `PART_ORDER[kind]`.
    `few_pages`: a column chunk's pages cut by the page size alone, not also every 20,000
    rows (pyarrow's default), where pyarrow can (`_few_pages`): for a file scanned
    whole (a bundle), whose pages' headers every reader walks before reading it
    (`page_headers`), and whose pages' own statistics prune nothing."""
    import pyarrow.parquet as pq

    metadata = {**{k.decode(): v.decode() for k, v in (schema.metadata or {}).items()},
                **footer_placeholder()}
    schema = schema.remove_metadata()
    chunks = iter(chunks)
    first = next(chunks, None)
    small = first is None or first.num_rows < SMALL_PART_ROWS  # the only chunk
    encodings: dict[str, str] = {}
    dictionary: list[str] = []
    if not small:
        encodings = {"seq": "DELTA_BINARY_PACKED", "time": "DELTA_BINARY_PACKED"}
        if "step" in schema.names:
            encodings["step"] = "DELTA_BINARY_PACKED"
        if kind == "metrics":
            encodings["value"] = "BYTE_STREAM_SPLIT"
        dictionary = [c for c in schema.names if c not in encodings and c != "end_time"]
    # columns that come dictionary-encoded (records read back from a part) stay so: their
    # dictionary is written as it is, never expanded to every row's value first
    encoded = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    dictionary = [*dictionary, *(c for c in encoded if c not in dictionary)]
    order = PART_ORDER[kind] if order is None else order
    sorting = pq.SortingColumn.from_ordering(
        schema, [(c, "ascending") for c in order], null_placement="at_end")
    with pa.OSFile(str(path), "wb") as sink, pq.ParquetWriter(
            sink, schema, compression="zstd", compression_level=3,
            use_dictionary=dictionary, column_encoding=encodings or None,
            dictionary_pagesize_limit=_ENCODED_DICTIONARY_BYTES if encoded else None,
            write_statistics=[c for c in schema.names if c not in PAYLOAD_COLUMNS],
            write_page_checksum=True, write_page_index=True, sorting_columns=sorting,
            store_schema=False, **(_few_pages(pq) if few_pages else {})) as writer:
        chunks = itertools.chain([] if first is None else [first], chunks)
        if order[0] == "key":
            chunks = key_row_groups(chunks)
        for chunk in chunks:
            writer.write_table(_used_dictionaries(chunk).replace_schema_metadata(None),
                               row_group_size=ROW_GROUP_ROWS)
        if trailing is not None:
            metadata.update(trailing(sink.tell()))
        if len(metadata.get(SUMMARY_KEY, "")) > SUMMARY_MAX_SHARE * sink.tell():
            del metadata[SUMMARY_KEY]  # larger than the data pages allow: readers compute it
        writer.add_key_value_metadata(metadata)
    stamp_footer_crc(path)
    fsync_file(path)
    return SUMMARY_KEY in metadata


@functools.cache
def _few_pages(pq: Any) -> dict[str, int]:
    """A row group's rows in one page where the page size allows it: for a file scanned
    whole, a fifth of the page headers a reader walks first (a bundle of 4 M rows: 2,032
    headers -> 448, 35 -> 18 ms). A pyarrow without the option (it came in 2025) cuts
    them every 20,000 rows."""
    takes = "max_rows_per_page" in inspect.signature(pq.ParquetWriter).parameters
    return {"max_rows_per_page": ROW_GROUP_ROWS} if takes else {}


def key_row_groups(chunks: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """The rows of `chunks` (sorted by key) re-cut into row groups of at most
    `ROW_GROUP_ROWS` rows, each ending where the key changes once it holds
    `KEY_GROUP_MIN_ROWS` (so a key of many rows has row groups of its own). Each row group
    comes as one chunk: Parquet's writer pays per chunk it is handed, and a group of 1,600
    keys' slices (100,000 keys of 10 values) cost 20 times what one chunk costs."""
    import numpy as np

    pending: list[pa.Table] = []
    held = 0
    last_key: object = None
    for chunk in chunks:
        if not chunk.num_rows:
            continue
        if chunk.column(0).num_chunks > 1:
            chunk = chunk.combine_chunks()
        keys = chunk.column("key")
        bounds = np.array(_key_starts(keys), dtype=np.int64)
        if held and keys[0].as_py() != last_key:
            bounds = np.r_[0, bounds]
        begin, rows = 0, chunk.num_rows
        while begin < rows:
            # the first key change at which the group holds KEY_GROUP_MIN_ROWS
            at = int(np.searchsorted(bounds, begin + max(KEY_GROUP_MIN_ROWS - held, 0)))
            if at < len(bounds) and held + bounds[at] - begin <= ROW_GROUP_ROWS:
                end = int(bounds[at])
            elif held + rows - begin > ROW_GROUP_ROWS:  # one key longer than a group
                end = begin + ROW_GROUP_ROWS - held
            else:
                pending.append(chunk.slice(begin))
                held += rows - begin
                break
            yield _one_chunk([*pending, chunk.slice(begin, end - begin)])
            pending, held, begin = [], 0, end
        last_key = keys[rows - 1].as_py()
    if pending:
        yield _one_chunk(pending)


def _one_chunk(pieces: list[pa.Table]) -> pa.Table:
    table = pa.concat_tables(pieces)
    return table.combine_chunks() if table.column(0).num_chunks > 1 else table


def _used_dictionaries(chunk: pa.Table) -> pa.Table:
    """`chunk` with each dictionary column that holds far more values than rows cut to
    the values its rows use: Parquet stores a row group's dictionary whole, so a sort's
    dictionary of 100,000 keys was written again into every row group (63 of them: 1.7 s,
    most of compacting such a stream, and a part 6 times larger)."""
    import numpy as np

    for i, column in enumerate(chunk.columns):
        if not pa.types.is_dictionary(column.type) or \
                sum(len(c.dictionary) for c in column.chunks) <= 2 * max(chunk.num_rows, 64):
            continue
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if array.null_count:
            continue  # never in a part's dictionary columns; left as it is
        indices = array.indices.to_numpy(zero_copy_only=False)
        used = np.unique(indices)
        trimmed = pa.DictionaryArray.from_arrays(
            pa.array(np.searchsorted(used, indices), column.type.index_type),
            array.dictionary.take(pa.array(used)))
        chunk = chunk.set_column(i, chunk.field(i), trimmed)
    return chunk


def _key_starts(keys: pa.ChunkedArray) -> list[int]:
    """The rows (after the first) where `keys` (sorted) differs from the row before.
    Dictionary-encoded keys are compared by index, each chunk's dictionary with itself:
    an equal key with two indices only adds a candidate cut."""
    import numpy as np
    import pyarrow.compute as pc

    starts: list[int] = []
    offset = 0
    previous: object = None
    for array in keys.chunks:
        if len(array):
            if offset and array[0].as_py() != previous:
                starts.append(offset)
            codes = array.indices if pa.types.is_dictionary(array.type) else array
            changed = pc.not_equal(codes.slice(1), codes.slice(0, len(array) - 1))
            starts.extend((np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1
                           + offset).tolist())
            previous = array[len(array) - 1].as_py()
        offset += len(array)
    return starts


def summary_json(rows: list[dict[str, Any]]) -> str:
    """A metric summary's JSON as a part's footer stores it: without spaces (one object
    per key, it is most of a footer)."""
    return json.dumps(rows, separators=(",", ":"), allow_nan=True)


#: The fewest bytes one key takes in `summary_json` (a key of one character, numbers of
#: one digit): how a summary too large to store is known before it is made.
_SUMMARY_BYTES_PER_KEY = len(summary_json([dict.fromkeys(SUMMARY_SCHEMA.names, 0)])) - 2


def summary_entry(keys: int, rows: Callable[[], list[dict[str, Any]]], data_bytes: int
                  ) -> dict[str, str]:
    """The footer entry holding a metric summary of `keys` keys (`rows()`), for a part of
    `data_bytes` of data pages; none, without calling `rows()`, when `keys` alone makes it
    exceed `SUMMARY_MAX_SHARE` of them (100,000 keys of 10 values: 0.6 s of JSON made,
    then dropped). `write_part_stream` drops one that exceeds it once made."""
    if keys * _SUMMARY_BYTES_PER_KEY > SUMMARY_MAX_SHARE * data_bytes:
        return {}
    return {SUMMARY_KEY: summary_json(rows())}


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


def open_part(path: Path, encoded: bool = False) -> Any:
    """A `pyarrow.parquet.ParquetFile` of a part whose footer is intact, reading with page
    checksums verified; `FormatError` naming the file (or `NewerFormatError`) otherwise.
    `encoded`: its string columns are read dictionary-encoded, for `part_bounds`.

    Parts written before footer checksums existed carry no `FOOTER_CRC_KEY`: their footer
    is only checked to decode.
    """
    import pyarrow.parquet as pq

    touch(path)
    # a path in an object store carries its pyarrow file system
    source, filesystem = getattr(path, "fs_path", path), getattr(path, "filesystem", None)
    try:
        with path.open("rb") as f:  # a Path, or a path in an object store
            meta, footer = _checked_footer(f, path)
            check_pages(f, path, part_read_limit(), footer)
        strings = string_columns(meta.schema.to_arrow_schema()) if encoded else None
        # no page is read until asked: the checks above come first
        return pq.ParquetFile(source, filesystem=filesystem, metadata=meta,
                              page_checksum_verification=True, read_dictionary=strings)
    except FileNotFoundError:
        raise  # gone (compacted over, or pruned) since it was listed: not damage
    except _DECODE_ERRORS as exc:  # not a file, unreadable, or refused by pyarrow
        raise FormatError(f"{path}: damaged Parquet part: it does not read ({exc})"
                          ) from exc


def _checked_footer(f: Any, path: Path) -> tuple[Any, bytes]:
    """The footer of the open part `f` (a `FileMetaData`, and its bytes) once its
    checksum, format version and declared sizes are checked: the footer whose checksum
    is checked is the one the pages are read by, parsed once (not read again from a file
    that may have been replaced meanwhile)."""
    import pyarrow.parquet as pq

    try:
        offset, length = footer_span(f, f.seek(0, os.SEEK_END))
        f.seek(offset)
        footer = f.read(length)
        meta = pq.read_metadata(pa.BufferReader(
            _MAGIC + footer + length.to_bytes(4, "little") + _MAGIC))
    except FormatError as exc:
        raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc
    except FileNotFoundError:
        raise
    except _DECODE_ERRORS as exc:
        raise FormatError(f"{path}: damaged Parquet part: footer does not decode ({exc})"
                          ) from exc
    raw = meta.metadata or {}
    expected = raw.get(FOOTER_CRC_KEY.encode())
    if expected is not None and not _footer_crc_matches(footer, expected):
        raise FormatError(f"{path}: damaged Parquet part: footer checksum mismatch")
    version = raw.get(b"tracklake.format")
    check_version(version.decode(errors="replace") if version is not None else None, path)
    # before any page is read: every reader of a part opens it here, and DuckDB reads a
    # question's parts only after they have been opened so (`Snapshot._add_parts`)
    check_declared(meta, path, part_read_limit())
    return meta, footer


#: The summaries of metric parts this process wrote without one in their footer, with
#: each file's identity once in place: `tracklake compact` catalogs what it compacted,
#: and a part of 100,000 keys is not read again to summarise it (0.12 s of 0.45).
_WRITTEN: dict[Path, tuple[tuple[int, ...], dict[str, list[Any]]]] = {}
#: At most this many keys' summaries are kept (the oldest go first).
_WRITTEN_MAX_KEYS = 1 << 20
#: How many keys `_WRITTEN` holds.
_written_keys = 0


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is replaced or written (a rename changes its ctime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember_summary(path: Path, columns: dict[str, list[Any]]) -> None:
    """Keep the summary of the metric part this process has just put at `path` without
    one in its footer, for `part_summary_columns` in this process while the file stays
    as it is now."""
    global _written_keys
    identity = _identity(path.stat())
    _forget_written(path)
    _WRITTEN[path] = (identity, columns)
    _written_keys += len(columns["key"])
    while _written_keys > _WRITTEN_MAX_KEYS:
        _forget_written(next(iter(_WRITTEN)))


def _forget_written(path: Path) -> None:
    global _written_keys
    kept = _WRITTEN.pop(path, None)
    if kept is not None:
        _written_keys -= len(kept[1]["key"])


def _written_summary(path: Path) -> dict[str, list[Any]] | None:
    kept = _WRITTEN.get(path)
    if kept is None:
        return None
    try:
        if _identity(path.stat()) == kept[0]:
            return kept[1]
    except OSError:
        pass
    _forget_written(path)
    return None


def summary_rows(parquet: Any, path: Path) -> list[dict[str, Any]]:
    """The metric summary of a part opened with `open_part`, one object per key
    (`part_summary_columns`)."""
    return rows_of(part_summary_columns(parquet, path))


def part_summary_columns(parquet: Any, path: Path) -> dict[str, list[Any]]:
    """The metric summary of a part opened with `open_part` as columns (`SUMMARY_SCHEMA`'s
    names; none for other kinds): the one its footer carries, or, for a part too small to
    carry one (`SUMMARY_MAX_SHARE`), computed from its rows. `FormatError` naming the file
    if the stored one is not a list of objects with a key and a count and the fields'
    types (checksums prove who wrote a footer no more than a forger's), or the rows do
    not read."""
    meta = parquet.metadata.metadata or {}
    raw = meta.get(SUMMARY_KEY.encode())
    if raw is None and meta.get(b"tracklake.kind") == b"metrics":
        written = _written_summary(path)
        if written is not None:
            return written
        try:
            return summary_columns(bounded_table(open_part(path, encoded=True), path))
        except FileNotFoundError:
            raise  # merged or pruned away since it was listed: not damage
        except _DECODE_ERRORS as exc:
            raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc
    try:
        rows = bounded_json.loads(raw) if raw else []
    except ValueError as exc:
        raise FormatError(f"{path}: its metric summary is not JSON ({exc})") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FormatError(f"{path}: its metric summary is not a list of objects")
    try:
        table = pa.Table.from_pylist(rows, SUMMARY_SCHEMA)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: its metric summary holds a value of the wrong type "
                          f"({exc})") from exc
    if table.column("key").null_count or table.column("count").null_count:
        raise FormatError(f"{path}: its metric summary has an object without a key or a "
                          "count")
    columns: dict[str, list[Any]] = table.to_pydict()
    return columns


def read_part_table(path: Path) -> pa.Table:
    """Every row of a part, its footer and page checksums verified, and what it decodes
    to within `part_read_limit()` (`FormatError` naming the file if not)."""
    parquet = open_part(path, encoded=True)
    try:
        return bounded_table(parquet, path)
    except FileNotFoundError:
        raise  # merged or pruned away while it was read: not damage
    except _DECODE_ERRORS as exc:
        raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc


def read_small_part(path: Path, limit: int) -> pa.Table | None:
    """Every row of a part, verified as `read_part_table` does, if they decode to at most
    `limit` bytes; None if they may decode to more (a part to read another way), judged
    before its strings are decoded."""
    parquet = open_part(path, encoded=True)
    meta = parquet.metadata
    if meta.num_rows * 8 * max(meta.num_columns, 1) > limit or declared_bytes(meta) > limit:
        return None
    try:
        table = parquet.read()
    except FileNotFoundError:
        raise  # merged or pruned away while it was read: not damage
    except _DECODE_ERRORS as exc:
        raise FormatError(f"{path}: damaged Parquet part: {exc}") from exc
    return plain(table) if decoded_bytes(table) <= limit else None
