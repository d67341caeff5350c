"""The shared export loop, with the in-memory destination: exactly-once delivery across
crashes, re-exports and growth, retries, rank modes, corrupt state, following."""

from __future__ import annotations

import datetime as _dt
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _optional import optional

import tracklake
from tracklake import ExportError
from tracklake.exporters import (
    Exporter,
    ExportOptions,
    MemoryDestination,
    RunInfo,
    Selection,
    export,
    export_status,
)

ALL = Selection(all_runs=True)


def _log(root: Path, run_id: str, steps: range, *, rank: int = 0, offset: float = 0.0) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, rank=rank,
                        capture_identity=False, config={"lr": 0.1}) as run:
        for step in steps:
            run.log({"loss": step + offset + rank * 1000, "acc": step / 100}, step=step)
        run.log_text("note", f"rank {rank}", step=steps[-1])
        run.log_generations([("q", "a", 1.0)], step=steps[-1])


def _quiet(message: str) -> None:
    del message


def _run(dest: MemoryDestination, root: Path, selection: Selection = ALL,
         **options: Any) -> tracklake.exporters.ExportSummary:
    opts = ExportOptions(**options)
    return Exporter(dest, root=root, selection=selection, options=opts, log=_quiet,
                    sleep=lambda s: None).run()


def _pairs(dest: MemoryDestination, run: str = "p/r") -> list[tuple[int, str, float]]:
    table = dest.runs[run].table("metrics")
    assert table is not None
    return sorted(zip(table.column("step").to_pylist(), table.column("key").to_pylist(),
                      table.column("value").to_pylist(), strict=True))


def test_every_kind_is_delivered_once_and_the_run_finished(root: Path) -> None:
    _log(root, "r", range(50))
    dest = MemoryDestination()
    summary = _run(dest, root)
    held = dest.runs["p/r"]
    assert len(_pairs(dest)) == 100
    assert {k for k in held.committed} == {"metrics", "texts", "configs", "generations"}
    assert held.finished_status == "finished"
    assert summary.runs["p/r"].finished and summary.records == 100 + 1 + 1 + 1
    metrics = held.table("metrics")
    assert metrics is not None and set(metrics.column_names) >= {"rank", "attempt", "time"}


def test_a_second_export_sends_nothing_and_a_grown_run_sends_only_what_is_new(root: Path
                                                                             ) -> None:
    _log(root, "r", range(50))
    dest = MemoryDestination()
    _run(dest, root)
    commits = dest.runs["p/r"].commits
    assert _run(dest, root).records == 0
    assert dest.runs["p/r"].commits == commits  # nothing new: the destination is not touched
    _log(root, "r", range(50, 80))  # a second attempt continues the run
    summary = _run(dest, root)
    assert summary.records == 30 * 2 + 3  # its metrics, text, generation and config
    steps = [s for s, _, _ in _pairs(dest)]
    assert sorted(set(steps)) == list(range(80)) and len(steps) == 160


class CrashAfter(MemoryDestination):
    """Dies (like SIGKILL: no commit, no cleanup) after `writes` writes."""

    def __init__(self, writes: int) -> None:
        super().__init__()
        self.left = writes

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        if self.left == 0:
            raise KeyboardInterrupt("killed")
        self.left -= 1
        super().write(run, kind, records)


@pytest.mark.parametrize("crash_after", [0, 1, 2, 3, 4, 5])
def test_an_exporter_killed_at_any_write_resumes_without_gap_or_duplicate(
        root: Path, crash_after: int) -> None:
    for rank in (0, 1):
        _log(root, "r", range(300), rank=rank)
    dest = CrashAfter(crash_after)
    with pytest.raises(KeyboardInterrupt):
        _run(dest, root, batch_rows=100, ranks="all")
    dest.left = -1  # alive again: the same destination, a new exporter process
    _run(dest, root, batch_rows=100, ranks="all")
    pairs = _pairs(dest)
    expected = sorted((s, f"rank{r}/{k}", float(v)) for r in (0, 1) for s in range(300)
                      for k, v in (("loss", s + r * 1000), ("acc", s / 100)))
    assert pairs == expected


def test_retryable_errors_are_retried_from_the_last_commit(root: Path) -> None:
    _log(root, "r", range(100))
    dest = MemoryDestination()
    dest.fail_next = ExportError("server down", retryable=True)
    summary = _run(dest, root, batch_rows=30)
    assert summary.runs["p/r"].error is None
    assert len(_pairs(dest)) == 200


def test_a_non_retryable_error_stops_that_run_and_is_reported(root: Path) -> None:
    _log(root, "a", range(10))
    _log(root, "b", range(10))
    dest = MemoryDestination()
    dest.fail_next = ExportError("bad credentials", retryable=False)
    summary = _run(dest, root)
    errors = {k: o.error for k, o in summary.runs.items() if o.error}
    assert list(errors.values()) == ["bad credentials"]
    ok = next(k for k in summary.runs if k not in errors)
    assert len(_pairs(dest, ok)) == 20
    status = {r["run"]: r for r in export_status(root)}
    failed = next(iter(errors))
    if failed in status:
        assert status[failed]["last_error"] == "bad credentials"


def test_a_failing_destination_says_what_is_retried_when_and_until_when(root: Path) -> None:
    """A run that keeps failing is reported at its first failure and then at least every
    30 s: the error, the next try and how long until the exporter gives up."""
    _log(root, "r", range(10))
    now = [0.0]
    failures = [0]
    messages: list[str] = []

    class Down(MemoryDestination):
        def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
            if failures[0] < 40:
                failures[0] += 1
                raise ExportError("connection refused", retryable=True)
            super().write(run, kind, records)

    def sleep(seconds: float) -> None:
        now[0] += seconds

    options = ExportOptions(retry_initial=1.0, retry_max=8.0, give_up_after=3600.0)
    summary = Exporter(Down(), root=root, selection=ALL, options=options,
                       log=messages.append, sleep=sleep, clock=lambda: now[0]).run()
    assert summary.runs["p/r"].error is None
    retries = [m for m in messages if "connection refused" in m]
    assert retries[0].startswith("p/r: connection refused; retry 1 in ")
    assert "giving up in 3600 s (--give-up-after)" in retries[0]
    assert 40 * 4 / 30 - 2 <= len(retries) < 40  # about every 30 s, not at every retry
    assert messages[-1] == "p/r: delivered after 40 retries"


def test_giving_up_after_a_while_without_follow(root: Path) -> None:
    _log(root, "r", range(10))

    class Down(MemoryDestination):
        def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
            raise ExportError("connection refused", retryable=True)

    summary = _run(Down(), root, give_up_after=0.0)
    assert summary.runs["p/r"].error == "connection refused"


@pytest.mark.parametrize("mode", ["mean", "min", "max"])
def test_aggregate_modes_combine_ranks_per_step(root: Path, mode: str) -> None:
    for rank in (0, 1, 2):
        _log(root, "r", range(20), rank=rank)
    dest = MemoryDestination()
    _run(dest, root, ranks=mode)
    values = {(s, k): v for s, k, v in _pairs(dest)}
    assert len(values) == 40
    per_rank = [7 + r * 1000 for r in (0, 1, 2)]
    expected = {"mean": sum(per_rank) / 3, "min": min(per_rank), "max": max(per_rank)}[mode]
    assert values[(7, "loss")] == expected
    texts = dest.runs["p/r"].table("texts")
    assert texts is not None and texts.column("text").to_pylist() == ["rank 0"]


def test_aggregates_held_for_a_missing_rank_survive_a_restart(root: Path) -> None:
    _log(root, "r", range(10), rank=0)
    with tracklake.init(project="p", run_id="r", root=root, rank=1,
                        capture_identity=False) as run:
        for step in range(5):
            run.log({"loss": 1000.0 + step, "acc": step / 100}, step=step)
        run.flush()
        # rank 1 is still running: steps 5..9 wait for it
        dest = MemoryDestination()
        _run(dest, root, ranks="mean")
        assert sorted({s for s, _, _ in _pairs(dest)}) == list(range(5))
        for step in range(5, 10):
            run.log({"loss": 1000.0 + step, "acc": step / 100}, step=step)
    _run(dest, root, ranks="mean")
    values = {(s, k): v for s, k, v in _pairs(dest)}
    assert len(values) == 20
    assert values[(9, "loss")] == (9 + 1009) / 2


def test_nan_is_delivered_as_nan(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        run.log({"x": math.nan, "y": math.inf}, step=0)
    dest = MemoryDestination()
    _run(dest, root)
    values = {k: v for _, k, v in _pairs(dest)}
    assert math.isnan(values["x"]) and values["y"] == math.inf


def test_a_corrupt_state_file_is_reported_and_other_runs_go_on(root: Path) -> None:
    _log(root, "a", range(10))
    _log(root, "b", range(10))
    dest = MemoryDestination()
    state_dir = root.parent / "state"
    _run(dest, root, state_dir=state_dir)
    _log(root, "a", range(10, 20))
    _log(root, "b", range(10, 20))
    bad = state_dir / "project=p" / "run=a.json"
    bad.write_text("{not json")
    summary = _run(dest, root, state_dir=state_dir)
    assert "corrupt" in (summary.runs["p/a"].error or "") and str(bad) in (
        summary.runs["p/a"].error or "")
    assert summary.runs["p/b"].error is None and summary.runs["p/b"].records > 0
    assert bad.read_text() == "{not json"  # left for the user, not overwritten


def test_changing_the_rank_mode_for_the_same_destination_is_refused(root: Path) -> None:
    _log(root, "r", range(10))
    dest = MemoryDestination()
    state_dir = root.parent / "state"
    _run(dest, root, state_dir=state_dir)
    _log(root, "r", range(10, 20))
    summary = _run(dest, root, state_dir=state_dir, ranks="all")
    assert "--ranks 0" in (summary.runs["p/r"].error or "")


def test_selection_by_project_run_tag_and_since(root: Path) -> None:
    _log(root, "a", range(3))
    with tracklake.init(project="q", run_id="b", root=root, tags=["keep"],
                        capture_identity=False) as run:
        run.log({"x": 1.0}, step=0)
    for selection, expected in [
        (Selection(project="q"), {"q/b"}), (Selection(runs=("a",)), {"p/a"}),
        (Selection(tags=("keep",)), {"q/b"}), (Selection(all_runs=True), {"p/a", "q/b"}),
    ]:
        dest = MemoryDestination()
        _run(dest, root, selection)
        assert set(dest.runs) == expected, selection
    started = {r.run: r.attempts[0]["started_at"] for r in tracklake.list_runs(root)}
    since_b = _dt.datetime.fromisoformat(started["b"])
    for selection, expected in [
        (Selection(since=since_b), {"q/b"}),
        (Selection(since=since_b.replace(tzinfo=None)), {"q/b"}),  # naive: UTC
        (Selection(since=since_b + _dt.timedelta(microseconds=1)), set()),
        (Selection(since=since_b - _dt.timedelta(days=1)), {"p/a", "q/b"}),
    ]:
        dest = MemoryDestination()
        _run(dest, root, selection)
        assert set(dest.runs) == expected, selection
    with pytest.raises(ValueError, match="select runs"):
        _run(MemoryDestination(), root, Selection())


def test_follow_exports_a_live_run_until_it_finishes(root: Path, tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent("""
        import sys, time, tracklake
        run = tracklake.init(project="p", run_id="live", root=sys.argv[1],
                             capture_identity=False, flush_interval=0.05)
        for step in range(200):
            run.log({"x": float(step)}, step=step)
            time.sleep(0.005)
        run.finish()
    """))
    writer = subprocess.Popen([sys.executable, str(script), str(root)])
    try:
        import time
        deadline = time.monotonic() + 30
        while not list(root.glob("runs/**/attempt=1.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        dest = MemoryDestination()
        summary = _run(dest, root, Selection(runs=("live",)), follow=True, poll_interval=0.2)
    finally:
        writer.wait(timeout=60)
    assert summary.runs["p/live"].finished
    assert [s for s, _, _ in _pairs(dest, "p/live")] == list(range(200))


def test_export_closes_the_destination_and_the_state_holds_no_secret(root: Path) -> None:
    """Neither the run's secrets (redacted when logged) nor a destination's credentials
    (an MLflow URI with a password) reach the exporter's files."""
    optional("mlflow")
    from tracklake.exporters.mlflow import MlflowDestination

    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        config={"db_password": "hunter2-config", "lr": 0.1}) as run:
        run.log({"loss": 1.0}, step=0)
    dest = MemoryDestination()
    export(dest, root=root, selection=ALL, log=_quiet)
    assert dest.closed
    assert dest.runs["p/r"].info.config["lr"] == 0.1  # the config itself was exported
    mlflow = MlflowDestination(tracking_uri="http://user:hunter2-uri@127.0.0.1:9/")
    Exporter(mlflow, root=root, selection=ALL, log=_quiet)  # writes its destination record
    files = list((root / "exports").rglob("*.json"))
    assert len(files) >= 3  # a state file and two destination records
    for path in files:
        assert "hunter2" not in path.read_text(), path


def test_foreign_torn_and_damaged_files_are_reported_not_fatal(root: Path) -> None:
    """A foreign file is ignored with a warning; a torn tail costs only the torn batch; a
    damaged batch costs the rest of its segment, with a warning naming the file."""
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        segment_bytes=1) as run:  # a new segment for every batch
        for step in range(6):
            run.log({"x": float(step)}, step=step)
            run.flush()
    segments = sorted(root.glob("metrics/**/*seg-*.arrows"))
    assert len(segments) == 6
    (segments[0].parent / "notes.txt").write_text("not ours")
    torn = segments[1].read_bytes()
    segments[1].write_bytes(torn[: len(torn) - 20])  # cut inside its only batch
    damaged = bytearray(segments[4].read_bytes())
    damaged[-20] ^= 0xFF  # inside the last batch's body
    segments[4].write_bytes(bytes(damaged))
    dest = MemoryDestination()
    summary = _run(dest, root)
    assert [s for s, _, _ in _pairs(dest)] == [0, 2, 3, 5]
    text = str(summary)
    assert "notes.txt" in text and "not a tracklake file" in text
    assert str(segments[1]) in text and "torn" in text
    assert str(segments[4]) in text and "not exported" in text
    again = _run(dest, root)  # no crash loop: the same warnings, nothing sent twice
    assert again.records == 0 and [s for s, _, _ in _pairs(dest)] == [0, 2, 3, 5]


def test_a_commit_interval_delivers_a_live_run_once_then_at_its_end(root: Path) -> None:
    """While following with a commit interval, a live run is delivered on the first pass
    and then not again until the interval passed — or the run finished, which is
    delivered at once."""
    import threading
    import time

    run = tracklake.init(project="p", run_id="live", root=root, capture_identity=False)
    run.log({"x": 0.0}, step=0)
    run.flush()
    dest = MemoryDestination()
    exporter = Exporter(dest, root=root, selection=Selection(runs=("live",)),
                        options=ExportOptions(follow=True, poll_interval=0.05,
                                              commit_interval=3600.0), log=_quiet)
    thread = threading.Thread(target=exporter.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while "p/live" not in dest.runs and time.monotonic() < deadline:
            time.sleep(0.02)
        for step in range(1, 50):
            run.log({"x": float(step)}, step=step)
        run.flush()
        seen = exporter.passes
        while exporter.passes < seen + 10 and time.monotonic() < deadline:
            time.sleep(0.02)  # until ten more polls saw the new records, and let them wait
        assert exporter.passes >= seen + 10
        assert dest.runs["p/live"].commits == 1
        assert [s for s, _, _ in _pairs(dest, "p/live")] == [0]
    finally:
        run.finish()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert [s for s, _, _ in _pairs(dest, "p/live")] == list(range(50))
    assert dest.runs["p/live"].finished_status == "finished"
