"""The one console every command prints through: user values are never markup or emoji."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console


def literal_console(**options: Any) -> Console:
    """A rich console that shows every string as it is: `[/INST]`, `[bold]` or `:smile:`
    in a run name, key or value is printed literally (styles come only from `Text`)."""
    options.setdefault("width", None if sys.stdout.isatty() else 200)
    return Console(markup=False, emoji=False, **options)


def terminal_width(console: Console) -> int | None:
    """The width to fit tables to: the terminal's, or None when `console` writes to a pipe
    or a file (whose readers get every column whole)."""
    return console.width if console.is_terminal else None
