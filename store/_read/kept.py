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
    """At most `most` values, by path; the oldest goes first. Safe across threads."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.values: dict[str, tuple[tuple[int, ...], T]] = {}
        self._lock = threading.Lock()

    def get(self, path: str, identity: tuple[int, ...]) -> T | None:
        """The value kept for `path` if it was kept with this `identity`."""
        with self._lock:
            known = self.values.get(path)
        return known[1] if known is not None and known[0] == identity else None

    def keep(self, root: Path, path: str, st: os.stat_result, identity: tuple[int, ...],
             value: T) -> None:
        """Keep `value` for `path` (stat'ed as `st` before it was read), unless its mtime
        is too recent, by the clock of the store at `root`, to tell a later change from
        it."""
        from tracklake._format.store_clock import store_now_ns
        from tracklake._read.decoded import RACY_SECONDS  # decoded reads through location

        if st.st_mtime_ns >= store_now_ns(root) - int(RACY_SECONDS * 1e9):
            return
        with self._lock:
            while len(self.values) >= self.most:
                self.values.pop(next(iter(self.values)))
            self.values[path] = (identity, value)
