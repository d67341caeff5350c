"""How the run table and `show` print a value and a duration in a cell (no rich here:
`runs --format tsv|json` must not import it)."""

from __future__ import annotations

from typing import Any


def cell(value: Any) -> str:
    """A value as a table cell: nothing for None, floats to 4 significant digits."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def duration(seconds: float | None) -> str:
    """Seconds as H:MM:SS; nothing for None."""
    if seconds is None:
        return ""
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
