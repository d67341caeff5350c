"""A derived cache of what reading decodes from files that are replaced, never edited:
attempt records (validated) and compacted parts (footer verified, metric summary).

Listing runs or connecting re-reads every attempt file and every part footer otherwise.
The cache is one JSON file, ``ROOT/.cache/decoded-v1.json``, mapping a file's path in the
store to ``[size, mtime_ns, decoded value]``; an entry is used only while the file still
has that size and modification time, so the cache is never the only copy of anything and
is rebuilt from the files alone (delete it at any time). Training ranks never read or
write it; readers replace it atomically (`write_atomic`), so concurrent readers on NFS or
Lustre see one whole version or the other and need no lock. A file modified in the last
`RACY_SECONDS` is decoded but not cached: on a file system with coarse timestamps, a
rewrite of the same size within one tick would otherwise look unchanged. The files of
the runs the run catalog holds (catalog.py) are left out: the catalog keeps what they
decode to, and the cache holds only the runs not catalogued yet.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

from tracklake._format import bounded_json
from tracklake._format.files import read_state, write_state
from tracklake._format.store_clock import store_now_ns
from tracklake._read.location import is_url

#: Where the cache lives, relative to the store root: a dot directory, which hive
#: discovery, Parquet globs over the kinds and backups all pass over.
CACHE_FILE = Path(".cache") / "decoded-v1.json"
#: A larger cache file (planted, or not ours) is ignored and written anew. It holds only
#: the runs the run catalog does not (a few, once the catalog is written: at 10,000 runs
#: the whole store's decoded values took 39 MB).
MAX_CACHE_BYTES = 256 << 20
#: The most parsing the cache may allocate (`bounded_json.parse_cost`); a cache that
#: would take more is neither read nor written.
PARSE_BUDGET = 1 << 30
#: Files modified more recently than this are not cached (coarse mtimes on NFS).
RACY_SECONDS = 5.0
#: Version of what an entry holds; a cache of another version is ignored and rebuilt.
#: (2: a part's summary as columns, not one object per key.)
_VERSION = 2


class DecodedCache:
    """Decoded values of a store's files, valid while their size and mtime are unchanged;
    a no-op for a store in an object store (read-only, and no cheap `stat`), and where
    not `kept` (a pass that reads each run once, a catalog file at a time: loading and
    writing the whole cache for each file would cost more than it saves)."""

    def __init__(self, root: Path, kept: bool = True) -> None:
        self.root = root
        self.enabled = kept and not is_url(root)
        self.path = root / CACHE_FILE
        self._prefix = f"{root}{os.sep}"
        # read on first use: when the run catalog answers for every run, never
        self._loaded: dict[str, list[Any]] | None = None if self.enabled else {}
        self._seen: dict[str, list[Any]] = {}
        self._changed = False

    @property
    def _entries(self) -> dict[str, list[Any]]:
        if self._loaded is None:
            self._loaded = self._load()
        return self._loaded

    def _load(self) -> dict[str, list[Any]]:
        """The entries of the cache file: a header line (version, CRC-32 of the rest),
        then the entries as JSON; none if it is missing, of another version or damaged
        (values decoded from checked files are used without checking them again, so a
        damaged cache must not pass for a whole one)."""
        try:
            header, _, body = read_state(self.root, CACHE_FILE.as_posix(),
                                         MAX_CACHE_BYTES).partition(b"\n")
            meta = bounded_json.loads(header[:4096])
            if not isinstance(meta, dict) or meta.get("version") != _VERSION or \
                    meta.get("crc32") != zlib.crc32(body):
                return {}
            files = bounded_json.loads(body, PARSE_BUDGET)
        except (OSError, ValueError):
            return {}  # none yet, unreadable or damaged: a derived cache, rebuilt below
        if not isinstance(files, dict):
            return {}
        return {k: v for k, v in files.items() if isinstance(v, list) and len(v) == 3}

    def get(self, path: Path, decode: Callable[[Path], Any]) -> Any:
        """`decode(path)`, or what it returned before for this file as it is now."""
        if not self.enabled:
            return decode(path)
        key = str(path).removeprefix(self._prefix)
        st = os.stat(path)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            self._seen[key] = entry
            return entry[2]
        value = decode(path)
        # None (an attempt claimed but not written, or damaged and reported) is not kept:
        # the next reader looks again, and reports damage again
        if value is not None and \
                st.st_mtime_ns < store_now_ns(self.root) - int(RACY_SECONDS * 1e9):
            self._seen[key] = [st.st_size, st.st_mtime_ns, value]
            self._changed = True
        return value

    def save(self, complete: bool, vouched: Callable[[], Container[str]] | None = None
             ) -> None:
        """Write the cache if it changed. `complete`: every cached kind of file was looked
        at, so entries not seen are of files that are gone and are dropped. `vouched`:
        the files the run catalog holds what they decode to; their entries are dropped
        too, so that the cache holds only what the catalog does not (at 10,000 runs the
        whole store's was 39 MB of JSON, read and written again by the first question
        after a few runs ended: 1.4 s of its 3.4 s)."""
        if not self.enabled or self._loaded is None:
            return  # never used: nothing changed
        files = self._seen if complete else {**self._entries, **self._seen}
        if vouched is not None and files:
            covered = vouched()
            files = {k: v for k, v in files.items() if k not in covered}
        if not self._changed and files.keys() == self._entries.keys():
            return
        body = json.dumps(files, separators=(",", ":")).encode()
        if len(body) > MAX_CACHE_BYTES or bounded_json.parse_cost(body) > PARSE_BUDGET:
            return  # the next reader would not read it: decoding the files is as good
        header = json.dumps({"version": _VERSION, "crc32": zlib.crc32(body)}).encode()
        try:
            write_state(self.root, CACHE_FILE.as_posix(), header + b"\n" + body, tidy=True)
        except OSError:
            # a store this reader may not write (read-only mount, another user's): the
            # cache only saves time, and every answer was read from the files themselves
            return
        self._loaded = dict(files)
        self._changed = False

