"""A run's final status and data survive how the process ends: normal exit, an uncaught
exception, SIGTERM, or a context manager."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tracklake

CHILD = """
import os, signal, sys, time, tracklake
run = tracklake.init(project="p", run_id="r", root=sys.argv[1], capture_identity=False,
                     flush_interval=60)
for step in range(50):
    run.log({{"x": float(step)}}, step=step)
{ending}
"""


def _child(root: Path, ending: str) -> subprocess.Popen[str]:
    code = CHILD.format(ending=textwrap.dedent(ending))
    return subprocess.Popen([sys.executable, "-c", code, str(root)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _status_and_count(root: Path) -> tuple[str, int]:
    rows = tracklake.query("SELECT (SELECT status FROM runs) AS status, "
                           "(SELECT count(*) FROM metrics) AS n", root=root).to_pylist()
    return rows[0]["status"], rows[0]["n"]


def test_a_script_that_ends_without_finish_is_finished_with_all_data(root: Path) -> None:
    proc = _child(root, "")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert _status_and_count(root) == ("finished", 50)


def test_an_uncaught_exception_marks_the_run_failed_and_keeps_the_data(root: Path) -> None:
    proc = _child(root, "raise RuntimeError('diverged')")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "diverged" in err
    assert _status_and_count(root) == ("failed", 50)


def test_sigterm_flushes_and_marks_the_run_killed(root: Path) -> None:
    proc = _child(root, "print('ready', flush=True)\ntime.sleep(60)")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # the default action still happens
    assert _status_and_count(root) == ("killed", 50)


def test_a_users_own_sigterm_handler_still_runs_after_the_flush(root: Path) -> None:
    """A handler installed before init() is chained: tracklake flushes, then calls it."""
    code = textwrap.dedent("""
        import signal, sys, time, tracklake
        def handler(signum, frame):
            print("user handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
        run = tracklake.init(project="p", run_id="r", root=sys.argv[1],
                             capture_identity=False, flush_interval=60)
        run.log({"y": 1.0}, step=0)
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "user handler" in out
    assert _status_and_count(root) == ("killed", 1)


def test_finish_is_idempotent_and_logging_afterwards_raises(root: Path) -> None:
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    run.log({"x": 1.0})
    first = run.finish()
    assert first.complete and first.status == "finished"
    assert run.finish("failed") is first
    with pytest.raises(tracklake.RunStateError, match="finished"):
        run.log({"x": 2.0})
    with pytest.raises(tracklake.RunStateError):
        run.log_text("t", "x")


def test_a_running_attempt_without_heartbeat_shows_as_crashed(root: Path) -> None:
    proc = _child(root, "run.flush(); os.kill(os.getpid(), signal.SIGKILL)")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    status, count = _status_and_count(root)
    assert (status, count) == ("running", 50)  # the heartbeat is fresh
    record = next(root.glob("runs/**/attempt=1.json"))
    text = record.read_text().replace(str(time.gmtime().tm_year), "2000", 2)
    record.write_text(text)  # as if the heartbeat were decades old
    assert _status_and_count(root) == ("crashed", 50)
