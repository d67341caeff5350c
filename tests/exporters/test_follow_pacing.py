"""A followed export costs what it exports: file events are coalesced into paced passes,
a run where nothing changed is not read again, and a `--run` follower lists that run only.

Counted through the exporter's public counters (passes, runs read, runs skipped, file
events seen), never timed; every test also checks that each value arrives exactly once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import tracklake
from tracklake.exporters import Exporter, ExportOptions, MemoryDestination, Selection

PATIENCE = 60.0


def _quiet(message: str) -> None:
    del message


def _wait_for(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"waited {PATIENCE} s for {what}"
        time.sleep(0.02)


def _steps(dest: MemoryDestination, run: str) -> list[int]:
    if run not in dest.runs:
        return []
    table = dest.runs[run].table("metrics")
    return [] if table is None else sorted(table.column("step").to_pylist())


def _follow(dest: MemoryDestination, root: Path, run: str, **options: float
            ) -> tuple[Exporter, threading.Thread]:
    exporter = Exporter(dest, root=root, selection=Selection(runs=(run,)),
                        options=ExportOptions(follow=True, **options), log=_quiet)
    thread = threading.Thread(target=exporter.run, daemon=True)
    thread.start()
    return exporter, thread


def test_file_events_are_coalesced_into_at_most_one_pass_per_gap(root: Path) -> None:
    """A writer that flushes every few milliseconds makes many file events; the follower
    makes at most one pass per `pass_gap` of wall time, and still delivers every value
    once."""
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                         flush_interval=0.05)
    run.log({"x": 0.0}, step=0)
    assert run.flush()
    dest = MemoryDestination()
    started = time.monotonic()
    exporter, thread = _follow(dest, root, "r", poll_interval=5.0, pass_gap=0.5)
    try:
        _wait_for("the first delivery", lambda: _steps(dest, "p/r") == [0])
        for step in range(1, 150):
            run.log({"x": float(step)}, step=step)
            assert run.flush()  # a segment write: file events for the watcher
            time.sleep(0.01)
        assert exporter.pacer is not None
        _wait_for("file events", lambda: exporter.pacer is not None
                  and exporter.pacer.events > exporter.passes)
    finally:
        run.finish()
        thread.join(PATIENCE)
    elapsed = time.monotonic() - started
    assert not thread.is_alive()
    assert _steps(dest, "p/r") == list(range(150))
    # one pass at the start, then at most one per gap (wall time only bounds it above)
    assert exporter.passes <= 2 + elapsed / 0.5, (exporter.passes, elapsed)
    assert exporter.pacer.events > exporter.passes


def test_an_idle_live_run_is_not_read_again_until_something_is_written(root: Path) -> None:
    """Passes over a live run with nothing new skip it without reading its records; one
    new value makes the next pass read it (and deliver exactly that value)."""
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                         flush_interval=0.05)
    run.log({"x": 0.0}, step=0)
    assert run.flush()
    dest = MemoryDestination()
    exporter, thread = _follow(dest, root, "r", poll_interval=0.05)
    try:
        _wait_for("the first delivery", lambda: _steps(dest, "p/r") == [0])
        reads, passes = exporter.reads, exporter.passes
        _wait_for("ten more passes", lambda: exporter.passes >= passes + 10)
        assert exporter.reads == reads  # the run's files did not change: nothing read
        assert exporter.skipped >= 9
        run.log({"x": 1.0}, step=1)
        assert run.flush()
        _wait_for("the new value", lambda: _steps(dest, "p/r") == [0, 1])
        assert reads < exporter.reads <= reads + 2  # a pass may catch the write half-done
    finally:
        run.finish()
        thread.join(PATIENCE)
    assert not thread.is_alive()
    assert _steps(dest, "p/r") == [0, 1]
    assert dest.runs["p/r"].finished_status == "finished"


def test_following_one_run_does_not_read_the_other_runs_of_the_store(root: Path) -> None:
    """A `--run` follower lists that run's directories only: another run of the same
    project whose attempt file a newer tracklake wrote (which no reader of this version
    may pass over) does not stop it."""
    with tracklake.init(project="p", run_id="other", root=root, capture_identity=False):
        pass
    attempt = next(root.glob("runs/project=p/run=other/rank=0/attempt=*.json"))
    record = json.loads(attempt.read_text())
    attempt.write_text(json.dumps({**record, "format": "99.0"}))
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    for step in range(20):
        run.log({"x": float(step)}, step=step)
    run.finish()
    dest = MemoryDestination()
    _, thread = _follow(dest, root, "r", poll_interval=0.05)
    thread.join(PATIENCE)
    assert not thread.is_alive()
    assert _steps(dest, "p/r") == list(range(20))
    assert "p/other" not in dest.runs


def test_run_files_changes_exactly_when_the_run_is_written(root: Path) -> None:
    """What the follower compares: the same while the writer is idle, different after one
    more value reaches the file, and covering only the run asked for."""
    from tracklake.read import run_files

    with tracklake.init(project="p", run_id="other", root=root, capture_identity=False) as o:
        o.log({"x": 1.0}, step=0)
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    assert run_files(root, "p", "r") == ()  # nothing logged yet: no stream files
    run.log({"x": 0.0}, step=0)
    assert run.flush()
    first = run_files(root, "p", "r")
    assert first and all("run=r/" in path for path, _, _ in first)
    assert run_files(root, "p", "r") == first
    run.log({"x": 1.0}, step=1)
    assert run.flush()
    assert run_files(root, "p", "r") != first
    run.finish()
    assert run_files(root, "p", "nope") == ()
