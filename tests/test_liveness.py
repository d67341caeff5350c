"""A writer is gone only when it is known gone (its seal, its process, its heartbeat),
never because a later attempt of its rank started: two live attempts of one rank lose
nothing to compaction or retention, and a writer whose heartbeat looks old but whose
process runs (suspended, or its clock behind) is left alone."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main

#: Attempt 1 of rank 0: logs `first` steps, says so, waits for a line on stdin, logs as
#: many again, finishes and prints whether its report is complete.
OLDER_ATTEMPT = r"""
import json, sys
import tracklake
root, first = sys.argv[1], int(sys.argv[2])
run = tracklake.init(project="p", run_id="shared", root=root, rank=0, compact=False)
for step in range(first):
    run.log({"loss": float(step)}, step=step)
run.flush()
print("ready", flush=True)
sys.stdin.readline()
for step in range(first, 2 * first):
    run.log({"loss": float(step)}, step=step)
print(json.dumps({"complete": run.finish().complete}), flush=True)
"""


@contextlib.contextmanager
def _older_attempt(root: Path, first: int) -> Iterator[subprocess.Popen[str]]:
    """Attempt 1 of rank 0 running in a process of its own, killed however the test ends."""
    proc = subprocess.Popen([sys.executable, "-c", OLDER_ATTEMPT, str(root), str(first)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stdin is not None:
            proc.stdin.close()


def _later_attempt_finished(root: Path) -> None:
    with tracklake.init(project="p", run_id="shared", root=root, rank=0,
                        compact=False) as run:
        assert run.attempt == 2
        run.log({"loss": -1.0}, step=10_000)


def _attempt_values(root: Path, attempt: int) -> int:
    return int(tracklake.query(
        f"SELECT count(*) FROM metrics_all WHERE run = 'shared' AND attempt = {attempt}",
        root=root).column(0)[0].as_py())


def _finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, _ = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0
    report: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return report


def _retain(root: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["retain", "--root", str(root), "--apply", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_compaction_leaves_the_segment_of_an_older_attempt_that_still_writes(
        tmp_path: Path) -> None:
    """A later attempt of the rank started and finished while the first one still appends:
    compaction must not take (and delete) the first one's segment."""
    root = tmp_path / "store"
    with _older_attempt(root, 300) as proc:
        _later_attempt_finished(root)
        tracklake.compact(root=root)
        report = _finish(proc)
    tracklake.compact(root=root)  # now both writers are gone: everything is compacted
    assert report["complete"] is True
    assert _attempt_values(root, 1) == 600
    assert _attempt_values(root, 2) == 1


def test_retention_keeps_a_run_whose_older_attempt_still_writes(tmp_path: Path) -> None:
    """Attempt 2 of the rank ended, attempt 1 still runs: the run is live, and
    `retain --apply --max-age 0s` leaves it whole."""
    root = tmp_path / "store"
    with _older_attempt(root, 300) as proc:
        _later_attempt_finished(root)
        _retain(root, "--max-age", "0s")
        report = _finish(proc)
    assert report["complete"] is True
    assert _attempt_values(root, 1) == 600


def test_a_writer_whose_heartbeat_is_hours_old_but_whose_process_runs_is_live(
        tmp_path: Path) -> None:
    """Its heartbeat says two hours ago; its process (same host, boot and PID namespace)
    runs: neither compaction nor `retain --apply --max-age 1h` touches its data."""
    root = tmp_path / "store"
    with _older_attempt(root, 300) as proc:
        _heartbeat_behind(root, "shared", 2.0)
        tracklake.compact(root=root)
        _retain(root, "--max-age", "1h")
        assert (root / "runs" / "project=p" / "run=shared").is_dir()
        report = _finish(proc)
    assert report["complete"] is True
    assert _attempt_values(root, 1) == 600


def test_a_writer_whose_open_segment_is_removed_says_so_and_writes_on(
        tmp_path: Path, capfd: object) -> None:
    """The backstop: if another process removes the segment a writer still appends to (an
    older tracklake, or a hand-run `rm`), the writer notices at its next write, says so
    once, reports the finish incomplete, and writes what follows to a new segment."""
    root = tmp_path / "store"
    run = tracklake.init(project="p", run_id="taken", root=root, rank=0, compact=False,
                         flush_interval=60)
    for step in range(100):
        run.log({"loss": float(step)}, step=step)
    assert run.flush()
    [segment] = root.glob("metrics/**/_seg-*.arrows")
    segment.unlink()  # what compaction did to a live older attempt
    for step in range(100, 200):
        run.log({"loss": float(step)}, step=step)
    assert run.flush()
    report = run.finish()
    assert not report.complete
    assert report.segments_taken == 1
    assert str(segment) in (report.last_error or "")
    err = capfd.readouterr().err  # type: ignore[attr-defined]
    assert err.count("was removed or replaced by another process") == 1
    steps = tracklake.query("SELECT min(step), max(step), count(*) FROM metrics_all "
                            "WHERE run = 'taken'", root=root).to_pylist()
    assert steps == [{"min(step)": 100, "max(step)": 199, "count_star()": 100}]
    record = json.loads(next(root.glob("runs/**/attempt=1.json")).read_text())
    assert record["write_report"]["segments_taken"] == 1
    assert record["write_report"]["complete"] is False


def test_a_writer_whose_open_segment_is_replaced_at_seal_says_so(tmp_path: Path) -> None:
    """Replaced by another file of the same name just before the seal: the writer does
    not seal (or write into) a file that is no longer its segment."""
    root = tmp_path / "store"
    run = tracklake.init(project="p", run_id="swapped", root=root, rank=0, compact=False,
                         flush_interval=60)
    run.log({"loss": 1.0}, step=0)
    assert run.flush()
    [segment] = root.glob("metrics/**/_seg-*.arrows")
    data = segment.read_bytes()
    segment.unlink()
    segment.write_bytes(data)  # a copy, as `cp -a` from a backup would put back
    report = run.finish()
    assert not report.complete and report.segments_taken == 1
    assert segment.read_bytes() == data  # untouched: not sealed through the old descriptor


def _heartbeat_behind(root: Path, run: str, hours: float, host: str | None = None) -> None:
    """Move rank 0 attempt 1 of `run`'s heartbeat and start `hours` before our clock, as a
    writer whose clock is behind (or that was suspended) leaves them; with `host`, as
    written on that node (whose processes cannot be probed from here)."""
    import datetime as dt
    path = root / "runs" / "project=p" / f"run={run}" / "rank=0" / "attempt=1.json"
    record = json.loads(path.read_text())
    then = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours)).isoformat()
    record.update(status="running", heartbeat_at=then, started_at=then, finished_at=None)
    if host is not None:
        record["identity"]["host"] = host
    path.write_text(json.dumps(record))


def _forget_watch() -> None:
    """A new process: nothing of the heartbeats watched is in memory, only on disk."""
    from tracklake._format import heartbeats
    heartbeats._save_all()
    heartbeats._watches.clear()


def test_a_writer_on_another_host_whose_clock_is_behind_is_live(tmp_path: Path) -> None:
    """Its heartbeat, by its clock, is two hours behind ours and it cannot be probed from
    here: compaction and `retain --max-age 1h` look twice (two processes) and still leave
    it whole, because this host has not watched its heartbeat stand still for an hour."""
    root = tmp_path / "store"
    with _older_attempt(root, 300) as proc:
        _heartbeat_behind(root, "shared", 2.0, "another-node")
        for _ in range(2):
            tracklake.compact(root=root)
            assert "is running" in _retain(root, "--max-age", "1h")
            _forget_watch()
        assert (root / "runs" / "project=p" / "run=shared").is_dir()
        report = _finish(proc)
    assert report["complete"] is True
    assert _attempt_values(root, 1) == 600


def _age_watch(root: Path, hours: float) -> None:
    """As if this host had first seen every heartbeat it watches `hours` ago."""
    import time

    from tracklake._format.heartbeats import watch_file
    path = watch_file(root)
    notes = json.loads(path.read_text())
    path.write_text(json.dumps({k: [v[0], time.time() - hours * 3600]
                                for k, v in notes.items()}))


def test_a_writer_on_another_host_is_gone_once_watched_standing_still(tmp_path: Path) -> None:
    """A run whose writer on another node stopped: the first look cannot tell (its clock
    may be behind); once this host has watched the heartbeat keep its value for the
    limit, by its own clock, retention takes it. A heartbeat a day old needs no watch; a
    heartbeat that moves is never taken, however old it looks."""
    root = tmp_path / "store"
    for run in ("stopped", "ancient", "moving"):
        with tracklake.init(project="p", run_id=run, root=root, rank=0) as r:
            r.log({"loss": 1.0}, step=0)
    _heartbeat_behind(root, "stopped", 2.0, "another-node")
    _heartbeat_behind(root, "ancient", 30.0, "another-node")
    _heartbeat_behind(root, "moving", 2.0, "another-node")
    out = _retain(root, "--max-age", "1h")
    assert not (root / "runs" / "project=p" / "run=ancient").exists(), out
    assert (root / "runs" / "project=p" / "run=stopped").is_dir()
    _forget_watch()
    _age_watch(root, 2.0)
    _heartbeat_behind(root, "moving", 1.9, "another-node")  # moved since
    out = _retain(root, "--max-age", "1h")
    assert not (root / "runs" / "project=p" / "run=stopped").exists(), out
    assert (root / "runs" / "project=p" / "run=moving").is_dir()


def test_heartbeat_notes_planted_by_another_user_or_malformed_are_ignored(
        tmp_path: Path) -> None:
    """The notes are input from the store: one that does not fit, or a FIFO, is ignored
    (no hang), and nothing in it can age a writer."""
    import os

    from tracklake._format.heartbeats import HeartbeatWatch
    path = tmp_path / "notes.json"
    for text in ("[1, 2]", '{"k": ["b", "x"]}', '{"k": [1, 2]}', "{" * 100_000, "\xff"):
        path.write_text(text, errors="surrogateescape")
        assert HeartbeatWatch(path).unchanged_for("k", "b", 1000.0) == 0.0
    path.unlink()
    os.mkfifo(path)
    assert HeartbeatWatch(path).unchanged_for("k", "b", 1000.0) == 0.0
    path.unlink()
    path.write_text('{"k": ["b", 5000.0]}')  # first seen in the future: not trusted
    watch = HeartbeatWatch(path)
    assert watch.unchanged_for("k", "b", 1000.0) == 0.0
    assert watch.unchanged_for("k", "b", 1010.0) == 10.0


def test_a_heartbeat_from_the_far_future_on_another_host_does_not_show_running(
        tmp_path: Path) -> None:
    """A restored or planted attempt file of another host whose heartbeat says 2999: no
    clock is a day ahead, so it shows as crashed, not running for ever; one a minute
    ahead (a clock slightly fast) still shows as running."""
    from tracklake._format.attempt import effective_status

    now = time.time()
    record = {"project": "p", "run": "r", "rank": 0, "attempt": 1, "status": "running",
              "started_at": "2026-01-01T00:00:00+00:00",
              "heartbeat_at": "2999-01-01T00:00:00+00:00",
              "identity": {"host": "another-node", "pid": 12345}}
    assert effective_status(record, now=now) == "crashed"
    soon = _dt.datetime.fromtimestamp(now + 60, _dt.timezone.utc).isoformat()
    assert effective_status({**record, "heartbeat_at": soon}, now=now) == "running"


def test_a_writer_on_another_host_shows_running_to_a_reader_whose_clock_is_ahead(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown status: a heartbeat from another host 5 minutes behind this clock (this
    node's clock is ahead) is a live writer; past the limit and the allowed clock skew it
    is crashed; a writer on this host (same clock) is crashed past the limit alone."""
    from tracklake._format.attempt import CRASHED_AFTER_SECONDS, effective_status
    from tracklake._format.liveness import CLOCK_SKEW_SECONDS

    now = time.time()

    def beat(seconds_ago: float, host: str) -> dict[str, object]:
        at = _dt.datetime.fromtimestamp(now - seconds_ago, _dt.timezone.utc).isoformat()
        return {"project": "p", "run": "r", "rank": 0, "attempt": 1, "status": "running",
                "started_at": at, "heartbeat_at": at,
                "identity": {"host": host, "pid": 12345}}

    assert effective_status(beat(300, "another-node"), now=now) == "running"
    late = CRASHED_AFTER_SECONDS + CLOCK_SKEW_SECONDS + 5
    assert effective_status(beat(late, "another-node"), now=now) == "crashed"
    here = platform.node()
    assert effective_status(beat(CRASHED_AFTER_SECONDS + 5, here), now=now) == "crashed"
    monkeypatch.setenv("TRACKLAKE_CLOCK_SKEW", "0")  # clocks known synchronised
    assert effective_status(beat(300, "another-node"), now=now) == "crashed"
    monkeypatch.setenv("TRACKLAKE_CLOCK_SKEW", "ten minutes")
    with pytest.raises(ValueError, match="TRACKLAKE_CLOCK_SKEW='ten minutes'"):
        effective_status(beat(300, "another-node"), now=now)
