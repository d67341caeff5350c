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
from pathlib import Path

from tracklake._format.files import create_new, scratch, store_dir

#: A measured difference is measured again after this long (a host's clock is set).
MEASURE_EVERY_SECONDS = 600.0
#: Stores whose difference a process keeps (a dashboard or notebook reads few).
_KEPT_STORES = 16

_lock = threading.Lock()
#: absolute root -> (monotonic time measured, the store's clock minus this host's, ns)
_measured: dict[str, tuple[float, int]] = {}


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
    key = os.path.abspath(root)
    now = time.monotonic()
    with _lock:
        known = _measured.get(key)
    if known is not None and now - known[0] < MEASURE_EVERY_SECONDS:
        return known[1]
    skew = _measure(Path(key))
    with _lock:
        _measured.pop(key, None)
        while len(_measured) >= _KEPT_STORES:
            _measured.pop(next(iter(_measured)))
        _measured[key] = (now, skew)
    return skew


def _measure(root: Path) -> int:
    """The mtime the file system gives a file created in ``root/.cache`` minus this
    host's clock, read just before and just after (0 if the file cannot be made). Its
    estimate errs towards a store clock earlier than the real one, which only delays
    what is kept: a coarse mtime is rounded down, and the host's time is taken at the
    end of the creation if the store's is ahead and at its start if behind."""
    directory = root / ".cache"
    probe = scratch(directory / "clock", ".")
    try:
        if not os.path.isdir(root / "runs"):
            return 0  # not a store (yet): make nothing there
        store_dir(root, directory)
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
