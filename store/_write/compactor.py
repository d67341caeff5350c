"""Automatic compaction: the rank's writer thread starts a detached, low-priority process
that compacts this rank's sealed segments, each time a segment is sealed and once more
at `finish()` (docs/format.md, "When compaction runs").

A separate process, not a thread: compaction decodes, sorts and encodes (CPU and memory
that would compete with `log()` for the GIL), and it survives the training process, so
`finish()` never waits for it. The process is `python -m tracklake._ops.auto`, named by
module so that the write path imports nothing of the operations layer. It is spawned
with `posix_spawn` in a new session (no fork of a large training process, no shared
terminal signals), its output to /dev/null, and reaped without waiting. Whether to run
at all: `init(compact=...)`, else `TRACKLAKE_COMPACT` (`0`, `false`, `no`, `off`
turn it off), else on.

A process that runs many short runs one after another (a sweep, a test suite) must not
start a compactor per run all at once: at most `MAX_RUNNING` of its compactors run at a
time. A finished rank that finds them all busy waits in a queue; the next compactor this
process starts takes every waiting rank of the same store with it (one process compacts
them in turn), and whatever still waits when the process exits goes to one last
compactor per store.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tracklake._format.switches import switched_on
from tracklake._write import failures as _messages

#: The module run as the compacting process.
AUTO_MODULE = "tracklake._ops.auto"
#: Compactors of this process running at once, at most.
MAX_RUNNING = 2
#: Ranks compacted by one process at most (its command line names each).
MAX_RANKS_PER_PROCESS = 256
#: Compactors started by this process and not reaped yet: a process running many runs
#: one after another (a sweep) must not collect a zombie per run.
_started: set[int] = set()
#: Finished ranks waiting for a compactor, per store root: (project, run, rank).
_waiting: dict[str, list[tuple[str, str, str]]] = {}
_lock = threading.Lock()
#: How often the queue's thread looks for a compactor that ended.
_DRAIN_SECONDS = 1.0


def _reap(pid: int) -> bool:
    """True if compactor `pid` has ended (reaped now, or by the application before)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done = pid  # reaped by someone else (a SIGCHLD handler of the application)
    if done == pid:
        _started.discard(pid)
    return done == pid


def compaction_wanted(explicit: bool | None) -> bool:
    """Whether runs compact themselves: `init(compact=...)` if given, else the
    TRACKLAKE_COMPACT variable (ValueError naming it for a value neither on nor off),
    else yes."""
    if explicit is not None:
        return explicit
    return switched_on("TRACKLAKE_COMPACT")


class Compactor:
    """Starts the compacting process for one rank of one run, at most one at a time while
    the run lives; the one started at finish always starts (it waits for a running one)."""

    def __init__(self, root: Path, project: str, run: str, rank: int) -> None:
        self._root = str(root)
        self._rank = (project, run, str(rank))
        self._pid: int | None = None

    def segment_sealed(self) -> None:
        """A segment was sealed while the run lives: compact, unless a compactor started
        earlier is still at work or this process runs as many as it may (the next seal
        or the finish starts another)."""
        with _lock:
            if self._pid is not None and not _reap(self._pid):
                return
            _reap_all()
            if len(_started) < MAX_RUNNING:
                self._pid = self._started(lambda: _spawn(self._root, [self._rank]))

    def run_finished(self) -> None:
        """The attempt's final record is written: compact everything of this rank, now
        or, when this process's compactors are all busy, with the next one it starts."""
        with _lock:
            _reap_all()
            waiting = _waiting.setdefault(self._root, [])
            if self._rank not in waiting:
                waiting.append(self._rank)
            if len(_started) < MAX_RUNNING:
                self._pid = self._started(lambda: _spawn_waiting(self._root))
            else:
                _start_drainer()

    def _started(self, spawn: Callable[[], int | None]) -> int | None:
        try:
            return spawn()
        except OSError as exc:
            _cannot_start(exc)
            return None


#: Whether this process said that a compactor could not start, since one last started.
_said_cannot_start = [False]


def _cannot_start(exc: OSError) -> None:
    """Say that a compactor could not start (the data is safe in segments): once, from
    whichever path tried (a rank's seal or finish, or the queue's thread), until one
    starts again."""
    if _said_cannot_start[0]:
        return
    _said_cannot_start[0] = True
    with contextlib.suppress(OSError):
        _messages.say(f"tracklake: cannot start automatic compaction ({exc}); "
                      "the data stays in segments until `tracklake compact` runs")


def _reap_all() -> None:
    for pid in list(_started):  # compactors of earlier runs of this process
        _reap(pid)


def _spawn_waiting(root: str) -> int | None:
    """Start one compactor for the ranks waiting under `root` (at most
    MAX_RANKS_PER_PROCESS of them; the rest wait for the next)."""
    waiting = _waiting.get(root, [])
    ranks, _waiting[root] = waiting[:MAX_RANKS_PER_PROCESS], waiting[MAX_RANKS_PER_PROCESS:]
    return _spawn(root, ranks) if ranks else None


def _spawn(root: str, ranks: list[tuple[str, str, str]]) -> int | None:
    """Start a compactor for `ranks` of the store at `root` (OSError if it cannot)."""
    if not sys.executable:
        return None  # an embedded interpreter: no Python to start
    argv = [sys.executable, "-m", AUTO_MODULE, root, *(x for rank in ranks for x in rank)]
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1)]
    pid = os.posix_spawn(sys.executable, argv, os.environ, file_actions=devnull, setsid=True)
    _started.add(pid)
    _said_cannot_start[0] = False
    return pid


_drainer: list[threading.Thread] = []


def _start_drainer() -> None:
    """A daemon thread that starts the waiting ranks' compactor as soon as one of this
    process's compactors ends (a process that finished its last run and lives on, a
    notebook, must not keep them waiting until it exits). Called with `_lock` held."""
    if _drainer and _drainer[0].is_alive():
        return
    thread = threading.Thread(target=_drain, name="tracklake-compaction-queue", daemon=True)
    _drainer[:] = [thread]
    thread.start()


def _drain() -> None:
    while True:
        time.sleep(_DRAIN_SECONDS)
        with _lock:
            _reap_all()
            while len(_started) < MAX_RUNNING:
                root = next((r for r, ranks in _waiting.items() if ranks), None)
                if root is None:
                    return
                try:
                    _spawn_waiting(root)
                except OSError as exc:
                    _cannot_start(exc)  # the ranks that queued never tried themselves
                    return


@atexit.register
def _spawn_left() -> None:
    """At exit, the ranks still waiting go to compactors of their own (they outlive this
    process, as every compactor does)."""
    with _lock:
        for root in list(_waiting):
            with contextlib.suppress(OSError):
                while _waiting.get(root) and _spawn_waiting(root) is not None:
                    pass
