"""Tables drawn without rich's layout (`tracklake._cli.drawn_table`) print exactly what rich's
`Table` prints for the same columns: on a terminal (styles, box) and off it, cut with an
ellipsis, justified, headers over several lines; rich draws what is not plain."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tracklake._cli.drawn_table import DrawnColumn, PlainTable

plain = st.text(alphabet="ab Z/.-_:0189…▁█", max_size=14)
odd = st.text(alphabet="ab é漢\t\x1b", max_size=6)


def printed(renderable: object, *, width: int, terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=terminal, markup=False,
                      emoji=False, color_system="standard" if terminal else None,
                      legacy_windows=False, soft_wrap=False, _environ={})
    console.print(renderable)
    return out.getvalue()


@st.composite
def tables(draw: st.DrawFn, cells: st.SearchStrategy[str]) -> PlainTable:
    rows = draw(st.integers(0, 5))
    columns = []
    for _ in range(draw(st.integers(1, 6))):
        width = draw(st.none() | st.integers(1, 12))
        header = draw(st.lists(st.text(alphabet="ab cd/", max_size=12), min_size=1,
                               max_size=3 if width else 1))
        wraps = width is None and draw(st.booleans())  # (off a terminal: folded if too wide)
        columns.append(DrawnColumn(
            "\n".join(header), draw(st.lists(cells, min_size=rows, max_size=rows)), width,
            draw(st.sampled_from(["left", "right"])), "fold" if wraps else "ellipsis",
            no_wrap=not wraps))
    title = draw(st.none() | st.text(alphabet="runs in /tmp.x", min_size=1, max_size=60))
    return PlainTable(columns, title)


@settings(max_examples=400, deadline=None)
@given(tables(plain) | tables(plain | odd), st.integers(10, 120), st.booleans())
def test_a_table_prints_as_rich_prints_it(table: PlainTable, width: int, terminal: bool
                                         ) -> None:
    assert printed(table, width=width, terminal=terminal) == \
        printed(table.rich(), width=width, terminal=terminal)


def test_a_plain_table_is_drawn_here_and_styled_as_rich_styles_it() -> None:
    table = PlainTable([
        DrawnColumn("run", ["tiny-1", "a-much-longer-run-name"], 10),
        DrawnColumn("last\nstep", ["12", "300 "], 5, "right"),
        DrawnColumn("trend", ["▁▂█", ""], None)], title="runs in /x")
    console = Console(file=io.StringIO(), width=80)
    assert table._lines(console, console.options) is not None  # not handed to rich
    on_terminal = printed(table, width=80, terminal=True)
    assert on_terminal == printed(table.rich(), width=80, terminal=True)
    assert "\x1b[1m step\x1b[0m" in on_terminal and "\x1b[3m" in on_terminal  # bold, italic
    assert printed(table, width=80, terminal=False).splitlines() == [
        "          runs in /x          ",
        "┏━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━┓",
        "┃            ┃  last ┃       ┃",
        "┃ run        ┃  step ┃ trend ┃",
        "┡━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━┩",
        "│ tiny-1     │    12 │ ▁▂█   │",
        "│ a-much-lo… │   300 │       │",
        "└────────────┴───────┴───────┘"]


@pytest.mark.parametrize("why", ["wide", "odd", "title", "wraps", "no columns"])
def test_what_is_not_plain_is_drawn_by_rich(why: str) -> None:
    column = DrawnColumn("key", ["k"], 5, overflow="fold", no_wrap=False) \
        if why == "wraps" else DrawnColumn("key", ["漢字" if why == "odd" else "k"], None)
    table = PlainTable([column] * {"wide": 40, "no columns": 0}.get(why, 1),
                       title="a title longer than the table" if why == "title" else None)
    console = Console(file=io.StringIO(), width=80)
    assert table._lines(console, console.options) is None
    assert printed(table, width=80, terminal=False) == \
        printed(table.rich(), width=80, terminal=False)
