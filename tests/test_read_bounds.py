"""Reads of a store whose file system stops answering (a hung network mount) end with
`NoAnswerError` naming what they could not read, within `TRACKLAKE_READ_TIMEOUT`;
fsck names each such file or directory and checks the rest. The hang is injected here
(a directory whose listing waits); tests/test_many_nodes.py hangs a real sshfs mount."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tracklake
from tracklake._format.bounded import bounded, elsewhere
from tracklake._ops.fsck import fsck

BOUND = 0.5


@pytest.fixture
def hang(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """`hang(directory)`: from now on, listing `directory` waits (as on a stuck mount)
    until the test ends."""
    monkeypatch.setenv("TRACKLAKE_READ_TIMEOUT", str(BOUND))
    release = threading.Event()
    stuck: set[str] = set()
    for name in ("scandir", "listdir"):
        monkeypatch.setattr(os, name, _waiting(getattr(os, name), stuck, release))
    yield lambda directory: stuck.add(str(directory))
    release.set()


def _waiting(real: Callable[..., Any], stuck: set[str], release: threading.Event
             ) -> Callable[..., Any]:
    def listing(path: Any = ".") -> Any:
        if os.fspath(path) in stuck:
            release.wait()
        return real(path)
    return listing


def _store(root: Path, runs: tuple[str, ...]) -> None:
    for run in runs:
        with tracklake.init(project="p", run_id=run, root=root, capture_identity=False,
                            compact=False, system_metrics=False) as r:
            for step in range(5):
                r.log({"x": float(step)}, step=step)


def _stream(root: Path, run: str) -> Path:
    return root / "metrics" / "project=p" / f"run={run}" / "rank=0" / "attempt=1"


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """`call()`'s answer or error, failing the test (instead of hanging it) if it has
    neither after `seconds`."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(call())
        except Exception as exc:  # handed to the test
            out.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still waiting after {seconds} s"
    return out[0]


def test_fsck_names_a_directory_that_gives_no_answer_and_checks_the_rest(
        tmp_path: Path, hang: Callable[[Path], None]) -> None:
    root = tmp_path / "store"
    _store(root, ("r1", "r2"))
    hang(_stream(root, "r1"))
    started = time.monotonic()
    report = _within(20, lambda: fsck(root, repair=True))
    assert time.monotonic() - started < 10
    assert len(report.problems) == 1, "\n".join(p.line(root) for p in report.problems)
    [problem] = report.problems
    assert problem.path == _stream(root, "r1")
    assert problem.what.startswith(f"could not read it: no answer within {BOUND:g} s")
    assert not problem.repairable and problem.repaired is None
    assert report.checked["segments"] == 1  # r2's, checked after r1's gave no answer
    assert report.checked["attempt files"] == 2


def test_a_query_ends_naming_the_directory_that_gives_no_answer(
        tmp_path: Path, hang: Callable[[Path], None]) -> None:
    root = tmp_path / "store"
    _store(root, ("r1",))
    hang(_stream(root, "r1"))
    error = _within(20, lambda: tracklake.query("SELECT count(*) FROM metrics", root=root))
    assert isinstance(error, tracklake.NoAnswerError), error
    assert error.path == str(_stream(root, "r1")) and error.seconds == BOUND
    assert f"no answer within {BOUND:g} s" in str(error)


def test_a_read_of_a_blocking_file_ends_and_the_process_exits_at_once(tmp_path: Path) -> None:
    """A read that blocks for ever (a FIFO without writer, opened the blocking way)
    ends with NoAnswerError; its worker thread stays blocked, and the interpreter still
    exits without waiting for it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = ("from tracklake._format.bounded import bounded\n"
            f"bounded(lambda: open({str(fifo)!r}).read(), {str(fifo)!r})\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TRACKLAKE_READ_TIMEOUT": "0.5"})
    assert time.monotonic() - started < 20
    assert proc.returncode == 1
    assert f"NoAnswerError: could not read {fifo}: no answer within 0.5 s" in proc.stderr


def test_work_that_computes_or_waits_elsewhere_is_never_cut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a wait on the store counts: CPU work and waits marked `elsewhere` (a
    destination, a pipe) run past the bound."""
    monkeypatch.setenv("TRACKLAKE_READ_TIMEOUT", "0.3")

    def compute() -> str:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        return "computed"

    def wait_elsewhere() -> str:
        with elsewhere():
            time.sleep(1.0)
        return "waited"

    assert bounded(compute, "x") == "computed"
    assert bounded(wait_elsewhere, "x") == "waited"
    with pytest.raises(tracklake.NoAnswerError):
        bounded(lambda: time.sleep(1.0), "x")
