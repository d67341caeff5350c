"""Temporaries left by killed processes: a file written aside as ``.NAME.PID.tmp`` and
renamed into place, that its process never renamed.

One is taken to be left over once it has not changed for `STALE_SECONDS` and its process
is gone from this host; the operation that made it removes such leftovers in the
directories it writes, and fsck reports (and with --repair quarantines) any that remain.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from tracklake._format.liveness import process_alive

#: `.NAME.PID.tmp` (a file written aside, then renamed into place) and `.sort.HOST.PID.tmp`.
_TEMPORARY = re.compile(r"^\..+\.(\d+)\.tmp$")
#: A temporary unchanged this long whose process is gone was left by a killed process.
STALE_SECONDS = 600.0


def left_over(path: Path, now: float | None = None) -> tuple[int, float] | None:
    """(pid, age in seconds) if `path` is a temporary left by a killed process; None if
    it is no temporary, is recent, or its process still runs. `now`: the time by the
    clock that stamps the store's mtimes (`store_clock`), this host's if not given."""
    m = _TEMPORARY.match(path.name)
    if m is None:
        return None
    try:
        age = (time.time() if now is None else now) - path.lstat().st_mtime
    except FileNotFoundError:
        return None
    pid = int(m.group(1))
    if age <= STALE_SECONDS or process_alive(pid):
        return None
    return pid, age


def remove_left_over(directory: Path, now: float | None = None) -> int:
    """Delete the regular files in `directory` that are temporaries left by killed
    processes (never a link's target, never a directory; `now` as for `left_over`); how
    many."""
    return remove_files(directory, lambda path: left_over(path, now) is not None)


def remove_files(directory: Path, chosen: Callable[[Path], bool]) -> int:
    """Delete the regular files in `directory` that `chosen` picks (never a link's
    target, never a directory); how many. A directory that is gone holds none."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for entry in entries:
        path = Path(entry.path)
        if entry.is_file(follow_symlinks=False) and chosen(path):
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    path.unlink()
                    removed += 1
    return removed
