"""The process an exporter follows a run for (``--while-pid``): is it still the same one?

A sidecar exporter is started by the training process and must end on its own when that
process is gone, even after a SIGKILL that leaves the run "running" in the store. A pid
alone can be reused by another process, so on Linux the process is also told apart by its
start time (``/proc/PID/stat``), and a zombie counts as gone.
"""

from __future__ import annotations

import os
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (None: no such process,
    or a zombie), or "" where /proc is not available."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        text = stat.read_text()
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else ""
    except OSError:
        return ""
    # the command name in parentheses may hold spaces and parentheses: split after the last
    fields = text[text.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else ""


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


class WatchedProcess:
    """Process `pid` as it was when this object was made; `alive()` turns False for good
    once it has exited (or the pid names another process)."""

    def __init__(self, pid: int) -> None:
        if pid <= 0:
            raise ValueError(f"--while-pid must be a process id (a positive number), not {pid}")
        self.pid = pid
        self._start = _start_time(pid)
        self._gone = self._start is None or not _exists(pid)

    def alive(self) -> bool:
        if not self._gone:
            now = _start_time(self.pid)
            self._gone = now is None or now != self._start or not _exists(self.pid)
        return not self._gone
