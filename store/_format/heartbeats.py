"""What this host has seen of the heartbeats of writers it cannot probe.

A writer on another host (or in another PID namespace) can be judged only by its
heartbeat, and comparing its clock with ours is wrong when the two differ: a writer
whose clock is two hours behind looks two hours silent. So the heartbeat is judged by
its own progress: this host notes, by its own clock, when it first saw each value of a
writer's `heartbeat_at`; a writer whose value has stood still for longer than the limit,
as watched from here, has stopped. The notes live in
``ROOT/.cache/heartbeats/<host digest>.json`` (one file per observing host, so no two
clocks meet), read as untrusted input: bounded in size, owned by this user, any entry
that does not fit ignored; where the store is read-only they stay in memory.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import platform
import threading
import time
from pathlib import Path

from tracklake._format import bounded_json
from tracklake._format.files import read_state, write_state

WATCH_DIR = Path(".cache") / "heartbeats"
MAX_WATCH_BYTES = 8 << 20
MAX_ENTRIES = 100_000
#: Written at most this often by a process that keeps observing (and once at exit).
_SAVE_EVERY = 2.0

_lock = threading.Lock()
_watches: dict[Path, HeartbeatWatch] = {}


def watch_file(root: Path) -> Path:
    digest = hashlib.sha256(platform.node().encode()).hexdigest()[:16]
    return root / WATCH_DIR / f"{digest}.json"


class HeartbeatWatch:
    """Since when (this host's clock) each writer's heartbeat has had its current value."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: dict[str, tuple[str, float]] = _load(path)
        self._dirty = False
        self._saved_at = 0.0

    def unchanged_for(self, key: str, beat: str, now: float) -> float:
        """Seconds this host has seen `beat` as `key`'s heartbeat (0 the first time)."""
        with _lock:
            seen = self._seen.get(key)
            if seen is not None and seen[0] == beat and seen[1] <= now:
                return now - seen[1]
            self._seen[key] = (beat, now)
            while len(self._seen) > MAX_ENTRIES:
                self._seen.pop(next(iter(self._seen)))
            self._dirty = True
        if time.monotonic() - self._saved_at >= _SAVE_EVERY:
            self.save()
        return 0.0

    def save(self) -> None:
        """Write the notes (nothing when unchanged; kept in memory if the store is
        read-only or full)."""
        with _lock:
            if not self._dirty:
                return
            data = json.dumps({k: list(v) for k, v in self._seen.items()}).encode()
            self._dirty = False
            self._saved_at = time.monotonic()
        with contextlib.suppress(OSError):
            write_state(_root_of(self.path), _rel(self.path), data)


def _root_of(path: Path) -> Path:
    """The store root of a `watch_file` path."""
    return path.parents[len(WATCH_DIR.parts)]


def _rel(path: Path) -> str:
    return f"{WATCH_DIR.as_posix()}/{path.name}"


def _load(path: Path) -> dict[str, tuple[str, float]]:
    try:
        if os.lstat(path).st_uid != os.geteuid():
            return {}  # planted by someone else: their notes could age a live writer
        raw = bounded_json.loads(read_state(_root_of(path), _rel(path), MAX_WATCH_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    seen: dict[str, tuple[str, float]] = {}
    for key, value in list(raw.items())[-MAX_ENTRIES:]:
        if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                and isinstance(value[1], (int, float)) and not isinstance(value[1], bool)):
            seen[key] = (value[0], float(value[1]))
    return seen


def heartbeat_watch(root: Path) -> HeartbeatWatch:
    """This process's watch of the store at `root` (loaded once, saved as it changes)."""
    root = Path(os.path.abspath(root))
    with _lock:
        watch = _watches.get(root)
        if watch is None:
            watch = _watches[root] = HeartbeatWatch(watch_file(root))
    return watch


@atexit.register
def _save_all() -> None:
    for watch in list(_watches.values()):
        watch.save()
