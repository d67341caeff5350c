"""What following a store costs: passes paced by time, not by file events.

A trainer flushes a few times a second and every flush is several file events; a pass per
event made a follower next to a training loop cost CPU in proportion to how often files
change. Here an event only sets a flag: a pass starts when the flag is set or the poll
interval has gone by, and never sooner than `gap` seconds after the previous pass ended.
Within a pass, a run whose files (names, sizes, modification times) and status are as at
its last complete delivery is not read again (`Unchanged`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracklake.exporters._protocol import RunInfo
from tracklake.read import run_files


class Pacer:
    """Wakes a following loop at most once per `gap` seconds after a pass ended: on a
    file event under `root` (watchdog), else every `poll_interval` seconds; polling covers
    file systems where events never come (NFS, Lustre, other nodes' writes)."""

    def __init__(self, root: Path, *, poll_interval: float, gap: float,
                 log: Callable[[str], None]) -> None:
        self.root = root
        self.poll_interval = poll_interval
        self.gap = min(gap, poll_interval)
        self.log = log
        self.events = 0  # file events seen (each only sets the flag)
        self._wake = threading.Event()
        self._observer: Any = None

    def start(self) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            self.log("watchdog is not installed: following by polling every "
                     f"{self.poll_interval} s")
            return
        pacer = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if "/exports/" not in str(getattr(event, "src_path", "")):
                    pacer.events += 1
                    pacer._wake.set()

        observer = Observer()
        observer.schedule(Handler(), str(self.root), recursive=True)
        observer.daemon = True
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer = None

    def wait(self) -> None:
        """Return when the next pass may start (called right after a pass ended)."""
        ended = time.monotonic()
        self._wake.wait(self.poll_interval)
        rest = ended + self.gap - time.monotonic()
        if rest > 0:
            time.sleep(rest)  # events meanwhile are covered by the pass that follows
        self._wake.clear()


class Unchanged:
    """Remembers, per run, its files and status at its last complete delivery, so that a
    pass skips a run where nothing happened since."""

    def __init__(self, root: Path, kinds: tuple[str, ...]) -> None:
        self.root = root
        self.kinds = kinds
        self._seen: dict[str, tuple[Any, ...]] = {}

    def look(self, info: RunInfo) -> tuple[Any, ...] | None:
        """What the run looks like now (None: cannot tell, read it)."""
        files = run_files(self.root, info.project, info.run, self.kinds)
        return None if files is None else (info.status, info.attempts, files)

    def since_delivered(self, info: RunInfo, look: tuple[Any, ...] | None) -> bool:
        """True if the run looks as it did when last delivered completely."""
        return look is not None and self._seen.get(info.key) == look

    def delivered(self, info: RunInfo, look: tuple[Any, ...] | None) -> None:
        """The run was delivered completely as it looked at `look` (taken before reading,
        so that whatever was written during the delivery is read on the next pass)."""
        if look is not None:
            self._seen[info.key] = look

    def forget(self, info: RunInfo) -> None:
        self._seen.pop(info.key, None)
