"""Record values stored as JSON text (config values, attributes, metadata), decoded for
a destination."""

from __future__ import annotations

import json
from typing import Any

#: as deep as a writer lets a value nest (`tracklake._write.coerce.MAX_NESTING`)
MAX_NESTING = 100


def json_value(text: Any) -> Any:
    """`text` decoded; `text` itself if it is not JSON text, or nests deeper than a writer
    lets a value nest (a planted record: decoding it whole, or handing it to a
    destination's client, would raise RecursionError and stop the export of every run)."""
    if not isinstance(text, str):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if _nests_within(value, MAX_NESTING) else text


def too_deep(text: str) -> bool:
    """True if `text` is JSON that nests deeper than a writer lets a value nest."""
    try:
        value = json.loads(text)
    except RecursionError:
        return True
    except ValueError:
        return False
    return not _nests_within(value, MAX_NESTING)


def _nests_within(value: Any, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                   else item))
    return True
