"""Whether a writer or a claim holder is known gone: one rule for every reader and
operation (compaction, fsck, retention, claims).

A process is known gone by its seal (a terminal status), by its process (on the same
host, boot and PID namespace: no process with its pid and start time), or by its
heartbeat having stopped for longer than a limit. A later attempt of the same rank never
makes an earlier one gone: a job restarted while its old process still runs has two live
writers. A pid is probed only where it means the same process (same host, boot id and
PID namespace): a container with the same hostname has pids of its own.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from pathlib import Path
from typing import Any

from tracklake._format.heartbeats import heartbeat_watch
from tracklake._format.seconds import seconds_from_env


def boot_id() -> str | None:
    """This machine's boot id (Linux), to tell a process that ran before a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> int | None:
    """The inode of this process's PID namespace (Linux); None where it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux); None if unknown, gone,
    or a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X") or not fields[19].isdigit():
        return None
    return int(fields[19])


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists in this PID namespace (owned by anyone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OverflowError:
        return False
    return True


def process_identity() -> dict[str, Any]:
    """What identifies this process to another one judging whether it still runs."""
    pid = os.getpid()
    return {"host": platform.node(), "boot_id": boot_id(), "pid_ns": pid_namespace(),
            "pid": pid, "start_ticks": start_ticks(pid)}


def process_known_gone(ident: dict[str, Any]) -> bool | None:
    """True if the process `ident` names (see `process_identity`) certainly ended, False
    if it certainly runs, None if this process cannot tell (another host, another PID
    namespace, or a record without the fields to tell)."""
    if ident.get("host") != platform.node():
        return None
    recorded_boot, boot = ident.get("boot_id"), boot_id()
    if not isinstance(recorded_boot, str) or boot is None:
        return None
    if recorded_boot != boot:
        return True  # the machine rebooted since
    ns, pid = ident.get("pid_ns"), ident.get("pid")
    if not isinstance(ns, int) or ns != pid_namespace() or not isinstance(pid, int):
        return None
    if not process_alive(pid):
        return True
    started = ident.get("start_ticks")
    # a start time that differs: the pid was reused, or the process is a zombie
    return isinstance(started, int) and start_ticks(pid) != started


def _heartbeat(record: dict[str, Any]) -> float | None:
    for field in ("heartbeat_at", "started_at"):
        value = record.get(field)
        if isinstance(value, str):
            try:
                return _dt.datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return None


#: How far apart two hosts' clocks (and a file server's) may be, in seconds: a time
#: written by another host is judged late only past this much more than its limit
#: (`TRACKLAKE_CLOCK_SKEW` sets another; 0 where every clock is synchronised).
CLOCK_SKEW_SECONDS = 600.0
CLOCK_SKEW_ENV = "TRACKLAKE_CLOCK_SKEW"


def clock_skew() -> float:
    """The clock difference allowed between hosts (`CLOCK_SKEW_SECONDS`, or the setting)."""
    return seconds_from_env(CLOCK_SKEW_ENV, CLOCK_SKEW_SECONDS)


#: Where a writer cannot be probed and this host has not watched its heartbeat stand
#: still, a heartbeat this old by the two clocks' comparison is taken as stopped: no
#: cluster's clocks differ by a day, and a process suspended that long is judged gone.
UNWATCHED_LIMIT_SECONDS = 86_400.0


def writer_known_gone(record: dict[str, Any], now: float, stale_after: float,
                      root: Path | None = None) -> bool:
    """True if the writer of this attempt record will not append again: its status is
    terminal, or its process is known ended, or (where its process cannot be probed)
    its heartbeat has stopped for longer than `stale_after` seconds. A writer whose
    process runs is alive, however old its heartbeat (suspended, or its clock behind).

    With `root` (operations that take or delete files), a heartbeat is judged by its own
    progress: stopped once this host has watched it stand still for `stale_after` by its
    own clock (`heartbeats.py`), or once it is `UNWATCHED_LIMIT_SECONDS` old. Without
    (what is displayed), by comparing its time with `now`, allowing a writer on another
    host `clock_skew()` more."""
    if record.get("status", "running") != "running":
        return True
    ident = record.get("identity")
    if isinstance(ident, dict):
        gone = process_known_gone(ident)
        if gone is not None:
            return gone
    beat = _heartbeat(record)
    if beat is None:
        return False
    if root is None:  # a heartbeat over a day ahead of this clock is no clock's: planted
        here = isinstance(ident, dict) and ident.get("host") == platform.node()
        late = stale_after + (0.0 if here else clock_skew())  # another host's clock
        return now - beat > late or beat - now > UNWATCHED_LIMIT_SECONDS
    if now - beat > max(stale_after, UNWATCHED_LIMIT_SECONDS):
        return True
    key = "/".join(str(record.get(k)) for k in ("project", "run", "rank", "attempt"))
    value = str(record.get("heartbeat_at") or record.get("started_at"))
    return heartbeat_watch(root).unchanged_for(key, value, time.time()) > stale_after
