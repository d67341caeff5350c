"""A process that asks again is told of changes to catalogued runs (inotify) instead of
`stat`ing each run's paths at each question: a run changed in place, resumed, removed or
touched is looked at again and answered as from its files, the others are not; an
overflowed event queue makes every run looked at again; a forked child neither uses nor
drains its parent's watch; only a local file system is watched."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _crafted import age_catalog, kept_catalog
from _settled import age
from test_run_catalog import _write

import tracklake
from tracklake._read import catalog, dir_watch

pytestmark = pytest.mark.skipif(dir_watch.INotify is None, reason="no inotify here")

QUESTIONS = (
    "SELECT run, status, attempts FROM runs ORDER BY run",
    "SELECT run, count(*) AS n, max(step) AS last, sum(value) AS total FROM metrics "
    "GROUP BY run ORDER BY run",
)


def _answers(root: Path) -> list[list[dict[str, Any]]]:
    return [tracklake.query(sql, root=root).to_pylist() for sql in QUESTIONS]


def _from_files(root: Path) -> list[list[dict[str, Any]]]:
    """The answers of a reader with no catalog at all (a copy of the store)."""
    copy = root.parent / f"copy-{time.monotonic_ns()}"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".cache"))
    return _answers(copy)


class _Looked:
    """The paths each question `stat`ed to check the catalog."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[list[str]] = []
        real = catalog.mtimes_of

        def counted(paths: list[str]) -> np.ndarray:
            self.paths.append(list(paths))
            return real(paths)

        monkeypatch.setattr(catalog, "mtimes_of", counted)

    def during(self, root: Path) -> list[str]:
        self.paths.clear()
        _answers(root)
        return sorted({p for asked in self.paths for p in asked})


def _watched(root: Path, runs: int = 3) -> None:
    """A store of `runs` compacted, catalogued runs, and this process watching it: the
    second question starts the watch, the one after it finds every run as recorded."""
    for i in range(runs):
        _write(root, f"r{i}", steps=5 + i)
    tracklake.compact(root=root)
    age(root)
    _answers(root)
    age_catalog(root)  # kept by the process from now on
    _answers(root)
    kept = kept_catalog(root)
    state = catalog._watched_before[id(kept)][1].watch
    deadline = time.monotonic() + 30
    while "quiet" not in state or state["quiet"].ready < runs:
        assert time.monotonic() < deadline, "the watch was never in place"
        time.sleep(0.01)
    _answers(root)


def _run_paths(root: Path, run: str) -> list[str]:
    return sorted(f"{os.path.abspath(root)}/{p}"
                  for p, _ in catalog.watched_paths(root, "p", run))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


def test_settled_runs_are_not_looked_at_again(root: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _watched(root)
    looked = _Looked(monkeypatch)
    assert looked.during(root) == []
    assert _answers(root) == _from_files(root)


def test_a_runs_view_question_leaves_watched_runs_quiet(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a watch, a question on the runs view alone looks at the paths under runs/
    only; with one, at every path of a run it finds changed, so that the run becomes
    quiet again and the next question looks at nothing."""
    _watched(root)
    looked = _Looked(monkeypatch)
    runs_sql = "SELECT run, status FROM runs ORDER BY run"
    want = tracklake.query(runs_sql, root=root)
    assert looked.paths == [] or all(p == [] for p in looked.paths)
    metrics_dir = root / "metrics" / "project=p" / "run=r1"
    moved = metrics_dir.stat().st_mtime_ns + 1_000_000_000
    os.utime(metrics_dir, ns=(moved, moved))  # r1 changed, in its metrics only
    deadline = time.monotonic() + 30
    while True:  # the watch tells of it; r1 is then looked at whole
        looked.paths.clear()
        assert tracklake.query(runs_sql, root=root).equals(want)
        seen = sorted({p for asked in looked.paths for p in asked})
        if seen:
            break
        assert time.monotonic() < deadline, "the change was never told"
        time.sleep(0.02)
    assert seen == _run_paths(root, "r1")  # under metrics/ too, not only runs/
    assert looked.during(root) == []  # quiet again
    assert _answers(root) == _from_files(root)


@pytest.mark.parametrize("change", ["part rewritten in place", "through a hard link",
                                    "mtime set", "attempt edited", "resumed", "removed"])
def test_a_changed_run_alone_is_looked_at_and_answered_from_its_files(
        root: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    _watched(root)
    before = _answers(root)
    looked = _Looked(monkeypatch)
    r1 = _run_paths(root, "r1")
    [part] = (root / "metrics" / "project=p" / "run=r1").rglob("*.parquet")
    if change == "part rewritten in place":  # the same bytes of another run's part
        [other] = (root / "metrics" / "project=p" / "run=r2").rglob("*.parquet")
        mtime = part.stat().st_mtime_ns
        with open(part, "r+b") as f:
            f.write(other.read_bytes())
            f.truncate()
        os.utime(part, ns=(mtime, mtime))  # as `cp -p` would leave it: the mtime as it was
    elif change == "through a hard link":  # from outside the run's directories
        [other] = (root / "metrics" / "project=p" / "run=r2").rglob("*.parquet")
        mtime = part.stat().st_mtime_ns
        elsewhere = root.parent / "hard-link.parquet"
        os.link(part, elsewhere)
        with open(elsewhere, "r+b") as f:
            f.write(other.read_bytes())
            f.truncate()
        os.utime(elsewhere, ns=(mtime, mtime))
    elif change == "mtime set":
        os.utime(part, ns=(part.stat().st_mtime_ns + 10**9,) * 2)
    elif change == "attempt edited":
        attempt = next((root / "runs" / "project=p" / "run=r1").rglob("attempt=*.json"))
        mtime = attempt.stat().st_mtime_ns
        attempt.write_bytes(attempt.read_bytes().replace(b'"finished"', b'"killed"  '))
        os.utime(attempt, ns=(mtime + 1000, mtime + 1000))
    elif change == "resumed":
        _write(root, "r1", steps=3, start=100)
    else:
        for kind in ("metrics", "runs"):
            shutil.rmtree(root / kind / "project=p" / "run=r1")
    seen = looked.during(root)
    assert seen and set(seen) <= set(r1), seen  # r1's paths, and no other run's
    got = _answers(root)
    if change != "mtime set":
        assert got != before
    assert got == _from_files(root)


def test_an_overflowed_queue_makes_every_run_looked_at_once(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More events than the kernel queues (`max_queued_events`) before a question: the
    queue overflows, and every run is `stat`ed by the next question, then none."""
    _watched(root)
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    [attempt_dir] = (root / "metrics" / "project=p" / "run=r0" / "rank=0").glob("attempt=*")
    mark_a, mark_b = attempt_dir / "a", attempt_dir / "b"
    mark_a.write_bytes(b"")
    mark_b.write_bytes(b"")
    for i in range(limit // 2 + 100):  # alternating, so that no two events are merged
        os.utime(mark_a, ns=(i, i))
        os.utime(mark_b, ns=(i, i))
    mark_a.unlink()
    mark_b.unlink()
    looked = _Looked(monkeypatch)
    seen = looked.during(root)
    assert set(_run_paths(root, "r1")) <= set(seen) and set(_run_paths(root, "r2")) <= set(seen)
    assert looked.during(root) == []  # r0's directory mtime moved: it is catalogued again


def test_a_forked_child_neither_uses_nor_drains_its_parents_watch(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _watched(root)
    looked = _Looked(monkeypatch)
    [part] = (root / "metrics" / "project=p" / "run=r1").rglob("*.parquet")
    report = tmp_path / "child"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's report is asserted below
        try:
            os.utime(part, ns=(part.stat().st_mtime_ns + 10**9,) * 2)
            seen = looked.during(root)
            report.write_text("\n".join(seen))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    child_saw = report.read_text().splitlines()
    assert set(_run_paths(root, "r0")) <= set(child_saw)  # every run: no watch of its own
    assert looked.during(root) == _run_paths(root, "r1")  # the child left the event here


def test_a_store_whose_watch_was_closed_for_others_is_looked_at_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process watches two stores at most: watching a third closes the first's watch,
    whose runs are then `stat`ed again (and watched anew), never taken as quiet."""
    roots = [tmp_path / f"store{i}" for i in range(3)]
    for root in roots:
        _watched(root, runs=2)
    first = roots[0]
    [part] = (first / "metrics" / "project=p" / "run=r1").rglob("*.parquet")
    os.utime(part, ns=(part.stat().st_mtime_ns + 10**9,) * 2)
    looked = _Looked(monkeypatch)
    seen = looked.during(first)
    assert set(_run_paths(first, "r0")) <= set(seen)  # every run of it: no watch left
    assert _answers(first) == _from_files(first)


@pytest.mark.parametrize("replaced", ["the store", "its metrics", "a project"])
def test_a_store_replaced_by_a_copy_at_its_path_is_watched_anew(
        root: Path, monkeypatch: pytest.MonkeyPatch, replaced: str) -> None:
    """The store (or a directory above its runs) moved aside and a copy with the same
    mtimes put at its path, as a restore does: the watches follow the old directories,
    so the copy's runs are `stat`ed again and a change to the copy is seen."""
    _watched(root)
    target = {"the store": root, "its metrics": root / "metrics",
              "a project": root / "metrics" / "project=p"}[replaced]
    aside = target.with_name(target.name + ".old")
    target.rename(aside)
    shutil.copytree(aside, target, symlinks=True)  # copy2: the mtimes as they were
    for path in [*sorted(aside.rglob("*"), reverse=True), aside]:
        relative = path.relative_to(aside)
        st = path.stat()
        os.utime(target / relative, ns=(st.st_atime_ns, st.st_mtime_ns))
    _answers(root)
    [part] = (root / "metrics" / "project=p" / "run=r1").rglob("*.parquet")
    [other] = (root / "metrics" / "project=p" / "run=r2").rglob("*.parquet")
    mtime = part.stat().st_mtime_ns
    part.write_bytes(other.read_bytes())
    os.utime(part, ns=(mtime, mtime))
    looked = _Looked(monkeypatch)
    assert set(_run_paths(root, "r1")) <= set(looked.during(root))
    assert _answers(root) == _from_files(root)


def _adding_paused(monkeypatch: pytest.MonkeyPatch, at: Callable[[str], bool]
                   ) -> tuple[threading.Event, threading.Event]:
    """Have the watches be added one row at a time, and stop at the first path `at`
    picks until the second event is set; the first is set when it stops there."""
    from inotify_simple import INotify

    monkeypatch.setattr(dir_watch, "_READY_EVERY", 1)
    stopped, go_on = threading.Event(), threading.Event()
    adding = INotify.add_watch

    def add_watch(self: Any, path: str, mask: int) -> int:
        if at(path) and not go_on.is_set():
            stopped.set()
            assert go_on.wait(30)
        return adding(self, path, mask)

    monkeypatch.setattr(INotify, "add_watch", add_watch)
    return stopped, go_on


def test_rows_are_usable_as_their_watches_are_added_and_never_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watches of a large catalog take a second to add, in the background, over
    which questions go on: the rows whose paths are all watched can become quiet at
    once; a row whose watches were not all in place when a look began never becomes
    quiet from that look (a change made between the look and its watch is heard by
    nobody), only from a later one."""
    runs = [("p", f"r{i}") for i in range(4)]
    paths, owner = [], []
    for row, (_, run) in enumerate(runs):
        for sub in ("a", "b"):
            made = tmp_path / run / sub
            made.mkdir(parents=True)
            paths.append(str(made))
            owner.append(row)
    # at r2's first path: r0 and r1 are watched whole
    at_r2, go_on = _adding_paused(monkeypatch, lambda path: path == paths[4])
    watch = dir_watch.DirWatch()
    published: list[dir_watch.QuietRows] = []
    every = np.arange(len(runs))
    adder = threading.Thread(target=watch.rows_for, args=(
        paths, np.ones(len(paths), dtype=bool), np.array(owner), runs, list(runs),
        [str(tmp_path)], published.append))
    adder.start()
    try:
        assert at_r2.wait(30)
        [quiet] = published
        assert quiet.ready == 2
        seen = quiet.look()
        assert seen is not None
        early_quiet, early = seen
        assert not early_quiet.any() and early.tolist() == [0, 0, -1, -1]
    finally:
        go_on.set()
        adder.join(30)
    quiet.settle(every, early)  # every row's paths matched at that look
    assert quiet.quiet.tolist() == [True, True, False, False]
    seen = quiet.look()
    assert seen is not None and seen[1].tolist() == [0, 0, 0, 0]
    quiet.settle(every, seen[1])
    assert quiet.quiet.all()
    (tmp_path / "r1" / "a" / "new").write_bytes(b"")  # an event: r1 is no longer quiet
    seen = quiet.look()
    assert seen is not None and seen[0].tolist() == [True, False, True, True]
    watch.close()


def test_a_runs_view_question_looks_whole_at_the_runs_already_watched_only(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the watches are being added, a question on the runs view alone looks at
    every path of a run whose watches are in place (found as recorded, it becomes
    quiet), and at the paths under runs/ only of the others, as with no watch: looking
    at all of theirs made such questions at 10,000 runs twice as slow while the watch
    was being built, for nothing (they cannot become quiet yet)."""
    for i in range(3):
        _write(root, f"r{i}", steps=5 + i)
    tracklake.compact(root=root)
    age(root)
    _answers(root)
    age_catalog(root)
    kept_rows = catalog.RunCatalog(root)._table
    order = kept_rows.column("run").to_pylist()
    late = order[1]  # the rows before it get their watches; it and those after wait
    waiting, go_on = _adding_paused(monkeypatch, lambda path: f"/run={late}" in path)
    try:
        _answers(root)  # the second question: the watches are being added
        assert waiting.wait(30)
        looked = _Looked(monkeypatch)
        runs_sql = QUESTIONS[0]
        looked.paths.clear()
        got = tracklake.query(runs_sql, root=root)
        seen = sorted({p for asked in looked.paths for p in asked})
        under_runs = [p for name in order[1:] for p in _run_paths(root, name)
                      if "/runs/" in p]
        assert seen == sorted([*_run_paths(root, order[0]), *under_runs])
        looked.paths.clear()
        tracklake.query(runs_sql, root=root)
        seen = sorted({p for asked in looked.paths for p in asked})
        assert seen == sorted(under_runs)  # the first run is quiet now
    finally:
        go_on.set()
    assert got.to_pylist() == _from_files(root)[0]


def test_only_a_local_file_system_is_watched() -> None:
    mountinfo = [
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
        "40 22 0:40 / /data rw,relatime shared:20 - nfs4 srv:/export rw,vers=4.2",
        r"41 40 0:41 / /data/my\040scratch rw - tmpfs tmpfs rw",
        "42 22 0:42 / /lustre rw master:3 - lustre 10.0.0.1@tcp:/fs rw",
    ]
    assert dir_watch.file_system_of("/home/u/store", mountinfo) == "ext4"
    assert dir_watch.file_system_of("/data/store", mountinfo) == "nfs4"
    assert dir_watch.file_system_of("/data/my scratch/store", mountinfo) == "tmpfs"
    assert dir_watch.file_system_of("/datastore", mountinfo) == "ext4"
    assert dir_watch.file_system_of("/lustre/p/store", mountinfo) == "lustre"
    assert dir_watch.file_system_of("/x", ["garbage", ""]) is None
    for kind in ("nfs4", "lustre", "gpfs", "cifs", "fuse.sshfs", "9p", None):
        assert kind not in dir_watch.LOCAL_FILE_SYSTEMS


def test_off_by_the_environment(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dir_watch.WATCH_ENV, "0")
    for i in range(2):
        _write(root, f"r{i}")
    tracklake.compact(root=root)
    age(root)
    _answers(root)
    age_catalog(root)
    for _ in range(3):
        _answers(root)
    kept = kept_catalog(root)
    time.sleep(0.2)
    assert "quiet" not in catalog._watched_before[id(kept)][1].watch
    looked = _Looked(monkeypatch)
    assert len(looked.during(root)) == 2 * len(_run_paths(root, "r0"))
    monkeypatch.setenv(dir_watch.WATCH_ENV, "maybe")
    with pytest.raises(ValueError, match=dir_watch.WATCH_ENV):
        dir_watch.dir_watch_wanted()
