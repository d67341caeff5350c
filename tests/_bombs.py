"""Values that compress to almost nothing, for parts crafted to decode to far more than
they hold."""

from __future__ import annotations

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
