"""The progress bar of a long command on a terminal, fitted to the terminal's width
(`progress.OperationProgress` decides when a bar is drawn).

rich narrows a progress line that is too wide by cutting its columns alike: at 80
columns `181818/? records` read `181… r…`. Here the counts, percent, rate and time left
are never cut. The bar gives way first (down to `_BAR_LEAST` cells), then the note (what
is being worked on) and the description, cut in their middle; a column that still finds
no room is left out, the bar first, then the note.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tracklake._cli.fit import Whole, allot
from tracklake._cli.shorten import shorten_one

#: The bar's width when the terminal has room, and the least it is drawn at.
_BAR, _BAR_LEAST = 20, 5
#: The narrowest the description and the note are cut to.
_TEXT_LEAST = 10


def rate_text(speed: float | None, unit: str) -> str:
    """Units per second, the number in 5 cells (`974`, `12.3k`, `1.05M`): as the rate
    changes, the columns after it stay where they are."""
    if speed is None:
        return ""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")):
        if speed >= scale or not suffix:
            v = speed / scale
            number = f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"
            return f"{number + suffix:>5} {unit}/s"
    raise AssertionError("unreachable")


class _Rate(ProgressColumn):
    """Units per second, in the operation's own unit."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        return Text(rate_text(task.finished_speed or task.speed, self.unit),
                    style="progress.data.speed")


#: What each column of the bar is: "text" cut in its middle, "bar", or "never" cut.
_KINDS = ("text", "bar", "never", "never", "never", "never", "never", "text")
#: Most important first: count, unit, percent, time left, description, rate, note, bar.
_CLAIMS = (2, 3, 4, 6, 0, 5, 7, 1, Whole(0), Whole(7), Whole(1))


class FittedProgress(Progress):
    """A rich Progress whose lines are laid out for the width they are drawn in."""

    def make_tasks_table(self, tasks: Iterable[Task]) -> Table:
        rows = [[column(task) if isinstance(column, ProgressColumn) else Text(str(column))
                 for column in self.columns] for task in tasks if task.visible]
        return _FittedRows(rows)


class _FittedRows(Table):
    """The rows of a progress display, laid out when rich tells the width (module doc)."""

    def __init__(self, rows: list[list[Any]]) -> None:
        super().__init__()
        self.rows_cells = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)

    def fitted(self, room: int) -> Table:
        """The rows as a grid of at most `room` cells."""
        rows = self.rows_cells
        whole = [max((_width(row[i]) for row in rows), default=0) for i in range(len(_KINDS))]
        least = [w if kind == "never" else min(w, _BAR_LEAST if kind == "bar" else _TEXT_LEAST)
                 for w, kind in zip(whole, _KINDS, strict=True)]
        claims = [c for c in _CLAIMS if whole[c.column if isinstance(c, Whole) else c]]
        widths = allot(least, whole, claims, room, gap=1, edge=0)
        kept = [i for i, w in enumerate(widths) if w]
        table = Table.grid(padding=(0, 1))
        for i in kept:
            table.add_column(width=widths[i], no_wrap=True, overflow="ellipsis")
        for row in rows:
            table.add_row(*(_fitted(row[i], _KINDS[i], widths[i] or 0) for i in kept))
        return table


def _width(cell: Any) -> int:
    if isinstance(cell, ProgressBar):
        return cell.width or _BAR
    return cell_len(cell.plain) if isinstance(cell, Text) else 0


def _fitted(cell: Any, kind: str, width: int) -> Any:
    if isinstance(cell, ProgressBar):
        cell.width = width
    elif kind == "text" and isinstance(cell, Text):
        return Text(shorten_one(cell.plain, width), style=cell.style)
    return cell


def progress_bar(unit: str, console: Console) -> FittedProgress:
    """A bar for an operation counted in `unit`: what, bar, done/total, percent, rate,
    time left, note (the task's field `note`)."""
    return FittedProgress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(bar_width=_BAR), MofNCompleteColumn(), TextColumn(unit, markup=False),
        TaskProgressColumn(), _Rate(unit), TimeRemainingColumn(),
        TextColumn("{task.fields[note]}", markup=False), console=console, transient=False)
