"""What a record batch message says it decodes to (`ipc_size.decoded_size`), read from its
header all at once, is what a walk over its buffers one at a time reads: for real
messages, compressed or not, and for the same messages damaged anywhere; and a sum of
crafted lengths is never wrapped below what it stands for."""

from __future__ import annotations

import struct

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tracklake._format import ipc_size
from tracklake._format.ipc_size import decoded_size


def _walked(message: memoryview) -> int | None:
    """The buffers walked one at a time (the function before it read them at once)."""
    try:
        header = ipc_size._header(message, ipc_size._RECORD_BATCH)
        if header is None:
            return None
        fb, batch = header
        body = message[8 + len(fb):]
        buffers_at = ipc_size._field(fb, batch, 2)
        compressed = ipc_size._field(fb, batch, 3) is not None
        if buffers_at is None:
            return 0
        vector = ipc_size._indirect(fb, buffers_at)
        count = struct.unpack_from("<I", fb, vector)[0]
        total = 0
        for i in range(count):
            offset, length = struct.unpack_from("<qq", fb, vector + 4 + 16 * i)
            if length <= 0:
                continue
            if not compressed:
                total += length
                continue
            if offset < 0 or offset + 8 > len(body):
                return None
            raw = struct.unpack_from("<q", body, offset)[0]
            total += length - 8 if raw == -1 else max(raw, 0)
        return total
    except (struct.error, IndexError):
        return None


def _message(rows: int, compression: str | None, nulls: bool) -> bytes:
    table = pa.table({
        "step": pa.array(range(rows), pa.int64()),
        "key": pa.array([None if nulls and i % 3 == 0 else f"k{i % 7}" for i in range(rows)]),
        "values": pa.array([[float(i)] * (i % 4) for i in range(rows)],
                           pa.list_(pa.float64()))})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    stream = sink.getvalue().to_pybytes()
    schema_length = ipc_size.message_size(memoryview(stream))
    assert schema_length is not None
    return stream[schema_length:]  # the record batch message, then the end of stream


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(0, 300), compression=st.sampled_from([None, "lz4", "zstd"]),
       nulls=st.booleans(), damage=st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                                      st.integers(1, 255)), max_size=3),
       cut=st.none() | st.floats(0, 1))
def test_the_size_read_at_once_is_the_size_walked(
        rows: int, compression: str | None, nulls: bool, damage: list[tuple[float, int]],
        cut: float | None) -> None:
    message = bytearray(_message(rows, compression, nulls))
    for where, flip in damage:
        message[int(where * len(message))] ^= flip
    if cut is not None:
        del message[int(cut * len(message)):]
    view = memoryview(bytes(message))
    assert decoded_size(view) == _walked(view)


def test_an_undamaged_message_says_what_it_decodes_to() -> None:
    for compression in (None, "lz4"):
        size = decoded_size(memoryview(_message(1000, compression, True)))
        assert size is not None and 1000 * 8 <= size < 1 << 20


def test_crafted_lengths_sum_as_the_numbers_they_are() -> None:
    """Lengths near 2**62, four of them: a sum in 64 bits would wrap to a small number
    and let a crafted message pass for one that decodes to little."""
    message = bytearray(_message(10, None, False))
    fb_at = 8
    fb = memoryview(bytes(message))[fb_at:fb_at + struct.unpack_from("<i", message, 4)[0]]
    header = ipc_size._header(memoryview(bytes(message)), ipc_size._RECORD_BATCH)
    assert header is not None
    _, batch = header
    vector = ipc_size._indirect(fb, ipc_size._field(fb, batch, 2))  # type: ignore[arg-type]
    count = struct.unpack_from("<I", fb, vector)[0]
    assert count >= 4
    for i in range(count):
        struct.pack_into("<q", message, fb_at + vector + 4 + 16 * i + 8, 1 << 62)
    view = memoryview(bytes(message))
    assert decoded_size(view) == count << 62 == _walked(view)
