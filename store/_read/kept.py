"""What a reading process derived from a file or directory, kept while it stays the
one read: its identity (device, inode, mtime, and size for a file) unchanged, and its
mtime older than `RACY_SECONDS` (a change within one coarse mtime tick would keep it).
Tracklake replaces such files by a rename (a new inode) and changes such directories
by adding, removing or renaming names (a new mtime)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class Kept(Generic[T]):
    """At most `most` values, by path, and values of at most `most_bytes` in all if
    given (each as large as `keep` is told); the oldest goes first. Safe across
    threads."""

    def __init__(self, most: int, most_bytes: int | None = None) -> None:
        self.most = most
        self.most_bytes = most_bytes
        self.values: dict[str, tuple[tuple[int, ...], T, int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str, identity: tuple[int, ...]) -> T | None:
        """The value kept for `path` if it was kept with this `identity`."""
        with self._lock:
            known = self.values.get(path)
        return known[1] if known is not None and known[0] == identity else None

    def keep(self, root: Path, path: str, st: os.stat_result, identity: tuple[int, ...],
             value: T, nbytes: int = 0) -> None:
        """Keep `value` (of `nbytes`) for `path` (stat'ed as `st` before it was read),
        unless its mtime is too recent, by the clock of the store at `root`, to tell a
        later change from it."""
        from tracklake._format.store_clock import store_now_ns
        from tracklake._read.decoded import RACY_SECONDS  # decoded reads through location

        budget = self.most_bytes
        if (budget is not None and nbytes > budget) or \
                st.st_mtime_ns >= store_now_ns(root) - int(RACY_SECONDS * 1e9):
            return
        with self._lock:
            gone = self.values.pop(path, None)
            self._bytes -= gone[2] if gone is not None else 0
            while self.values and (len(self.values) >= self.most or (
                    budget is not None and self._bytes + nbytes > budget)):
                self._bytes -= self.values.pop(next(iter(self.values)))[2]
            self.values[path] = (identity, value, nbytes)
            self._bytes += nbytes
