"""How the run table and `show` print a value and a duration in a cell (no rich here:
`runs --format tsv|json` must not import it)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def cell(value: Any) -> str:
    """A value as a table cell: nothing for None, floats to 4 significant digits."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, pa.MonthDayNano):
        return interval_text(value)
    if isinstance(value, (list, dict)):
        return str(plain(value))
    return str(value)


def plain(value: Any) -> Any:
    """`value` (as `to_pylist` gives it) with each interval in it as its text, lists,
    dicts and a map's pairs walked (an interval is a tuple, which JSON writes as a list
    of its three numbers)."""
    if isinstance(value, pa.MonthDayNano):
        return interval_text(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def duration(seconds: float | None) -> str:
    """Seconds as H:MM:SS; nothing for None."""
    if seconds is None:
        return ""
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def interval_text(value: pa.MonthDayNano) -> str:
    """As DuckDB casts an interval to text: ``2 years 2 months 3 days 01:01:01.5``."""
    years, months = divmod(value.months, 12) if value.months >= 0 else \
        (-(-value.months // 12), -(-value.months % 12))
    words = [f"{n} {unit}{'s' if abs(n) != 1 else ''}"
             for n, unit in ((years, "year"), (months, "month"), (value.days, "day")) if n]
    micros = value.nanoseconds // 1000 if value.nanoseconds >= 0 else \
        -(-value.nanoseconds // 1000)
    if micros or not words:
        sign = "-" if micros < 0 else ""
        seconds, fraction = divmod(abs(micros), 1_000_000)
        minutes, seconds = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        clock = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
        if fraction:
            clock += f".{fraction:06d}".rstrip("0")
        words.append(clock)
    return " ".join(words)
