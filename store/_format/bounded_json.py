"""JSON read from the store, parsed within a bound on what parsing allocates.

Every JSON file in a store (attempt records, the decoded-values cache, markers, journals,
a backup's manifest, a part's metric summary) is input from outside: a restored backup
or another user can plant it. Two shapes hurt a reader that trusts `json.loads`:

- nesting: 3 KB of ``[`` raise `RecursionError`, which is no `ValueError`, so the
  question that read the file failed instead of passing over it;
- small values: each costs a Python object far larger than its text (``[],`` is 3
  bytes and a 64-byte list; 64 MiB of it took 1.5 GB to parse), so a file within its
  size limit could still take the machine's memory.

`loads` refuses both with a ValueError, the second judged from the text's bytes before
parsing (`parse_cost`).
"""

from __future__ import annotations

import json
import os
from typing import Any


def quarter_of_memory() -> int:
    """A quarter of this machine's memory, at least 1 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 << 30
    return max(total // 4, 1 << 30)


def parse_cost(data: bytes | str) -> int:
    """At least what `json.loads(data)` allocates, counted from its text: the text
    decoded once, then every value at most 72 bytes beyond its text (a float, a short
    string, a list slot); values are separated by commas or open a list or an object,
    which cost 64 and 200 bytes more. Measured with CPython 3.11 over 17 shapes of
    32 MiB (`benchmarks/json_parse_cost.py`: `[],` took 770 MiB, `[[[]]],` 1,211 MiB,
    `"ab",` 462 MiB; the cost says 1,514, 1,270 and 524), it is never below what
    parsing took."""
    if isinstance(data, str):
        return 4 * len(data) + 72 * data.count(",") + 64 * data.count("[") \
            + 200 * data.count("{")
    return 2 * len(data) + 72 * data.count(b",") + 64 * data.count(b"[") \
        + 200 * data.count(b"{")


def loads(data: bytes | str, budget: int | None = None) -> Any:
    """`json.loads(data)`, or ValueError if parsing it could take more than `budget`
    bytes (a quarter of this machine's memory if not given) or it nests too deep."""
    budget = quarter_of_memory() if budget is None else budget
    cost = parse_cost(data)
    if cost > budget:
        raise ValueError(f"JSON of {len(data):,} bytes whose values would take more than "
                         f"{budget:,} bytes to hold (about {cost:,}): not one tracklake "
                         "wrote")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
