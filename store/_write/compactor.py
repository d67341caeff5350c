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
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from tracklake._write import failures as _messages

#: The module run as the compacting process.
AUTO_MODULE = "tracklake._ops.auto"
_OFF = frozenset({"0", "false", "no", "off"})
#: Compactors started by this process and not reaped yet: a process running many runs
#: one after another (a sweep) must not collect a zombie per run.
_started: set[int] = set()


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
    TRACKLAKE_COMPACT variable, else yes."""
    if explicit is not None:
        return explicit
    return os.environ.get("TRACKLAKE_COMPACT", "1").strip().lower() not in _OFF


class Compactor:
    """Starts the compacting process for one rank of one run, at most one at a time while
    the run lives; the one started at finish always starts (it waits for a running one)."""

    def __init__(self, root: Path, project: str, run: str, rank: int) -> None:
        self._argv = [sys.executable, "-m", AUTO_MODULE, str(root), project, run, str(rank)]
        self._pid: int | None = None
        self._warned = False

    def segment_sealed(self) -> None:
        """A segment was sealed while the run lives: compact, unless a compactor started
        earlier is still at work (the next seal or finish starts another)."""
        if self._pid is not None and not self._reaped(self._pid):
            return
        self._spawn()

    def run_finished(self) -> None:
        """The attempt's final record is written: compact everything of this rank."""
        if self._pid is not None:
            self._reaped(self._pid)
        self._spawn()

    def _reaped(self, pid: int) -> bool:
        """True if the process is gone (reaping it)."""
        return _reap(pid)

    def _spawn(self) -> None:
        if not sys.executable:
            return  # an embedded interpreter: no Python to start
        for pid in list(_started):  # compactors of earlier runs of this process
            _reap(pid)
        devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1)]
        try:
            self._pid = os.posix_spawn(sys.executable, self._argv, os.environ,
                                       file_actions=devnull, setsid=True)
            _started.add(self._pid)
        except OSError as exc:
            self._pid = None
            if not self._warned:  # the data is safe in segments; `tracklake compact` later
                self._warned = True
                with contextlib.suppress(OSError):
                    _messages.say(f"tracklake: cannot start automatic compaction ({exc}); "
                                  "the data stays in segments until `tracklake compact` runs")
