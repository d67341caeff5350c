"""Tables that fit a terminal's width: columns kept in order of importance, names
shortened in their middle (`shorten`), numbers never cut nor wrapped.

rich fits a table that is too wide by narrowing its columns alike, so a number wraps
(`0.81` over `46`) and an id folds over ten lines: it knows no column matters more than
another. Here each column has a narrowest width at which it still reads (a number
column: its widest number; a name column: the width at which its names stay distinct)
and a whole width. A table's *claims* say, most important first, which column gets its
narrowest or its whole width; each claim is granted if the terminal has room for it, a
column whose narrowest width finds no room is left out (and named), and the room left
over goes to the kept columns in the order of the claims. The table is drawn at the
widths chosen as rich draws it (`drawn_table`).

Off a terminal (a pipe, a file) nothing is fitted: every column is printed whole,
folded over lines where the page is too narrow, as scripts and logs have always had it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich.cells import cell_len

from tracklake._cli.drawn_table import DrawnColumn, PlainTable
from tracklake._cli.shorten import distinct_width, name_parts, shorten, wrap_name

#: How a column narrows: "never" (numbers, times: whole or left out), "shorten" (names:
#: cut in the middle, kept distinct), "wrap" (prose: over several lines).
Narrow = Literal["never", "shorten", "wrap"]
#: A header part wider than this is folded rather than widen its column, and a header
#: takes at most this many lines at its column's narrowest.
_HEADER_PART, _HEADER_LINES = 10, 4
#: Cells of a box table with edges and a space either side of each cell: between two
#: columns, and around all of them.
BOX_GAP, BOX_EDGE = 3, 4


@dataclass
class Column:
    """A column of a table: header, cells, how it narrows."""

    header: str
    cells: list[str] = field(default_factory=list)
    narrow: Narrow = "never"
    #: the narrowest a "shorten" or "wrap" column gets (if its cells are wider)
    floor: int = 8
    justify: Literal["left", "right"] = "left"

    @property
    def whole(self) -> int:
        return max([cell_len(self.header), *map(cell_len, self.cells)])

    @property
    def least(self) -> int:
        """The narrowest width at which the column reads: whole numbers, distinct names,
        header words unbroken (up to `_HEADER_PART` cells), the header in at most
        `_HEADER_LINES` lines."""
        header = min(max(map(cell_len, name_parts(self.header)), default=0), _HEADER_PART)
        while wrap_name(self.header, header).count("\n") >= _HEADER_LINES:
            header += 1
        widest = max(map(cell_len, self.cells), default=0)
        if self.narrow == "never":
            cells = widest
        elif self.narrow == "shorten":
            cells = distinct_width(self.cells, min(self.floor, widest))
        else:
            cells = min(self.floor, widest)
        return max(header, cells, 1)


@dataclass(frozen=True)
class Whole:
    """A claim on a column's whole width (a plain index claims its narrowest)."""

    column: int


Claim = int | Whole


def allot(least: Sequence[int], whole: Sequence[int], claims: Sequence[Claim], room: int,
          *, gap: int = BOX_GAP, edge: int = BOX_EDGE) -> list[int | None]:
    """The width of each column (None: left out) when the claims are granted in order in
    `room` cells; `gap` cells go between two columns, `edge` around them all. The first
    claimed column is always kept, cut to the room if it must be."""
    widths: list[int | None] = [None] * len(least)
    used = edge - gap  # the cells taken so far, counting a gap before each column
    for n, claim in enumerate(claims):
        if isinstance(claim, Whole):
            current = widths[claim.column]
            if current is not None and used + whole[claim.column] - current <= room:
                used += whole[claim.column] - current
                widths[claim.column] = whole[claim.column]
        elif widths[claim] is None:
            width = least[claim] if n else max(min(least[claim], room - edge), 1)
            if used + gap + width <= room or not n:
                used += gap + width
                widths[claim] = width
    for claim in claims:
        i = claim.column if isinstance(claim, Whole) else claim
        current = widths[i]
        if current is not None and current < whole[i] and used < room:
            grow = min(whole[i] - current, room - used)
            widths[i] = current + grow
            used += grow
    return widths


def fitted_table(columns: Sequence[Column], claims: Sequence[Claim], width: int | None,
                 title: str | None = None) -> tuple[PlainTable, list[str]]:
    """A table of `columns` (in their order) that fits `width` cells, and the headers of
    the columns left out that had something in them; `width` None: every column whole,
    folded where the page is too narrow (not a terminal)."""
    if width is None:
        return PlainTable([DrawnColumn(c.header, c.cells, None, c.justify, "fold",
                                       no_wrap=False)
                           for c in columns], title), []
    widths = allot([c.least for c in columns], [c.whole for c in columns], claims, width)
    kept = []
    for column, w in zip(columns, widths, strict=True):
        if w is None:
            continue
        wraps = column.narrow == "wrap"
        kept.append(DrawnColumn(
            wrap_name(column.header, w),
            shorten(column.cells, w) if column.narrow == "shorten" else column.cells, w,
            column.justify, "fold" if wraps else "ellipsis", no_wrap=not wraps))
    # a column with nothing in it is left out without a word: nothing is missing
    return PlainTable(kept, title), [c.header for c, w in zip(columns, widths, strict=True)
                                     if w is None and any(c.cells)]


def hidden_note(hidden: Sequence[str], width: int, remedy: str = "") -> str:
    """One line of at most `width` cells (where it can) saying which columns a table left
    out at `width` columns, as many named as fit, and `remedy`."""
    many = f"{len(hidden)} columns" if len(hidden) > 1 else "1 column"
    said = f"{many} hidden at {width} columns"
    tries = [(named, tail) for tail in ([f"; {remedy}"] if remedy else []) + [""]
             for named in range(len(hidden), 0 if tail else -1, -1)]
    for named, tail in tries:
        names = ", ".join([*hidden[:named], *(["…"] if named < len(hidden) else [])])
        line = f"({said}: {names}{tail})" if named else f"({said}{tail})"
        if cell_len(line) <= width:
            return line
    return f"({many} hidden)"
