"""Values that compress to almost nothing, for parts crafted to decode to far more than
they hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa


def compressible_strings(rows: int, value_bytes: int) -> pa.StringArray:
    """`rows` distinct strings of `value_bytes` bytes, each its row number then one letter:
    zstd makes each a few hundred bytes, and no dictionary can share them."""
    filler = b"a" * (value_bytes - 12)
    data = b"".join(b"%012d" % i + filler for i in range(rows))
    offsets = np.arange(rows + 1, dtype=np.int32) * value_bytes
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(data))


def understate_footer(path: Path, to: int = 1000, above: int = 1 << 20) -> None:
    """Rewrite the Parquet file at `path` so that its footer says each row group and
    column chunk larger than `above` decompresses to `to` bytes; its pages,
    whose headers pyarrow allocates by, are left as they are. Each size is a varint
    in the footer (Thrift's compact protocol), rewritten in the same number of bytes
    (a varint may carry leading zero groups), so nothing else moves."""
    import pyarrow.parquet as pq

    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    meta = pq.read_metadata(path)
    sizes = set()
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        sizes.add(group.total_byte_size)
        sizes.update(group.column(c).total_uncompressed_size
                     for c in range(group.num_columns))
    for size in sorted(s for s in sizes if s > above):
        honest = _varint(2 * size)  # zigzag
        at = data.find(honest, start)
        assert at != -1 and data.find(honest, at + 1) == -1, size  # once, and found
        forged = bytearray(_varint(2 * to))
        forged[-1] |= 0x80
        forged += b"\x80" * (len(honest) - len(forged) - 1) + b"\x00"
        data[at:at + len(honest)] = forged
    path.write_bytes(bytes(data))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
