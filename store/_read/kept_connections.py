"""A question's connection kept, with its tables and views, for the next question about
the same run, while the tables it was made of are the very ones the next question would
register.

Registering a table and making a view each cost a question about 0.3 ms on DuckDB 2.0,
and DuckDB scans a table of its own faster than a registered Arrow table (0.77 against
0.97 ms for one run's history of one key, 1,000 runs of 200 steps x 16 keys): a
notebook or a dashboard asking about one run again and again paid both each time. Only
the connections of questions about one run whose views read nothing but that run's
parts read whole (`run_table`) are kept: those tables are kept by `run_table` while the
parts are the files it read (device, inode, size, mtime, past the racy window), so the
same table object means the same verified rows. The attempt files, live tails and
metric summaries (made afresh by every question) are never in a kept connection.

A kept connection is taken out while a question uses it (one question at a time), and
given back only after a question answered on it; at most `MOST` of them, holding at
most `MOST_BYTES` of tables in all, are kept; the oldest is closed first.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

#: Kept connections at most, and the bytes of the tables they hold at most.
MOST = 8
MOST_BYTES = 64 << 20


class _Entry(NamedTuple):
    connection: duckdb.DuckDBPyConnection
    tables: tuple[pa.Table, ...]
    nbytes: int


#: Kept connections by what they were made for (the store, the run, the kinds, the
#: database's memory limit); the oldest first.
_kept: dict[tuple[object, ...], _Entry] = {}
_lock = threading.Lock()
#: Connections of a parent process: closing one in a forked child would wait for threads
#: that do not run there.
_forked_away: list[_Entry] = []
#: The connections in use that may be given back: by connection, what they were made for.
_lent: dict[duckdb.DuckDBPyConnection, tuple[tuple[object, ...], _Entry]] = {}


def take(key: tuple[object, ...], tables: tuple[pa.Table, ...]
         ) -> duckdb.DuckDBPyConnection | None:
    """The connection kept for `key` if it was made of exactly `tables` (the same
    objects), taken out until `give_back`; None otherwise (one made of other tables is
    closed)."""
    with _lock:
        entry = _kept.pop(key, None)
    if entry is None:
        return None
    if len(entry.tables) != len(tables) or \
            any(a is not b for a, b in zip(entry.tables, tables, strict=True)):
        entry.connection.close()
        return None
    with _lock:
        _lent[entry.connection] = (key, entry)
    return entry.connection


def lend(key: tuple[object, ...], connection: duckdb.DuckDBPyConnection,
         tables: tuple[pa.Table, ...]) -> None:
    """Let `connection`, just made of `tables` for `key`, be given back after use."""
    entry = _Entry(connection, tables, sum(t.nbytes for t in tables))
    if entry.nbytes <= MOST_BYTES:
        with _lock:
            _lent[connection] = (key, entry)


def give_back(connection: duckdb.DuckDBPyConnection, answered: bool) -> bool:
    """Keep `connection` for its key if it was lent and its question `answered`; False if
    it is not kept (the caller closes it)."""
    with _lock:
        lent = _lent.pop(connection, None)
    if lent is None or not answered:
        return False
    key, entry = lent
    closing = []
    with _lock:
        if key in _kept:  # a question beside this one made another: keep the newer
            closing.append(_kept.pop(key))
        _kept[key] = entry
        held = sum(e.nbytes for e in _kept.values())
        while len(_kept) > MOST or held > MOST_BYTES:
            oldest = _kept.pop(next(iter(_kept)))
            held -= oldest.nbytes
            closing.append(oldest)
    for old in closing:
        old.connection.close()
    return True


def _forget() -> None:
    global _lock
    _forked_away.extend(_kept.values())
    _kept.clear()
    _lent.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget)
