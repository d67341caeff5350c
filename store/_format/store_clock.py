"""Now, by the clock that stamps a store's mtimes.

A reader keeps what it read from a file (the run catalog's entries, decoded attempt files
and summaries, bundle footers, large listings) only once the file's mtime is more than
`RACY_SECONDS` old: a change within one coarse mtime tick would not show. The mtimes of a
store on a file server (NFS, SFTP) are stamped by the server's clock. A reader on a host
whose clock is behind it sees every file written since as written in the future, so for
as long as the two clocks are apart nothing is catalogued and every question pays what
the first does; a reader whose clock is ahead takes a file changed a moment ago for a
settled one.

So a reader measures once, per store and process (again after `MEASURE_EVERY_SECONDS`),
how far the store's clock is from its own: it creates an empty file in ``ROOT/.cache``,
reads the mtime the file system gave it, and removes it. Where it may not write there,
its own clock stands for the store's, as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tracklake._format.files import create_new, scratch, store_dir

#: A measured difference is measured again after this long (a host's clock is set).
MEASURE_EVERY_SECONDS = 600.0
#: Stores whose difference a process keeps (a dashboard or notebook reads few).
_KEPT_STORES = 16

_lock = threading.Lock()
#: (absolute path, how it is measured) -> (monotonic time measured, the clock that
#: stamps its mtimes minus this host's, ns)
_measured: dict[tuple[str, Callable[[Path], int]], tuple[float, int]] = {}


def store_now_ns(root: Path) -> int:
    """This host's time.time_ns() moved by how far `root`'s clock is from it: what a
    file written in `root` now would have as its mtime, or a little less (never more)."""
    return time.time_ns() + store_skew_ns(root)


def store_skew_ns(root: Path) -> int:
    """How far the clock that stamps `root`'s mtimes is ahead of this host's (ns;
    negative if behind), measured once per `MEASURE_EVERY_SECONDS`; 0 for a store in an
    object store, or where this process may not write."""
    if hasattr(root, "fs_path"):
        return 0  # an object store: nothing is kept by mtime there
    return _kept(os.path.abspath(root), _measure_store)


def directory_now_ns(directory: Path) -> int:
    """`store_now_ns` for a directory that is no store (a backup's), measured with a
    probe made in `directory` itself (this host's time where none can be made)."""
    return time.time_ns() + _kept(os.path.abspath(directory), _measure_in)


def _kept(path: str, measure: Callable[[Path], int]) -> int:
    """`measure(path)`, measured again once `MEASURE_EVERY_SECONDS` old."""
    key = (path, measure)
    now = time.monotonic()
    with _lock:
        known = _measured.get(key)
    if known is not None and now - known[0] < MEASURE_EVERY_SECONDS:
        return known[1]
    skew = measure(Path(path))
    with _lock:
        _measured.pop(key, None)
        while len(_measured) >= _KEPT_STORES:
            _measured.pop(next(iter(_measured)))
        _measured[key] = (now, skew)
    return skew


def _measure_store(root: Path) -> int:
    """`_measure_in` ``root/.cache``, made if it is missing (0 if `root` is no store)."""
    if not os.path.isdir(root / "runs"):
        return 0  # not a store (yet): make nothing there
    try:
        store_dir(root, root / ".cache")
    except OSError:
        return 0
    return _measure_in(root / ".cache")


def _measure_in(directory: Path) -> int:
    """The mtime the file system gives a file created in `directory` minus this host's
    clock, read just before and just after (0 if the file cannot be made). Its estimate
    errs towards a clock earlier than the real one, which only delays what is kept and
    what is taken for left over: a coarse mtime is rounded down, and the host's time is
    taken at the end of the creation if the directory's clock is ahead and at its start
    if behind."""
    probe = scratch(directory / "clock", ".")
    try:
        before = time.time_ns()
        with create_new(probe):
            pass
        after = time.time_ns()
        stamped = os.lstat(probe).st_mtime_ns  # after closing: the server's, on NFS
    except OSError:
        return 0
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    if stamped > after:
        return stamped - after
    return min(0, stamped - before)
