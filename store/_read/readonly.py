"""Read-only SQL, twice: a DuckDB connection that cannot touch a file, and a statement
check (only SELECT, and EXPLAIN / DESCRIBE / SUMMARIZE of one) as the second layer."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from tracklake._errors import QueryError

if TYPE_CHECKING:
    import duckdb

_ALLOWED_STATEMENTS = {"SELECT", "EXPLAIN", "RELATION"}


#: The environment variable that sets how much memory one query may use (a DuckDB size
#: such as "8GB"); by default a quarter of the machine's memory.
MEMORY_ENV = "TRACKLAKE_SQL_MEMORY_LIMIT"
_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.IGNORECASE)


def memory_limit() -> str:
    """The memory one query may use: $TRACKLAKE_SQL_MEMORY_LIMIT, else a quarter of this
    machine's memory (a query past it fails with DuckDB's out-of-memory error, and nothing
    spills to disk: the connection may not write files)."""
    given = os.environ.get(MEMORY_ENV, "").strip()
    if given:
        if not _SIZE.match(given):
            raise QueryError(f"{MEMORY_ENV}={given!r} is not a size such as '8GB' or '512MiB'")
        return given
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 << 30
    return f"{max(total // 4, 256 << 20) >> 20}MiB"


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No file access at all (the views read through pyarrow), and no way to turn it on:
    whatever a statement asks, DuckDB can neither write nor read a file; and a memory limit
    no statement can raise."""
    con.execute(f"SET memory_limit = '{memory_limit()}'")
    con.execute("SET enable_progress_bar = false")  # never drawn into a caller's output
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def check_read_only(sql: str) -> None:
    """Raise QueryError unless every statement in `sql` only reads (an EXPLAIN is judged
    by the statement it explains). A second layer: the connection cannot write anyway."""
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"SQL does not parse: {exc}") from exc
    if not statements:
        raise QueryError("no SQL statement given")
    for st in statements:
        kind = st.type.name
        if kind not in _ALLOWED_STATEMENTS:
            raise QueryError(f"{_leading_keyword(st.query) or kind} statements are refused: "
                             "queries over the store are read-only (only SELECT, WITH, "
                             "EXPLAIN and the like run)")
        if kind == "EXPLAIN":
            check_read_only(_explained(st.query))


def _code_tokens(sql: str) -> list[tuple[int, str]]:
    """(offset, text) of each token of `sql` that is not a comment."""
    import duckdb

    tokens = duckdb.tokenize(sql)
    out = []
    for i, (start, kind) in enumerate(tokens):
        if kind == duckdb.token_type.comment:
            continue
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)
        out.append((start, sql[start:end].strip()))
    return out


def _leading_keyword(sql: str) -> str:
    tokens = _code_tokens(sql)
    return tokens[0][1].upper() if tokens else ""


def _explained(sql: str) -> str:
    """The statement an `EXPLAIN [ANALYZE] [(options)] statement` explains."""
    tokens = _code_tokens(sql)
    i = 1  # past EXPLAIN
    if i < len(tokens) and tokens[i][1].upper() == "ANALYZE":
        i += 1
    if i < len(tokens) and tokens[i][1].startswith("("):
        depth = 0
        while i < len(tokens):
            depth += tokens[i][1].count("(") - tokens[i][1].count(")")
            i += 1
            if depth <= 0:
                break
    if i >= len(tokens):
        raise QueryError(f"EXPLAIN of nothing: {sql!r}")
    return sql[tokens[i][0]:]
