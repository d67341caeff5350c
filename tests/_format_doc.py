"""The code blocks of docs/format.md, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "format.md"
_NAMED = re.compile(r"-- ([a-z_]+): (.*)\n")


def blocks(language: str) -> list[str]:
    """Every fenced block of `language`, in the order of the page."""
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def block_with(language: str, text: str) -> str:
    """The one block of `language` that contains `text`."""
    (found,) = [b for b in blocks(language) if text in b]
    return found


def reference_views() -> list[tuple[str, str]]:
    """(name, query) of each reference view, in the order the page defines them."""
    views = []
    for block in blocks("sql"):
        m = _NAMED.match(block)
        if m and m.group(1) != "question":
            views.append((m.group(1), block[m.end():]))
    return views


def questions() -> dict[str, str]:
    """The page's example questions: description -> SQL."""
    found = {}
    for block in blocks("sql"):
        m = _NAMED.match(block)
        if m and m.group(1) == "question":
            found[m.group(2)] = block[m.end():]
    return found
