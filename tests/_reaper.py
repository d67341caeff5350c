"""Servers the tests start (mlflow, moto) end with the test process, however it ends: a
small watcher process waits for the test process to go (an aborted or SIGKILLed pytest
runs no fixture teardown) and then kills the server's whole session."""

from __future__ import annotations

import os
import subprocess
import sys

_WATCHER = r"""
import os, signal, sys, time
test_pid, group = int(sys.argv[1]), int(sys.argv[2])
while True:
    try:
        os.kill(test_pid, 0)
        os.killpg(group, 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
try:
    os.killpg(group, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def reap_with_this_process(server: subprocess.Popen[bytes]) -> None:
    """Kill `server`'s session (it must have been started with `start_new_session=True`)
    once this process is gone; the watcher ends by itself when the server does."""
    # spawned without a Popen object: none is left to warn that it still runs
    os.posix_spawn(sys.executable, [sys.executable, "-c", _WATCHER, str(os.getpid()),
                                    str(server.pid)], dict(os.environ), setsid=True)
