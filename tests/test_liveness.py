"""A writer is gone only when it is known gone (its seal, its process, its heartbeat),
never because a later attempt of its rank started: two live attempts of one rank lose
nothing to compaction or retention, and a writer whose heartbeat looks old but whose
process runs (suspended, or its clock behind) is left alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def _older_attempt(root: Path, first: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", OLDER_ATTEMPT, str(root), str(first)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


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


def test_compaction_leaves_the_segment_of_an_older_attempt_that_still_writes(
        tmp_path: Path) -> None:
    """A later attempt of the rank started and finished while the first one still appends:
    compaction must not take (and delete) the first one's segment."""
    root = tmp_path / "store"
    proc = _older_attempt(root, 300)
    try:
        _later_attempt_finished(root)
        tracklake.compact(root=root)
        report = _finish(proc)
    finally:
        proc.kill()
    tracklake.compact(root=root)  # now both writers are gone: everything is compacted
    assert report["complete"] is True
    assert _attempt_values(root, 1) == 600
    assert _attempt_values(root, 2) == 1


def test_retention_keeps_a_run_whose_older_attempt_still_writes(tmp_path: Path) -> None:
    """Attempt 2 of the rank ended, attempt 1 still runs: the run is live, and
    `retain --apply --max-age 0s` leaves it whole."""
    root = tmp_path / "store"
    proc = _older_attempt(root, 300)
    try:
        _later_attempt_finished(root)
        result = CliRunner().invoke(main, ["retain", "--root", str(root), "--max-age", "0s",
                                           "--apply"])
        assert result.exit_code == 0, result.output
        report = _finish(proc)
    finally:
        proc.kill()
    assert report["complete"] is True
    assert _attempt_values(root, 1) == 600


def _skew_heartbeat(root: Path, hours: float) -> None:
    """Move the running attempt's heartbeat and start `hours` into the past, as a writer
    whose clock is behind (or that was suspended) leaves them."""
    import datetime as dt
    path = root / "runs" / "project=p" / "run=shared" / "rank=0" / "attempt=1.json"
    record = json.loads(path.read_text())
    then = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours)).isoformat()
    record["heartbeat_at"] = record["started_at"] = then
    path.write_text(json.dumps(record))


def test_a_writer_whose_heartbeat_is_hours_old_but_whose_process_runs_is_live(
        tmp_path: Path) -> None:
    """Its heartbeat says two hours ago; its process (same host, boot and PID namespace)
    runs: neither compaction nor `retain --apply --max-age 1h` touches its data."""
    root = tmp_path / "store"
    proc = _older_attempt(root, 300)
    try:
        _skew_heartbeat(root, 2.0)
        tracklake.compact(root=root)
        result = CliRunner().invoke(main, ["retain", "--root", str(root), "--max-age", "1h",
                                           "--apply"])
        assert result.exit_code == 0, result.output
        assert (root / "runs" / "project=p" / "run=shared").is_dir()
        report = _finish(proc)
    finally:
        proc.kill()
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
