"""Read-only SQL, twice: a DuckDB connection that cannot touch a file, and a statement
check (only SELECT, and EXPLAIN / DESCRIBE / SUMMARIZE of one) as the second layer."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections.abc import Iterator
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
    if _giving_back:
        for setting in _GIVE_BACK:
            con.execute(setting)
    con.execute("SET lock_configuration = true")


#: DuckDB keeps what its threads free, up to 512 MiB, for its next allocations; a
#: long-lived server that answers in bursts gives it back instead (`tracklake ui` after a
#: page of fifty charts of a thousand runs: 0.96-1.35 GiB resident before, 0.68-0.73 after;
#: docs/performance.md).
_GIVE_BACK = ("SET allocator_flush_threshold = '8MiB'",
              "SET allocator_bulk_deallocation_flush_threshold = '16MiB'",
              "SET allocator_background_threads = true")
_giving_back = False


def free_memory_promptly() -> None:
    """For a process that lives long and answers in bursts (`tracklake ui`), not for a
    library's caller: DuckDB's freed memory is given back to the system by a background
    thread (`_GIVE_BACK`), and pyarrow allocates from the system's allocator rather than
    its default pool, whose pages freed by a request's thread stay with that thread's heap
    once it ends (the server answers each request on a thread of its own). Call it before
    the first question (a database made before keeps DuckDB's defaults)."""
    import pyarrow as pa

    global _giving_back
    _giving_back = True
    pa.set_memory_pool(pa.system_memory_pool())


#: This process's in-memory database for questions, with the memory limit it was made
#: with: `question_connection`.
_DATABASE: tuple[str, duckdb.DuckDBPyConnection] | None = None
_DATABASE_LOCK = threading.Lock()
#: Databases of a parent process: closing one in a forked child would wait for threads
#: that do not run there.
_FORKED_AWAY: list[duckdb.DuckDBPyConnection] = []


def question_connection() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's in-memory database, locked down once
    (`lock_down`): opening a database of its own costs a question 12 ms and closing it
    2.5 ms, a connection to this one 0.01 ms. What a question registers and its (TEMP)
    views are its connection's own, gone when it closes (a question about one run may
    leave its connection to the next about it: `kept_connections`); the memory limit
    holds for the process's questions together. A forked child, or another limit, gets
    its own."""
    import duckdb

    global _DATABASE
    limit = memory_limit()
    with _DATABASE_LOCK:
        if _DATABASE is None or _DATABASE[0] != limit:
            database = duckdb.connect(":memory:")
            lock_down(database)
            _DATABASE = (limit, database)
        return _DATABASE[1].cursor()


@contextlib.contextmanager
def parsing() -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to parse SQL with (`extract_statements`, `get_table_names`,
    `json_serialize_sql`): one to the question database, rather than DuckDB's module-level
    default connection or one of its own, so that a process opens one database, not three
    (12-21 ms each: a third of what a CLI question spends past its imports)."""
    con = question_connection()
    try:
        yield con
    finally:
        con.close()


def _forget_database() -> None:
    global _DATABASE, _DATABASE_LOCK
    if _DATABASE is not None:
        _FORKED_AWAY.append(_DATABASE[1])
    _DATABASE, _DATABASE_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_database)


@functools.lru_cache(maxsize=256)
def parsed_statements(sql: str) -> tuple[duckdb.Statement, ...]:
    """Each statement of `sql` as DuckDB's parser gives it (`duckdb.Error` if it does not
    parse), kept for the last texts asked: a question asked again, as a dashboard asks,
    is parsed once. A connection given a parsed statement runs a copy of it (it binds
    that copy), so one is run again, and from many threads at once, as its text would
    be."""
    with parsing() as parser:
        return tuple(parser.extract_statements(sql))


@functools.lru_cache(maxsize=256)
def statements_of(sql: str) -> tuple[tuple[str, str], ...]:
    """(kind, text) of each statement of `sql` (`parsed_statements`)."""
    return tuple((st.type.name, st.query) for st in parsed_statements(sql))


def check_read_only(sql: str) -> None:
    """Raise QueryError unless every statement in `sql` only reads (an EXPLAIN is judged
    by the statement it explains). A second layer: the connection cannot write anyway."""
    import duckdb

    try:
        statements = statements_of(sql)
    except duckdb.Error as exc:
        raise QueryError(f"SQL does not parse: {exc}") from exc
    if not statements:
        raise QueryError("no SQL statement given")
    for kind, text in statements:
        if kind not in _ALLOWED_STATEMENTS:
            raise QueryError(f"{_leading_keyword(text) or kind} statements are refused: "
                             "queries over the store are read-only (only SELECT, WITH, "
                             "EXPLAIN and the like run)")
        if kind == "EXPLAIN":
            check_read_only(_explained(text))


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
