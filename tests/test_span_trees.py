"""Spans as trees (the report's and the dashboard's traces): every span shows once, and
every tree ends, whatever parents the rows name."""

from __future__ import annotations

from typing import Any

import pytest

from tracklake._report.sections import Span, trees
from tracklake._ui.traces import _FIELDS, _flat


def _row(span: str, parent: str | None, trace: str = "t") -> dict[str, Any]:
    return {"trace_id": trace, "span_id": span, "parent_id": parent, "name": span,
            **dict.fromkeys(_FIELDS, "")}


def _walk(roots: list[Span]) -> list[tuple[str, int]]:
    return [(row["span_id"], row["depth"]) for row in _flat(roots)]


@pytest.mark.parametrize(("rows", "expected"), [
    # a plain tree, a parent from another trace (a root), a span its own parent
    ([_row("a", None), _row("b", "a"), _row("c", "b"), _row("x", "a", trace="u"),
      _row("s", "s")], [("a", 0), ("b", 1), ("c", 2), ("x", 0), ("s", 0)]),
    # a loop of two, with a span below it: the loop is cut at one of its spans
    ([_row("a", "b"), _row("b", "a"), _row("c", "a")],
     [("a", 0), ("b", 1), ("c", 1)]),
    # a span below a loop of three, listed before the loop
    ([_row("d", "a"), _row("a", "c"), _row("b", "a"), _row("c", "b")],
     [("a", 0), ("d", 1), ("b", 1), ("c", 2)]),
])
def test_every_span_shows_once_and_every_tree_ends(
        rows: list[dict[str, Any]], expected: list[tuple[str, int]]) -> None:
    walked = _walk(trees(rows))
    assert sorted(s for s, _ in walked) == sorted(r["span_id"] for r in rows)
    assert walked == expected
