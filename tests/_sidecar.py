"""A trainer with sidecar exporters, run as a real process, and the processes it started.

`Trainer` runs TRAINER in a fresh interpreter: it opens run p/r1 with ``export=...``,
logs `steps` steps of two metrics and then, by mode, finishes (``finish``), waits for a
line on stdin before logging as many steps again and finishing (``pause``), or waits on
stdin forever to be killed (``hang``), or finishes and then SIGKILLs its own child
processes, as Ray's workers do when they exit (``kill-children``). Its stderr (and the
exporters' stdout, which is the trainer's stderr) goes to a file the test reads while it
runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from _env import child_env

#: Long enough for a loaded 2-core machine; only a bound on waiting, never a measurement.
PATIENCE = 120.0

TRAINER = r"""
import faulthandler, json, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, should it not end
import tracklake
root, export, steps, mode = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
run = tracklake.init(project="p", name="trainer", run_id="r1", root=root, export=export,
                     capture_identity=False)
def train(first):
    for step in range(first, first + steps):
        run.log({"loss": 1.0 / (step + 1), "reward": float(step)}, step=step)
train(0)
assert run.flush()
print("logged", flush=True)
if mode == "hang":
    sys.stdin.read()
if mode == "pause":
    sys.stdin.readline()
    train(steps)
report = run.finish()
print("finished", report.complete, flush=True)
if mode == "kill-children":  # as a Ray worker does when it exits
    import os, pathlib, signal
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid():
            os.kill(int(stat.parent.name), signal.SIGKILL)
"""

SIDECAR_LINE = re.compile(r"tracklake: sidecar (\S+)(?: \(restart \d+ of \d+\))? exporting "
                          r"run .*: pid (\d+), log (.+)$", re.MULTILINE)


def wait_for(what: str, check: Callable[[], Any], timeout: float = PATIENCE) -> Any:
    """`check()`'s first true result, polled; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout} s")
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """True while process `pid` runs (a zombie that nobody reaped has ended)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rfind(")") + 2] not in "ZX"


def processes_following(pid: int) -> list[int]:
    """Processes whose command line has ``--while-pid <pid>``: sidecars of trainer `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"--while-pid" in argv and argv[argv.index(b"--while-pid") + 1] == str(
                    pid).encode() and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


class Trainer:
    """One trainer process; `close()` kills whatever is still running and says so."""

    def __init__(self, tmp: Path, root: Path, export: Any, *, steps: int = 40,
                 mode: str = "finish", env: Mapping[str, str] | None = None) -> None:
        self.console = tmp / "trainer.err"
        self.steps = steps
        with open(self.console, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-c", TRAINER, str(root), json.dumps(export), str(steps),
                 mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                env=child_env() | {"MLFLOW_DISABLE_TELEMETRY": "true"} | dict(env or {}),
                cwd=tmp)
        self.pid = self.process.pid

    def text(self) -> str:
        return self.console.read_text(errors="replace")

    def sidecars(self) -> list[tuple[str, int, Path]]:
        """(destination, pid, log file) for each sidecar started so far, restarts included."""
        return [(m[1], int(m[2]), Path(m[3])) for m in SIDECAR_LINE.finditer(self.text())]

    def wait_line(self, expected: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert line.startswith(expected), (line, self.text())

    def proceed(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()

    def wait(self) -> str:
        """Wait for the trainer to end; its stdout."""
        out, _ = self.process.communicate(timeout=PATIENCE)
        return out.decode()

    def ended(self, timeout: float = PATIENCE) -> int:
        """The trainer's exit status once it ends; if it has not within `timeout`,
        AssertionError with its console and every thread's stack."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(f"the trainer did not end within {timeout} s; its console "
                                 f"and stacks:\n{self.text()}") from None

    def wait_sidecars_exit(self) -> list[int]:
        """Wait until every sidecar started so far has exited; their pids."""
        pids = [pid for _, pid, _ in self.sidecars()]
        wait_for(f"sidecars {pids} (and the shells that wait for them) to exit\n{self.text()}",
                 lambda: not any(alive(p) for p in pids) and not processes_following(self.pid))
        return pids

    def close(self) -> list[int]:
        """Kill what still runs (trainer and sidecars); the pids of sidecars left running."""
        left = [pid for _, pid, _ in self.sidecars() if alive(pid)]
        left += [p for p in processes_following(self.pid) if p not in left]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=PATIENCE)
        return left


@contextlib.contextmanager
def trainer(tmp: Path, root: Path, export: Any, **kw: Any) -> Iterator[Trainer]:
    """A `Trainer`; the test fails if any process it started is still running at the end."""
    t = Trainer(tmp, root, export, **kw)
    try:
        yield t
    finally:
        orphans = t.close()
    assert not orphans, f"sidecar processes {orphans} outlived the test:\n{t.text()}"
