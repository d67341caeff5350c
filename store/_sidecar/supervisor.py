"""Watching the sidecar exporters of one run from a thread of their own.

`start_sidecars()` returns at once: the processes are started by the supervisor thread,
so `init()` and `log()` never wait for a fork, an import or a destination. Each exporter
runs in a session of its own (a Ctrl-C or a signal to the trainer's process group does
not reach it) with its stderr in a log file under the store and its stdout on the
trainer's console, where it writes its final summary. If one exits with an error while
the trainer lives, it is started again after 1, 2, 4, ... s, at most `max_restarts`
times; its cursors make the restart neither skip nor repeat anything.

The exporter is not the trainer's child but its grandchild, under a POSIX shell that
waits for it and reports its exit status (KEEPER). Launchers that kill a worker's
direct children when it exits — Ray does, by default — then end only the shell, and the
exporter still drains the run and exits on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake._sidecar.plan import SidecarSpec

#: How often the supervisor looks at its processes (s).
POLL_INTERVAL = 0.5
#: How long `run_ended()` waits for the first start of the processes, so that a run that
#: ends right after `init()` (and a process that exits right after) still gets its
#: sidecars: a daemon thread does not outlive the interpreter. Well within the time a
#: SIGTERM leaves finish() (lifecycle.SIGTERM_FINISH_SECONDS).
START_TIMEOUT = 10.0
#: The shell between trainer and exporter: starts the exporter (stdout on the console, the
#: shell's stderr; stderr appended to the log file $1), prints its pid, waits for it and
#: prints its exit status (128+N for signal N).
KEEPER = 'log=$1; shift; "$@" </dev/null 1>&2 2>>"$log" & echo $!; wait $!; echo $?'
#: click's exit status for a usage error: a restart would fail the same way.
USAGE_ERROR = 2


def _say(message: str) -> None:
    print(f"tracklake: {message}", file=sys.stderr, flush=True)


@dataclass
class Sidecar:
    """One destination's exporter and what happened to it."""

    spec: SidecarSpec
    process: subprocess.Popen[bytes] | None = None  # the shell that waits for the exporter
    pid: int | None = None  # the exporter's
    restarts: int = 0
    restart_at: float | None = None  # monotonic time of the next start, while waiting
    state: str = "starting"  # starting, running, restarting, done, failed, gave up
    pids: list[int] = field(default_factory=list)


class Sidecars:
    """The exporter processes following one run; `run_ended()` prints the summary."""

    def __init__(self, specs: list[SidecarSpec], *, run_label: str, root: Path,
                 max_restarts: int = 5, backoff: float = 1.0,
                 python: str = sys.executable) -> None:
        self.sidecars = [Sidecar(spec) for spec in specs]
        self.run_label = run_label
        self.root = root
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.python = python
        self._stop = threading.Event()
        self._started = threading.Event()  # every process was started once (or failed to)
        self._lock = threading.Lock()  # the sidecars' state, read by run_ended()
        self._thread = threading.Thread(target=self._supervise, daemon=True,
                                        name=f"tracklake-sidecars-{run_label}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop supervising (no more restarts); the exporters run on and end on their own."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def pids(self) -> list[int]:
        """Every process id started so far, restarts included."""
        with self._lock:
            return [pid for s in self.sidecars for pid in s.pids]

    # -- the supervisor thread ----------------------------------------------------------

    def _supervise(self) -> None:
        try:
            for sidecar in self.sidecars:
                self._spawn(sidecar)
        finally:
            self._started.set()
        while not self._stop.wait(POLL_INTERVAL):
            for sidecar in self.sidecars:
                self._check(sidecar)

    def _spawn(self, sidecar: Sidecar) -> None:
        spec = sidecar.spec
        try:
            spec.log.parent.mkdir(parents=True, exist_ok=True)
            process = subprocess.Popen(
                ["/bin/sh", "-c", KEEPER, "sh", str(spec.log), *spec.argv(self.python)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=_console(),
                start_new_session=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
            assert process.stdout is not None
            pid = int(process.stdout.readline())
        except (OSError, ValueError) as exc:
            with self._lock:
                sidecar.state = "failed"
            _say(f"sidecar {spec.destination} for run {self.run_label} could not start: {exc}; "
                 f"run it yourself: {spec.command_line()}")
            return
        with self._lock:
            sidecar.process, sidecar.pid = process, pid
            sidecar.state, sidecar.restart_at = "running", None
            sidecar.pids.append(pid)
        again = f" (restart {sidecar.restarts} of {self.max_restarts})" if sidecar.restarts else ""
        _say(f"sidecar {spec.destination}{again} exporting run {self.run_label} to "
             f"{spec.where}: pid {pid}, log {spec.log}")

    def _check(self, sidecar: Sidecar) -> None:
        if sidecar.state == "restarting":
            if sidecar.restart_at is not None and time.monotonic() >= sidecar.restart_at:
                self._spawn(sidecar)
            return
        if sidecar.state != "running" or sidecar.process is None:
            return
        if sidecar.process.poll() is None:
            return
        code = _exit_status(sidecar.process)
        name, log = sidecar.spec.destination, sidecar.spec.log
        if code == 0:
            with self._lock:
                sidecar.state = "done"
            return
        how = (f"was killed by signal {code - 128}" if code > 128
               else f"exited with status {code}")
        if code == USAGE_ERROR or sidecar.restarts >= self.max_restarts:
            with self._lock:
                sidecar.state = "gave up"
            why = ("its options are wrong" if code == USAGE_ERROR
                   else f"after {sidecar.restarts} restarts")
            _say(f"sidecar {name} (pid {sidecar.pid}) {how}; not restarted: {why} (see {log}). "
                 f"Continue later with: {sidecar.spec.command_line()}")
            return
        delay = self.backoff * 2 ** sidecar.restarts
        with self._lock:
            sidecar.restarts += 1
            sidecar.state = "restarting"
            sidecar.restart_at = time.monotonic() + delay
        _say(f"sidecar {name} (pid {sidecar.pid}) {how}; restarting it in {delay:g} s "
             f"(see {log})")

    # -- the end of the run ---------------------------------------------------------------

    def run_ended(self, status: str) -> None:
        """One line on the console: what each exporter is doing now that the run ended.

        Waits (at most START_TIMEOUT) for the processes to have been started once: the
        run has ended, and this process may be about to exit.
        """
        self._started.wait(START_TIMEOUT)
        with self._lock:
            parts = []
            for s in self.sidecars:
                restarted = f", restarted {s.restarts}×" if s.restarts else ""
                state = {"running": "draining"}.get(s.state, s.state)
                pid = f" pid {s.pid}" if s.pid is not None else ""
                parts.append(f"{s.spec.destination}{pid} {state}{restarted}")
        _say(f"run {self.run_label} {status}; sidecars export the rest and exit on their own "
             f"({'; '.join(parts)}); `tracklake export status --root {self.root}` shows what "
             "is left")


def _exit_status(keeper: subprocess.Popen[bytes]) -> int:
    """The exporter's exit status, as its shell reported it (the shell's own if it was
    killed before it could: a status it never prints, or 128+N)."""
    assert keeper.stdout is not None
    reported = keeper.stdout.read().split()
    keeper.stdout.close()
    if reported and reported[-1].isdigit():
        return int(reported[-1])
    code = keeper.returncode if keeper.returncode is not None else 1
    return 128 - code if code < 0 else code


def _console() -> int | Any:
    """The trainer's stderr as the exporter's stdout (its final summary), if there is one."""
    try:
        os.fstat(2)
    except OSError:
        return subprocess.DEVNULL
    return 2


def start_sidecars(specs: list[SidecarSpec], *, root: Path, run_label: str) -> Sidecars:
    """Start supervising `specs` (the processes start on the supervisor thread)."""
    sidecars = Sidecars(specs, run_label=run_label, root=root)
    sidecars.start()
    return sidecars
