"""Runs compact themselves: a detached compactor started by the writer thread after a
segment is sealed and at finish() turns segments into few Parquet parts, keeps every
record exactly once, can be turned off, and recovers from a SIGKILL at any moment."""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from test_compact_claims import CHILD, _assert_recovers, _contents

import tracklake
from tracklake._write import compactor as compactor_module

#: Generous: the compactor is a fresh Python process on a loaded machine. Waiting is not
#: a timed assertion: the test fails only if compaction never happens.
SETTLE_SECONDS = 180.0


@pytest.fixture(autouse=True)
def _no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count the files compaction leaves, with a plain glob: replaced parts go
    at once, as with TRACKLAKE_PART_GRACE=0 (the grace period is test_replaced_parts.py's)."""
    monkeypatch.setenv("TRACKLAKE_PART_GRACE", "0")


def _settled(root: Path) -> bool:
    """No segment left, no compactor at work."""
    return not list(root.rglob("*.arrows")) and not list(root.rglob(".compacting"))


def _wait_settled(root: Path) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while not _settled(root):
        assert time.monotonic() < deadline, sorted(p.name for p in root.rglob("*"))
        time.sleep(0.2)


def _log_run(root: Path, run_id: str, steps: int, **options: object) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                        segment_bytes=4096, **options) as run:  # type: ignore[arg-type]
        for step in range(steps):
            run.log({"loss": step / 3, "acc": float(step % 7), "note": f"s{step}"}, step=step)
            if step % 25 == 24:
                run.flush()


def _plain_duckdb_count(root: Path) -> int:
    """Metric rows as plain DuckDB sees the Parquet files alone (nothing counted twice)."""
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/metrics/**/*.parquet')"
                      ).fetchall()
    return int(rows[0][0])


def test_a_finished_run_ends_as_one_part_per_stream_without_anyone_compacting(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    _log_run(root, "a", 300)
    _wait_settled(root)
    metric_parts = glob.glob(f"{root}/metrics/**/*.parquet", recursive=True)
    text_parts = glob.glob(f"{root}/texts/**/*.parquet", recursive=True)
    assert len(metric_parts) == 1 and len(text_parts) == 1  # small parts were merged
    assert _plain_duckdb_count(root) == 600
    rows = tracklake.query("SELECT key, count(*) AS n, count(DISTINCT step) AS steps "
                           "FROM metrics GROUP BY key ORDER BY key", root=root).to_pylist()
    assert rows == [{"key": "acc", "n": 300, "steps": 300},
                    {"key": "loss", "n": 300, "steps": 300}]
    assert tracklake.query("SELECT count(*) AS n FROM texts", root=root
                           ).to_pylist() == [{"n": 300}]


def test_segments_sealed_while_the_run_lives_are_compacted_before_it_ends(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    run = tracklake.init(project="p", run_id="live", root=root, capture_identity=False,
                         segment_bytes=4096)
    step = 0
    deadline = time.monotonic() + SETTLE_SECONDS
    while not glob.glob(f"{root}/metrics/**/*.parquet", recursive=True):
        assert time.monotonic() < deadline, "nothing was compacted while the run lived"
        run.log({"loss": float(step)}, step=step)
        step += 1
        if step % 50 == 0:
            run.flush()
            time.sleep(0.05)
    run.finish()
    _wait_settled(root)
    assert _plain_duckdb_count(root) == step
    assert len(glob.glob(f"{root}/metrics/**/*.parquet", recursive=True)) == 1


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_compaction_can_be_turned_off(root: Path, monkeypatch: pytest.MonkeyPatch,
                                      how: str) -> None:
    spawned: list[list[str]] = []

    def record(path: str, argv: list[str], *args: object, **kwargs: object) -> int:
        spawned.append(argv)  # an observer: the real spawn is tested above
        return real(path, argv, *args, **kwargs)  # type: ignore[arg-type]

    real = os.posix_spawn
    monkeypatch.setattr(compactor_module.os, "posix_spawn", record)
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1" if how == "argument" else "off")
    options = {"compact": False} if how == "argument" else {}
    _log_run(root, "off", 200, **options)
    assert spawned == []
    assert list(root.rglob("*.arrows")) and not list(root.rglob("*.parquet"))
    # and the same run with it on does start the compactor, at the seals and at finish
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    _log_run(root, "on", 200)
    # at finish, or a moment later when compactors of earlier tests still run (the queue)
    deadline = time.monotonic() + SETTLE_SECONDS
    while not spawned or spawned[-1][3:] != [str(root), "p", "on", "0"]:
        assert time.monotonic() < deadline, spawned
        time.sleep(0.1)
    assert all(a[:3] == [sys.executable, "-m", "tracklake._ops.auto"] for a in spawned)
    _wait_settled(root / "metrics" / "project=p" / "run=on")


def test_init_refuses_nothing_when_python_cannot_start_a_process(
        root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed spawn (no processes left) is said once, whichever path tries it (a
    queue thread left by an earlier run of this process tried too, under load, and said
    it a second time); logging and finish go on."""
    def refuse(*args: object, **kwargs: object) -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(compactor_module.os, "posix_spawn", refuse)
    # compactors earlier tests started may still run (a loaded machine): this run's
    # finish must try to start its own, not queue behind them
    monkeypatch.setattr(compactor_module, "_started", set())
    monkeypatch.setattr(compactor_module, "_said_cannot_start", [False])
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    _log_run(root, "nospawn", 200)
    assert capsys.readouterr().err.count("cannot start automatic compaction") == 1
    assert tracklake.compact(root=root).parts_written  # the data waits, whole, in segments
    assert _plain_duckdb_count(root) == 400


AUTO_CHILD = CHILD.replace(
    "report = tracklake.compact(root=sys.argv[1])\nassert not report.skipped, report.skipped",
    "from tracklake._ops.auto import compact_rank\n"
    "report = compact_rank(pathlib.Path(sys.argv[1]), 'p', 'a', 0)\n"
    "assert not report.skipped, report.skipped")


def _auto_kill_at(root: Path, target: int, where: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", AUTO_CHILD, str(root), str(target), where,
                           "all"], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def merged_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run whose streams hold several small parts and sealed segments: the
    automatic path both merges and compacts."""
    from tracklake._ops import compact as compact_module

    root = tmp_path_factory.mktemp("auto") / "store"
    small = compact_module.SMALL_PART_BYTES
    compact_module.SMALL_PART_BYTES = 0  # no merging yet: leave two small parts
    try:
        with tracklake.init(project="p", run_id="a", root=root, capture_identity=False,
                            segment_bytes=2048, compact=False) as run:
            for step in range(160):
                run.log({"loss": step / 3, "acc": step / 7, "phase": f"s{step}"}, step=step)
                if step % 20 == 19:
                    run.flush()
                if step in (59, 119):
                    tracklake.compact(root=root)
    finally:
        compact_module.SMALL_PART_BYTES = small
    assert assert_parts(root) == 2 and list(root.rglob("*.arrows"))
    return root


def assert_parts(root: Path) -> int:
    return len(list(root.rglob("metrics/**/part-*.parquet")))


def test_sigkill_of_the_automatic_compactor_at_random_points_loses_nothing(
        merged_template: Path, tmp_path: Path) -> None:
    import shutil

    def copy(name: str) -> Path:
        dst = tmp_path / name / "store"
        shutil.copytree(merged_template, dst)
        return dst

    counting = subprocess.run([sys.executable, "-c", AUTO_CHILD, str(copy("count")), "0",
                               "none", "all"], capture_output=True, text=True, check=True)
    total = int(counting.stdout)
    expected = _contents(copy("expected"))
    rng = random.Random(10)
    targets = sorted({rng.randint(1, total) for _ in range(6)} | {1, total})
    for target in targets:
        root = copy(f"t{target}")
        child = _auto_kill_at(root, target, rng.choice(["before", "after"]))
        assert child.returncode == -signal.SIGKILL, (target, child.stderr)
        _assert_recovers(root, expected)
        assert assert_parts(root) == 1  # the next compaction finished the merge too


def test_readers_see_every_record_once_while_the_run_compacts_and_merges_itself(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader between flushes (the run's own segments, parts being written and merged
    by the detached compactor meanwhile) always sees exactly the records flushed."""
    from tracklake._format import StreamId
    from tracklake._read.reader import read_table

    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    stream = StreamId("p", "busy", 0, 1, "metrics")
    run = tracklake.init(project="p", run_id="busy", root=root, capture_identity=False,
                         segment_bytes=2048)
    seen = {"parts": 0, "merged": 0}

    def read_back(step: int) -> None:
        seqs = read_table(root, stream).column("seq").to_pylist()
        assert seqs == list(range(step + 1))
        n = tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist()
        assert n == [{"n": step + 1}]
        parts = len(glob.glob(f"{root}/metrics/**/*.parquet", recursive=True))
        seen["parts"] = max(seen["parts"], parts)
        seen["merged"] += parts == 1 and step > 300

    for step in range(600):
        run.log({"loss": float(step)}, step=step)
        if step % 10 == 9:
            assert run.flush()
            read_back(step)
            if step in (299, 599):
                # the compactor runs at a low priority: on a busy machine, read on while
                # it catches up, so that the reads meet its parts and its merge
                wanted = "parts" if step == 299 else "merged"
                deadline = time.monotonic() + SETTLE_SECONDS
                while not seen[wanted] and time.monotonic() < deadline:
                    time.sleep(0.2)
                    read_back(step)
    run.finish()
    _wait_settled(root)
    assert seen["parts"] >= 1 and seen["merged"] >= 1  # it compacted (and merged) as we read
    assert read_table(root, stream).column("seq").to_pylist() == list(range(600))


def test_a_rank_that_compacts_itself_still_imports_nothing_of_the_operations(
        tmp_path: Path) -> None:
    """The compactor is a separate process named by module: the training process loads
    neither `tracklake._ops` nor DuckDB for it."""
    import json

    from test_import_boundary import FORBIDDEN, TRAINING

    env = {**os.environ, "TRACKLAKE_COMPACT": "1"}
    out = subprocess.run([sys.executable, "-c", TRAINING, str(tmp_path), ",".join(FORBIDDEN)],
                         capture_output=True, text=True, check=True, env=env).stdout
    assert json.loads(out) == []
    _wait_settled(tmp_path)
    assert glob.glob(f"{tmp_path}/metrics/**/*.parquet", recursive=True)


def test_many_runs_in_one_process_leave_no_zombie_compactors(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep of runs in one process reaps the compactors of earlier runs as it goes."""
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    for i in range(6):
        _log_run(root, f"sweep{i}", 20)
        _wait_settled(root)
    earlier = set(compactor_module._started)
    assert earlier  # started, ended, not reaped yet (nothing waits for them)
    for pid in earlier:  # ended: their claims are gone; wait for the exit itself
        deadline = time.monotonic() + SETTLE_SECONDS
        while Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    _log_run(root, "last", 20)  # its first spawn reaps the ones before
    assert earlier.isdisjoint(compactor_module._started)
    _wait_settled(root)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (it may still be compacting)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sweep_of_many_runs_never_runs_more_compactors_than_allowed(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finishing runs one after another in one process queues their compaction instead of
    starting a process per run at once; the queue is drained while the process lives, and
    every run ends compacted, each rank by exactly one compactor's command line."""
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    monkeypatch.setattr(compactor_module, "MAX_RUNNING", 1)
    spawned: list[tuple[int, list[str]]] = []
    overlaps: list[list[int]] = []
    real_spawn = os.posix_spawn

    def observed(path: str, argv: list[str], env: object, **kwargs: object) -> int:
        # this store's compactors only: a process another test of this worker left
        # running may spawn too (a command line whose 6th word was "on" was counted)
        ours = list(argv[1:4]) == ["-m", compactor_module.AUTO_MODULE, str(root)]
        alive = [pid for pid, _ in spawned if _running(pid)]
        if ours and alive:
            overlaps.append(alive)
        pid = real_spawn(path, argv, env, **kwargs)  # type: ignore[arg-type]
        if ours:
            spawned.append((pid, list(argv)))
        return pid

    monkeypatch.setattr(compactor_module.os, "posix_spawn", observed)
    runs = [f"sweep{i}" for i in range(8)]
    for run_id in runs:
        _log_run(root, run_id, 30)
    _wait_settled(root)  # drained while this process lives on, not at its exit
    assert not overlaps, overlaps
    named = [argv[i + 1] for _, argv in spawned for i in range(4, len(argv), 3)]
    assert sorted(named) == runs  # each finished rank handed to exactly one compactor
    assert len(spawned) < len(runs)  # ranks that waited shared a compactor
    assert _plain_duckdb_count(root) == 2 * 30 * len(runs)


def test_a_failing_spawn_is_said_once_by_every_path_that_tries_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The seal, the finish and the queue's thread all meet a refused spawn: one line."""
    def refuse(*args: object, **kwargs: object) -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(compactor_module.os, "posix_spawn", refuse)
    monkeypatch.setattr(compactor_module, "_said_cannot_start", [False])
    monkeypatch.setattr(compactor_module, "_started", set())
    for rank in range(3):
        c = compactor_module.Compactor(Path("/nonexistent-store"), "p", "r", rank)
        c.segment_sealed()
        c.run_finished()
    monkeypatch.setattr(compactor_module, "_waiting", {"/nonexistent-store": [("p", "r", "9")]})
    with compactor_module._lock:
        try:
            compactor_module._spawn_waiting("/nonexistent-store")
        except OSError as exc:
            compactor_module._cannot_start(exc)  # as the queue's thread does
    assert capsys.readouterr().err.count("cannot start automatic compaction") == 1
