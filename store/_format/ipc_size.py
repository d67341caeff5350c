"""What an Arrow IPC message's flatbuffer header says, read before anything is decoded:
how many bytes a record batch decodes to, and the byte order a schema declares.

A segment is input from outside: a few kilobytes of zstd can decode to gigabytes. Arrow
records in the message header where each buffer of the body lies; with body compression,
each buffer starts with its uncompressed length (an int64; -1 when stored as is). The sum
is what decoding the batch allocates, give or take padding. Only the few flatbuffer
fields needed are read (Message.header, .bodyLength; RecordBatch.buffers,
.compression; Schema.endianness), by the flatbuffers wire format: little-endian offsets,
a table reached through its vtable.

The schema message of a stream carries no checksum. Its `endianness` field is one bit
away from "big": pyarrow then swaps the bytes of every buffer it reads, so each number
reads as another and each string's offsets point far out of its data (reading those
crashes the process). tracklake writes only little-endian streams (the byte order of
every platform pyarrow ships wheels for), so a stream declaring big-endian is damaged
or foreign.
"""

from __future__ import annotations

import struct

import numpy as np

_U16 = struct.Struct("<H")
_I16 = struct.Struct("<h")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_SCHEMA = 1  # MessageHeader.Schema
_RECORD_BATCH = 3  # MessageHeader.RecordBatch
_LITTLE_ENDIAN = 0  # Endianness.Little, also what an absent field means
_INT64_BYTES = np.arange(8)


def _field(buf: memoryview, table: int, index: int) -> int | None:
    """Absolute position of field `index` of the table at `table`, or None if absent."""
    vtable = table - _I32.unpack_from(buf, table)[0]
    size = _U16.unpack_from(buf, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > size:
        return None
    offset = _U16.unpack_from(buf, vtable + slot)[0]
    return table + offset if offset else None


def _indirect(buf: memoryview, at: int) -> int:
    return at + int(_U32.unpack_from(buf, at)[0])


def _header(message: memoryview, kind: int) -> tuple[memoryview, int] | None:
    """The flatbuffer of `message` and the position of its header table, if the message
    is complete up to its body and its header is of `kind`; else None. May raise
    `struct.error` or `IndexError` on bytes that are no flatbuffer."""
    meta_len = _I32.unpack_from(message, 4)[0]
    if meta_len <= 0 or 8 + meta_len > len(message):
        return None
    fb = message[8 : 8 + meta_len]
    root = _indirect(fb, 0)
    kind_at = _field(fb, root, 1)
    header_at = _field(fb, root, 2)
    if kind_at is None or fb[kind_at] != kind or header_at is None:
        return None
    return fb, _indirect(fb, header_at)


def decoded_size(message: memoryview) -> int | None:
    """Bytes the record batch in `message` (one encapsulated IPC message: continuation,
    metadata length, flatbuffer, body) decodes to; None if it is not a record batch
    message whose header can be read (the decoder then says what is wrong)."""
    try:
        header = _header(message, _RECORD_BATCH)
        if header is None:
            return None
        fb, batch = header
        body = message[8 + len(fb) :]
        buffers_at = _field(fb, batch, 2)
        compressed = _field(fb, batch, 3) is not None
        if buffers_at is None:
            return 0
        vector = _indirect(fb, buffers_at)
        count = _U32.unpack_from(fb, vector)[0]
        if not count:
            return 0
        # Buffer { offset: long; length: long; }, all at once: a catalog file's batch
        # has hundreds
        pairs = np.frombuffer(fb, dtype="<i8", count=2 * count, offset=vector + 4)
        offsets, lengths = pairs[0::2], pairs[1::2]
        held = lengths > 0
        if not compressed:
            return int(sum(lengths[held].tolist()))  # as Python ints: no sum wraps around
        offsets, lengths = offsets[held], lengths[held]
        if not len(offsets):
            return 0
        if np.any(offsets < 0) or np.any(offsets > len(body) - 8):
            return None  # past the body: an incomplete or damaged message
        raw = np.frombuffer(body, dtype=np.uint8)[offsets[:, None] + _INT64_BYTES]
        raw = raw.view("<i8").ravel()
        return int(sum(np.where(raw == -1, lengths - 8, np.maximum(raw, 0)).tolist()))
    except (struct.error, IndexError, ValueError):
        return None


def message_size(message: memoryview) -> int | None:
    """Bytes one encapsulated IPC message occupies as stored (continuation, metadata
    length, flatbuffer, body), read from its prefix and its header's `bodyLength`; None if
    that cannot be read from `message` (not a message, or its header is cut short)."""
    try:
        if bytes(message[:4]) != b"\xff\xff\xff\xff":
            return None
        meta_len = _I32.unpack_from(message, 4)[0]
        if meta_len <= 0 or 8 + meta_len > len(message):
            return None
        fb = message[8 : 8 + meta_len]
        body_at = _field(fb, _indirect(fb, 0), 3)  # Message.bodyLength
        body = 0 if body_at is None else _I64.unpack_from(fb, body_at)[0]
        return None if body < 0 else 8 + meta_len + body
    except (struct.error, IndexError):
        return None


def declares_other_than_little_endian(message: memoryview) -> bool:
    """True if `message` (an encapsulated IPC message: continuation, metadata length,
    flatbuffer) is a schema whose `endianness` is anything but little (pyarrow reads any
    other value as big). A message whose header cannot be read gives False: the decoder
    then says what is wrong."""
    try:
        header = _header(message, _SCHEMA)
        if header is None:
            return False
        fb, schema = header
        endianness_at = _field(fb, schema, 0)
        return endianness_at is not None and \
            _I16.unpack_from(fb, endianness_at)[0] != _LITTLE_ENDIAN
    except (struct.error, IndexError):
        return False
