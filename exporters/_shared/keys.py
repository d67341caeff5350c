"""Keys a destination refuses or changes, as names that are legal there and never shared.

A destination's own rule cleans a key (replaces characters, drops path segments, cuts
it). Cleaning alone merges keys (``a//b`` and ``a/b``, ``é.x`` and ``_.x``), so: a key the
destination takes unchanged keeps its name; any other key gets its cleaned form, cut to
fit, then a separator and `DIGITS` hex digits of the SHA-256 of the original key. Two
different keys can then share a name only if one of them already ends like a hash of the
other (docs/exporters.md states the rule per destination).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

#: Hex digits of the SHA-256 of the original key appended to a changed key.
DIGITS = 10


def distinct_name(key: str, clean: Callable[[str], str], *, limit: int, sep: str) -> str:
    """`key` where `clean` leaves it unchanged and it fits in `limit` characters; else the
    cleaned key, cut to fit, with `sep` and a hash of `key` (`clean` must keep the suffix
    legal: it is made of `sep` and lowercase hex digits)."""
    cleaned = clean(key)
    if cleaned == key and len(key) <= limit:
        return key
    return hashed_name(key, cleaned, clean, limit=limit, sep=sep)


def hashed_name(key: str, cleaned: str, clean: Callable[[str], str], *, limit: int,
                sep: str) -> str:
    """`cleaned` (a legal form of `key`), cut to fit `limit` with `sep` and a hash of `key`."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:DIGITS]
    keep = limit - len(sep) - DIGITS
    return f"{clean(cleaned[:keep])}{sep}{digest}"
