"""Flat config keys back into the nested dicts W&B and SwanLab show."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracklake.exporters._shared.json_value import MAX_NESTING


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"model/layers": 4}`` → ``{"model": {"layers": 4}}``. A key one of whose prefixes
    is itself a key (``a`` and ``a/b``) stays flat, as does a key with an empty part, or
    with more parts than a writer lets mappings nest (a planted one: a dict that deep
    would stop the destination's client with RecursionError)."""
    out: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        parts = key.split("/")
        if len(parts) > MAX_NESTING or "" in parts or any(
                "/".join(parts[:i]) in flat for i in range(1, len(parts))):
            out[key] = value
            continue
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
