"""A box table of single-line cells at known widths, drawn as rich's `Table` draws it,
without rich's layout.

rich lays a table out cell by cell (each cell a `Text`, wrapped, justified, padded,
shaped and aligned: about 0.1 ms a cell), which for `tracklake runs`' 50 rows was 50 to 90
ms of every listing. A table whose widths are chosen (`fit.allot`, or every column whole
where the page has room) and whose cells are plain one-line text needs none of that:
each cell is cut and padded to its width, and the lines are put together here. Anything
else (a character whose width is not one cell, a column that wraps, a table wider than
the console, a title that does not fit on one line) is drawn by rich, from the same
columns (`PlainTable.rich`), so what is printed is the same either way
(`tests/test_drawn_table.py` compares the two).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rich import box
from rich.segment import Segment

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions
    from rich.style import Style
    from rich.table import Table

#: Text drawn here: one line of characters one cell wide each (printable ASCII, the
#: ellipsis names are cut with, and the block elements of sparklines).
_PLAIN = re.compile("[\x20-\x7e\u2026\u2580-\u259f]*")
_BOX = box.HEAVY_HEAD


@dataclass(frozen=True)
class DrawnColumn:
    """A column as the table shows it: its header (lines split by a line break), its
    cells, its width (None: as wide as its widest line), and how its text reads when cut
    or wrapped."""

    header: str
    cells: list[str]
    width: int | None
    justify: Literal["left", "right"] = "left"
    overflow: Literal["ellipsis", "fold"] = "ellipsis"
    no_wrap: bool = True


@dataclass(frozen=True)
class PlainTable:
    """A rich renderable: `columns` under `title`, in rich's default box."""

    columns: list[DrawnColumn]
    title: str | None = None

    def rich(self) -> Table:
        """The same table as a rich `Table` (what draws it when it is not plain)."""
        from rich.table import Table

        table = Table(title=self.title)
        for column in self.columns:
            table.add_column(column.header, width=column.width, no_wrap=column.no_wrap,
                             overflow=column.overflow, justify=column.justify)
        for row in zip(*(c.cells for c in self.columns), strict=True):
            table.add_row(*row)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions
                         ) -> Iterator[Segment]:
        lines = self._lines(console, options)
        if lines is None:
            yield from console.render(self.rich(), options)
            return
        for line in lines:
            yield from line
            yield Segment.line()

    def _lines(self, console: Console, options: ConsoleOptions
               ) -> list[list[Segment]] | None:
        """The table's lines, or None where rich must draw it (see the module)."""
        widths = _widths(self.columns)
        if not widths:  # (a table of no columns too: rich draws what it makes of it)
            return None
        table_width = sum(widths) + 3 * len(widths) + 1
        if table_width > options.max_width:
            return None
        title = self.title
        if title is not None and (not _PLAIN.fullmatch(title) or title != title.strip()
                                  or len(title) > table_width):
            return None
        drawn = _BOX.substitute(options, safe=console.safe_box)
        header_style = console.get_style("table.header")
        lines: list[list[Segment]] = []
        if title is not None:
            indent = (table_width - len(title)) // 2
            lines.append([Segment(f"{' ' * indent}{title}".ljust(table_width),
                                  console.get_style("table.title"))])
        padded = [w + 2 for w in widths]  # (rich's box counts a cell's padding in)
        lines.append([Segment(drawn.get_top(padded))])
        lines.extend(_header_lines(self.columns, widths, drawn, header_style))
        lines.append([Segment(drawn.get_row(padded, "head"))])
        rows = list(zip(*(c.cells for c in self.columns), strict=True))
        for n, row in enumerate(rows):
            left, inner, right = (drawn.foot_left, drawn.foot_vertical, drawn.foot_right) \
                if n == len(rows) - 1 else (drawn.mid_left, drawn.mid_vertical, drawn.mid_right)
            cells = (_fitted(cell, width, c.justify)
                     for cell, width, c in zip(row, widths, self.columns, strict=True))
            lines.append([Segment(f"{left} {f' {inner} '.join(cells)} {right}")])
        lines.append([Segment(drawn.get_bottom(padded))])
        return lines


def _widths(columns: list[DrawnColumn]) -> list[int] | None:
    """Each column's width, or None if a column wraps or holds text not plain."""
    widths = []
    for column in columns:
        if not column.no_wrap and column.width is not None:
            return None
        lines = column.header.split("\n")
        if column.width is None and len(lines) > 1:
            return None
        texts = [*lines, *column.cells]
        if not all(_PLAIN.fullmatch(t) for t in texts):
            return None
        width = column.width if column.width is not None else max(map(len, texts))
        if width < 1:
            return None
        widths.append(width)
    return widths


def _header_lines(columns: list[DrawnColumn], widths: list[int], drawn: box.Box,
                  style: Style) -> Iterator[list[Segment]]:
    """The header's lines: each header at the bottom of the header row, as rich puts it."""
    headers = [c.header.split("\n") for c in columns]
    height = max(map(len, headers))
    edge = Segment(drawn.head_left)
    for n in range(height):
        line = [edge]
        for i, (column, lines, width) in enumerate(zip(columns, headers, widths,
                                                       strict=True)):
            if i:
                line.append(Segment(drawn.head_vertical))
            at = n - (height - len(lines))
            if at < 0:
                line.append(Segment(" " * (width + 2), style))
            else:
                line.extend((Segment(" ", style),
                             Segment(_fitted(lines[at], width, column.justify), style),
                             Segment(" ", style)))
        line.append(Segment(drawn.head_right))
        yield line


def _fitted(text: str, width: int, justify: str) -> str:
    """`text` (plain) cut with an ellipsis to `width` and padded to it, as rich justifies a
    line that does not wrap (right-justified text loses its trailing spaces first)."""
    if justify == "right":
        text = text.rstrip()
    if len(text) > width:
        text = f"{text[:width - 1]}…"
    return text.rjust(width) if justify == "right" else text.ljust(width)
