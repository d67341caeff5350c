"""What a Parquet file's pages say they decompress to, from their own headers.

pyarrow allocates each page's uncompressed buffer by the page's header, not by the
footer: a file whose footer understates its sizes (`part_bounds.declared_bytes`) would
still be decompressed whole before anything could judge it. So the headers of the pages
pyarrow would read (each column chunk's byte range, read from the footer's own bytes:
`chunk_ranges`) are walked here first, and their uncompressed sizes summed.

Footer and page headers are Thrift structs in the compact protocol; only the fields
needed are kept, everything else is skipped by type. No Python library reads them
without pandas or generated code, and the encoding is small and fixed by the Parquet
format. Every skip is bounded by the bytes read, nesting by `_MOST_DEPTH`, and a page
header by `MOST_HEADER_BYTES` (pyarrow's own limit).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable
from typing import IO, Any

from tracklake._errors import FormatError

#: The largest page header pyarrow reads (its default `max_page_header_size`).
MOST_HEADER_BYTES = 16 << 20
#: A column chunk region at most this large is read in one call; a larger one (a bundle)
#: header by header.
_READ_WHOLE = 4 << 20
#: The first bytes read for one header: statistics of long strings may take more.
_FIRST_WINDOW = 8 << 10
_MOST_DEPTH = 32
# compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12


class _Short(ValueError):
    """The header runs past the bytes read so far."""

    def __str__(self) -> str:
        return "cut short"


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise _Short
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _ahead(buf: Any, pos: int, n: int) -> int:
    if n < 0:
        raise ValueError("a negative length")
    if pos + n > len(buf):
        raise _Short
    return pos + n


def _skip(buf: Any, pos: int, kind: int, depth: int, in_list: bool = False) -> int:
    """The position after a value of compact type `kind` at `pos`."""
    if kind in (_TRUE, _FALSE):
        return _ahead(buf, pos, 1) if in_list else pos  # a field's value is in its type
    if kind == _BYTE:
        return _ahead(buf, pos, 1)
    if kind in (_I16, _I32, _I64):
        return _varint(buf, pos)[1]
    if kind == _DOUBLE:
        return _ahead(buf, pos, 8)
    if kind == _BINARY:
        n, pos = _varint(buf, pos)
        return _ahead(buf, pos, n)
    if depth >= _MOST_DEPTH:
        raise ValueError(f"values nested deeper than {_MOST_DEPTH}")
    if kind in (_LIST, _SET):
        _ahead(buf, pos, 1)
        n, element = buf[pos] >> 4, buf[pos] & 0x0F
        pos += 1
        if n == 15:
            n, pos = _varint(buf, pos)
        if element in (_I32, _I64, _I16):  # the usual list (histograms, encodings)
            size = len(buf)
            for _ in range(n):
                while pos < size and buf[pos] & 0x80:
                    pos += 1
                pos += 1
                if pos > size:
                    raise _Short
            return pos
        for _ in range(n):  # each element takes a byte at least: bounded by the buffer
            pos = _skip(buf, pos, element, depth + 1, in_list=True)
        return pos
    if kind == _MAP:
        n, pos = _varint(buf, pos)
        if n:
            _ahead(buf, pos, 1)
            key, value = buf[pos] >> 4, buf[pos] & 0x0F
            pos += 1
            for _ in range(n):
                pos = _skip(buf, pos, key, depth + 1, in_list=True)
                pos = _skip(buf, pos, value, depth + 1, in_list=True)
        return pos
    if kind == _STRUCT:
        return _struct(buf, pos, depth + 1, {})
    raise ValueError(f"unknown compact type {kind}")


def _struct(buf: Any, pos: int, depth: int, wanted: dict[int, int]) -> int:
    """The position after the struct at `pos`; its integer fields whose ids are in
    `wanted` are put there."""
    return _walk(buf, pos, depth, {field: _integer(wanted, field) for field in wanted})


def _byte_class(kinds: tuple[int, ...]) -> bytes:
    """A regex class of the field headers of `kinds` with a field-id delta of 1 to 15."""
    return b"[" + b"".join(re.escape(bytes([delta << 4 | kind]))
                           for delta in range(1, 16) for kind in kinds) + b"]"


_V = rb"[\x80-\xff]{0,9}[\x00-\x7f]"  # a varint
#: The usual page header whole: type, the two sizes, perhaps a checksum (fields 1 to 4,
#: i32), then one struct of integer and boolean fields (the data, dictionary or v2
#: page's own header, without statistics). Matched in one call; others are walked.
_USUAL = re.compile(
    rb"\x15" + _V + rb"\x15(" + _V + rb")\x15(" + _V + rb")(?:\x15" + _V + rb")?"
    + _byte_class((_STRUCT,))
    + rb"(?:" + _byte_class((_I16, _I32, _I64)) + _V + b"|" + _byte_class((_TRUE, _FALSE))
    + rb")*\x00\x00", re.DOTALL)


def _zigzag(raw: bytes) -> int:
    value = 0
    for shift, byte in enumerate(raw):
        value |= (byte & 0x7F) << (7 * shift)
    return (value >> 1) ^ -(value & 1)


def page_header(buf: bytes | memoryview) -> tuple[int, int, int]:
    """(uncompressed size, compressed size, header length) of the page header at the
    start of `buf`; `_Short` if it runs past `buf`, ValueError if it does not decode."""
    usual = _USUAL.match(buf)
    if usual is not None:
        uncompressed, compressed, end = _zigzag(usual[1]), _zigzag(usual[2]), usual.end()
    else:
        sizes = {2: -1, 3: -1}
        end = _struct(buf, 0, 0, sizes)
        uncompressed, compressed = sizes[2], sizes[3]
    if uncompressed < 0 or compressed < 0:
        raise ValueError("a page header without its sizes, or with a negative one")
    return uncompressed, compressed, end


def footer_span(f: IO[bytes], size: int) -> tuple[int, int]:
    """(offset, length) of the thrift footer of the open Parquet file `f` of `size`
    bytes; FormatError saying what is wrong if it has none."""
    if size < 12:
        raise FormatError("too short to be a Parquet file")
    f.seek(size - 8)
    tail = f.read(8)
    if tail[4:] != b"PAR1":
        raise FormatError("no Parquet end marker (the file is truncated or not Parquet)")
    length = int.from_bytes(tail[:4], "little")
    if length > size - 12:
        raise FormatError("footer length points outside the file (truncated?)")
    return size - 8 - length, length


def chunk_ranges(footer: bytes) -> list[tuple[int, int]]:
    """(start, end) of every column chunk the thrift `FileMetaData` in `footer` lists, as
    pyarrow reads it: from its dictionary page if that comes first,
    `total_compressed_size` bytes (a chunk without its metadata pyarrow cannot read, and
    one of no values it reads nothing of: both are left out). Read here, not through
    pyarrow's `row_group(i).column(j)`: on a footer whose size statistics disagree with
    its schema that call aborts the process (a C++ exception thrown through pyarrow's
    binding), which a crafted part would do to every reader. Only
    FileMetaData.row_groups (4) → RowGroup.columns (1) → ColumnChunk.meta_data (3) →
    num_values (5), total_compressed_size (7), data_page_offset (9) and
    dictionary_page_offset (11) are read; every other field is skipped unread."""
    ranges: list[tuple[int, int]] = []

    def column_meta(buf: Any, pos: int, kind: int, depth: int) -> int:
        if kind != _STRUCT:
            return _skip(buf, pos, kind, depth)
        got: dict[int, int] = {}
        pos = _walk(buf, pos, depth, {5: _integer(got, 5), 7: _integer(got, 7),
                                     9: _integer(got, 9), 11: _integer(got, 11)})
        # a chunk of no values has no page pyarrow reads (pyarrow writes an empty
        # table's with its data page offset 0)
        if 7 in got and 9 in got and got.get(5) != 0:
            start, dictionary = got[9], got.get(11, 0)
            if 0 < dictionary < start:
                start = dictionary
            ranges.append((start, start + got[7]))
        return pos

    def column_chunk(buf: Any, pos: int, depth: int) -> int:
        return _walk(buf, pos, depth, {3: column_meta})

    def row_group(buf: Any, pos: int, depth: int) -> int:
        return _walk(buf, pos, depth, {1: _list_of(column_chunk)})

    try:
        _walk(footer, 0, 0, {4: _list_of(row_group)}, last=4)
    except ValueError as exc:
        raise FormatError(f"its footer does not decode ({exc})") from None
    return ranges


_Handler = Callable[[Any, int, int, int], int]


def _walk(buf: Any, pos: int, depth: int, handlers: dict[int, _Handler],
          last: int = 1 << 16) -> int:
    """The position after the struct at `pos`, its fields in `handlers` handed to them
    (`handler(buf, pos, kind, depth)` gives the position after the field), the others
    skipped (integers, strings and nested structs inline: a bundle's footer has 100,000
    fields). Walking stops after field `last` (the position then is not the struct's
    end)."""
    if depth > _MOST_DEPTH:
        raise ValueError(f"values nested deeper than {_MOST_DEPTH}")
    field = inner = 0
    size = len(buf)
    while True:
        if pos >= size:
            raise _Short
        byte = buf[pos]
        pos += 1
        if byte == 0:  # the end of a struct
            if not inner:
                return pos
            inner -= 1
            continue
        kind = byte & 0x0F
        if inner:  # a field of a nested struct, skipped
            if not byte >> 4:
                pos = _varint(buf, pos)[1]
        elif byte >> 4:
            field += byte >> 4
        else:
            raw, pos = _varint(buf, pos)
            field = (raw >> 1) ^ -(raw & 1)
        handler = None if inner else handlers.get(field)
        if handler is not None:
            pos = handler(buf, pos, kind, depth + 1)
            if field >= last:
                return pos
        elif kind in (_I32, _I64, _I16):
            while pos < size and buf[pos] & 0x80:
                pos += 1
            pos += 1
        elif kind == _BINARY:
            if pos < size and buf[pos] < 0x80:
                pos += 1 + buf[pos]
            else:
                n, pos = _varint(buf, pos)
                pos += n
        elif kind == _STRUCT:
            inner += 1
            if depth + inner > _MOST_DEPTH:
                raise ValueError(f"values nested deeper than {_MOST_DEPTH}")
        elif kind not in (_TRUE, _FALSE):
            pos = _skip(buf, pos, kind, depth + inner)


def _integer(into: dict[int, int], field: int) -> _Handler:
    """A handler keeping the value of field `field`, an i32 or i64, in `into[field]`."""
    def handle(buf: Any, pos: int, kind: int, depth: int) -> int:
        if kind not in (_I32, _I64):
            return _skip(buf, pos, kind, depth)
        raw, end = _varint(buf, pos)
        into[field] = (raw >> 1) ^ -(raw & 1)
        return end
    return handle


def _list_of(element: Callable[[Any, int, int], int]) -> _Handler:
    """A handler walking a list field's struct elements with `element(buf, pos, depth)`."""
    def handle(buf: Any, pos: int, kind: int, depth: int) -> int:
        if kind not in (_LIST, _SET) or depth > _MOST_DEPTH:
            return _skip(buf, pos, kind, depth)
        _ahead(buf, pos, 1)
        n, item = buf[pos] >> 4, buf[pos] & 0x0F
        pos += 1
        if n == 15:
            n, pos = _varint(buf, pos)
        for _ in range(n):  # each element takes a byte at least: bounded by the buffer
            pos = element(buf, pos, depth + 1) if item == _STRUCT else \
                _skip(buf, pos, item, depth + 1, in_list=True)
        return pos
    return handle


def pages_bytes(f: IO[bytes], ranges: list[tuple[int, int]], size: int,
                where: object) -> int:
    """What the pages of the open Parquet file `f` (`size` bytes; its column chunks at
    `ranges`, from `chunk_ranges`) say, in their headers, they decompress to;
    `FormatError` naming `where` if a chunk's range lies outside the file or a header does
    not decode."""
    if not ranges:
        return 0
    low = min(start for start, _ in ranges)
    high = max(end for _, end in ranges)
    if low < 0 or high > size or any(end < start for start, end in ranges):
        raise FormatError(f"{where}: damaged Parquet part: a column chunk lies outside "
                          "the file")
    read_at = _reader(f)
    whole = memoryview(read_at(low, high - low)) if high - low <= _READ_WHOLE else None
    total = 0
    for start, end in ranges:
        pos = start
        while pos < end:
            try:
                if whole is not None:  # sliced without copying
                    uncompressed, compressed, length = page_header(whole[pos - low:end - low])
                else:
                    uncompressed, compressed, length = _header_at(read_at, pos, end)
            except ValueError as exc:
                raise FormatError(f"{where}: damaged Parquet part: the page header at "
                                  f"byte {pos} does not decode ({exc})"
                                  ) from None
            total += uncompressed
            pos += length + compressed
    return total


def pages_total(f: IO[bytes], where: object, footer: bytes | None = None) -> int:
    """`pages_bytes` of the open Parquet file `f`, its chunks read from its own footer
    (`footer`, its bytes if the caller read them already); `FormatError` naming `where`
    if that footer does not decode."""
    size = f.seek(0, os.SEEK_END)
    try:
        if footer is None:
            offset, length = footer_span(f, size)
            f.seek(offset)
            footer = f.read(length)
        ranges = chunk_ranges(footer)
    except FormatError as exc:
        raise FormatError(f"{where}: damaged Parquet part: {exc}") from None
    return pages_bytes(f, ranges, size, where)


def _reader(f: IO[bytes]) -> Callable[[int, int], bytes]:
    """`read_at(offset, n)` for `f`: one `pread` for a file of this machine's file
    system (not for a member of an archive or a file of an object store, whose offsets
    are their own)."""
    if isinstance(getattr(f, "raw", f), io.FileIO):
        fd = f.fileno()
        return lambda offset, n: os.pread(fd, n, offset)

    def read_at(offset: int, n: int) -> bytes:
        f.seek(offset)
        return f.read(n)

    return read_at


def _header_at(read_at: Callable[[int, int], bytes], pos: int, end: int
               ) -> tuple[int, int, int]:
    window = _FIRST_WINDOW
    while True:
        buf = read_at(pos, min(window, end - pos))
        try:
            return page_header(buf)
        except _Short:
            if len(buf) >= min(MOST_HEADER_BYTES, end - pos):
                raise
            window *= 16
