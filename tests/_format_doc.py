"""The code blocks of docs/format.md, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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


def exec_python(text: str, root: Path, scope: dict[str, Any]) -> None:
    """Run the page's Python block containing `text` for the store at `root`, in `scope`,
    after the page's listing rule (`part_files`), as the page's reader would."""
    if "part_files" not in scope:
        exec(block_with("python", "def part_files(").replace("ROOT", str(root)), scope)
    exec(block_with("python", text).replace("ROOT", str(root)), scope)


def set_listings(con: Any, root: Path, kinds: tuple[str, ...]) -> None:
    """Set each kind's `KIND_files` variable on DuckDB connection `con`, as the page says."""
    listing = block_with("sql", "SET VARIABLE metrics_files").replace("ROOT", str(root))
    for kind in kinds:
        con.execute(listing.replace("metrics", kind))
