"""A rank's shipper in ship mode (`tracklake._ops.ship`): a thread of the writer process
that moves the rank's records from the node-local folder into the store's root every
`interval` seconds and keeps the attempt's heartbeat in the root, so that the root sees
the writer alive exactly while its records arrive. The training loop never waits on it:
the root's file system is touched only by this thread (and `finish()`'s last round).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tracklake._format import StreamId
from tracklake._format.layout import local_base
from tracklake._format.seconds import seconds_from_env
from tracklake._write.failures import say

if TYPE_CHECKING:
    from tracklake._ops.ship import ShipReport

#: The setting that turns ship mode on: the node-local folder ranks write to.
LOCAL_ROOT_ENV = "TRACKLAKE_LOCAL_ROOT"

#: Seconds between shipping rounds (a live run shows in the root this much after a
#: flush), and the setting that changes it.
SHIP_INTERVAL = 1.0
SHIP_INTERVAL_ENV = "TRACKLAKE_SHIP_INTERVAL"


def ship_folder(local_root: str | os.PathLike[str] | None, root: Path) -> Path | None:
    """The node-local folder this process writes the store at `root` to, in ship mode:
    `local_root`, else $TRACKLAKE_LOCAL_ROOT (unset or empty: None, ship mode off). A
    folder inside the store, or holding it, is refused (ValueError naming both)."""
    given = os.fspath(local_root) if local_root is not None else os.environ.get(
        LOCAL_ROOT_ENV, "")
    if not given:
        return None
    seconds_from_env(SHIP_INTERVAL_ENV, SHIP_INTERVAL)  # a bad setting: before any write
    local = Path(os.path.abspath(given))
    shared = Path(os.path.abspath(root))
    for one, other in ((local, shared), (Path(os.path.realpath(local)),  # links followed
                                         Path(os.path.realpath(shared)))):
        if one == other or other in one.parents or one in other.parents:
            raise ValueError(f"ship mode: the node-local folder {local} and the store "
                             f"{shared} must be apart ({LOCAL_ROOT_ENV} or "
                             "init(local_root=...))")
    base = local_base(local, shared)
    try:
        base.mkdir(parents=True, exist_ok=True)  # before anything is written to the store
    except OSError as exc:
        raise OSError(exc.errno, f"ship mode: cannot use the node-local folder {local} "
                      f"({LOCAL_ROOT_ENV}): {exc.strerror}") from exc
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"ship mode: the node-local folder {base} is not writable "
                              f"({LOCAL_ROOT_ENV})")
    return base


class ShipThread:
    """Ships the streams `own` (and, once at start and at the end, leftovers of writers
    of this node that are gone) from `local` into `root`."""

    def __init__(self, local: Path, root: Path, own: Iterable[StreamId], *,
                 heartbeat: Callable[[], None], heartbeat_interval: float = 30.0,
                 interval: float | None = None, fsync: bool = True,
                 on_failure: Callable[[Exception], None]) -> None:
        from tracklake._ops.ship import Shipper

        self.local = local
        self.root = root
        self._shipper = Shipper(local, root, own=own, fsync=fsync)
        self._heartbeat = heartbeat
        self._heartbeat_interval = heartbeat_interval
        self._interval = interval if interval is not None else max(
            0.05, seconds_from_env(SHIP_INTERVAL_ENV, SHIP_INTERVAL))
        self._on_failure = on_failure
        self._lock = threading.Lock()  # one round at a time
        self._stop = threading.Event()
        self._beat_at = time.monotonic()
        self._leftovers = True  # the first round also ships what dead writers left
        self._said: set[str] = set()
        self.failing: Exception | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"tracklake-ship-{root.name}")
        try:
            self._thread.start()
        except BaseException:
            self._shipper.close()  # the claims go back: `tracklake ship` may take them
            raise

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._round()

    def _round(self) -> bool:
        """One shipping round; True if it went through (the root answered)."""
        with self._lock:
            try:
                report = self._shipper.ship(leftovers=self._leftovers)
            except Exception as exc:  # the root failing, or a bug of ours: never the end
                if self.failing is None:  # counted, and said the first time
                    self._on_failure(exc)
                self.failing = exc
                return False
            self._leftovers = False
            if self.failing is not None:
                say(f"tracklake: shipping into {self.root} works again")
                self.failing = None
            self._report(report)
            if time.monotonic() - self._beat_at >= self._heartbeat_interval:
                self._beat_at = time.monotonic()
                try:
                    self._heartbeat()
                except OSError as exc:
                    self._on_failure(exc)
            return True

    def refresh_claims(self) -> None:
        """Refresh the claims of this writer's streams (called from the writer's thread,
        which never waits on the root, so a hung root does not let them stand still)."""
        self._shipper.refresh_own()

    def _report(self, report: ShipReport) -> None:
        for problem in report.problems:
            if problem not in self._said:
                self._said.add(problem)
                say(f"tracklake: {problem}")

    def finish(self, deadline: float) -> bool:
        """Stop the thread, ship what is left (leftovers too) and end this shipper's
        segments in the root; True if nothing is left on local disk to ship. By
        `deadline` (time.monotonic()) at the latest, as far as the root answers."""
        self._stop.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            return False  # a round is stuck in the root's file system
        self._leftovers = True
        shipped = self._round()
        while not shipped and time.monotonic() + self._interval <= deadline:
            time.sleep(self._interval)
            shipped = self._round()
        try:  # no round runs any more: the claims go back, for `tracklake ship`
            self._shipper.close()
        except OSError as exc:
            self._on_failure(exc)
            return False
        return shipped
