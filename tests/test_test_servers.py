"""The servers the tests start end with the test process even when it is SIGKILLed (an
aborted pytest runs no teardown): their whole session is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from _reaper import reap_with_this_process
server = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(600)']); time.sleep(600)"], start_new_session=True)
reap_with_this_process(server)
print(server.pid, flush=True)
import time; time.sleep(600)
"""


def _alive_in_group(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_and_its_workers_end_with_a_sigkilled_test_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(Path(__file__).parent)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    group = int(child.stdout.readline())
    time.sleep(1)  # the server has started its worker
    assert _alive_in_group(group)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    deadline = time.monotonic() + 30
    while _alive_in_group(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive_in_group(group)  # the server and its worker, both
