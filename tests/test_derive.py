"""The run catalog and bundles are brought up to date as runs finish: the first question
after the writers lists no run's directory and reads the runs from bundles, and the
deriver builds once for what settled, leaves a build begun by a reader alone, waits for
the claim's holder, and takes a planted `.wanted` for no more than a wish."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from _listings import record_listings
from _settled import age

import tracklake
from tracklake._format import KINDS
from tracklake._ops import bundle, derive
from tracklake._ops.bundle import BUNDLE_MIN_RUNS, build_bundles, last_build
from tracklake._ops.claims import hold_claim
from tracklake._ops.compact import compact_streams
from tracklake._read.bundles import BUNDLE_DIR, CHECKED, bundle_paths, read_bundle
from tracklake._read.catalog import RunCatalog
from tracklake._read.reader import list_streams


def _runs(root: Path, n: int, **options: object) -> None:
    """`n` finished runs; compacted and aged past the catalog's racy window unless they
    compact themselves."""
    for i in range(n):
        with tracklake.init(project="p", run_id=f"r{i:03d}", root=root,
                            capture_identity=False, **options) as run:  # type: ignore[arg-type]
            for step in range(5):
                run.log({"loss": float(i * 10 + step), "acc": step / 10}, step=step)
    if options.get("compact") is False:
        compact_streams(root, list_streams(root, None, None, KINDS))
        age(root)


def _bundled_runs(root: Path) -> set[str]:
    return {p.split("/")[2] for b in bundle_paths(root) for p in read_bundle(b).paths}


def _catalogued(root: Path) -> set[tuple[str, str]]:
    return RunCatalog(root).settled(None, None)


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deriver that waits tenths of seconds, not the reader's five, between builds."""
    monkeypatch.setattr(derive, "RACY_SECONDS", 0.3)
    monkeypatch.setattr(derive, "_SLACK_SECONDS", 0.1)
    monkeypatch.setattr(derive, "BUILD_EVERY_SECONDS", 0.5)


def test_runs_finished_with_compaction_on_leave_the_catalog_and_bundles_made(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_COMPACT", "1")
    runs = BUNDLE_MIN_RUNS + 8
    _runs(root, runs)
    deadline = time.monotonic() + 180
    while not (len(_catalogued(root)) == runs
               and not os.path.lexists(root / BUNDLE_DIR / derive.CLAIM)):
        assert time.monotonic() < deadline, sorted(os.listdir(root / ".cache"))
        time.sleep(0.5)
    # which runs share a bundle depends on when the builds came: the runs that settled
    # after a bundle was made stay out until BUNDLE_MIN_RUNS of them gather, but every
    # build that saw BUNDLE_MIN_RUNS unbundled runs made one
    assert len(_bundled_runs(root)) >= BUNDLE_MIN_RUNS
    listed = record_listings(monkeypatch)
    last = tracklake.query("SELECT run, arg_max(value, step) AS last FROM metrics "
                           "WHERE key = 'loss' GROUP BY run ORDER BY run", root=root)
    assert last.to_pylist() == [{"run": f"r{i:03d}", "last": float(i * 10 + 4)}
                                for i in range(runs)]
    assert not [rel for rel in listed if "run=" in rel]  # nothing derived by the reader


def test_the_deriver_builds_once_for_what_settled_and_not_again(
        tmp_path: Path, quick: None) -> None:
    root = tmp_path / "store"
    _runs(root, BUNDLE_MIN_RUNS, compact=False)
    assert _catalogued(root) == set()
    derive.want(root)
    assert derive.derive(root) == 1
    assert len(_catalogued(root)) == BUNDLE_MIN_RUNS
    assert len(_bundled_runs(root)) == BUNDLE_MIN_RUNS
    assert derive.derive(root) == 0  # nothing settled since


def test_a_build_begun_by_a_reader_after_the_run_settled_counts(
        tmp_path: Path, quick: None) -> None:
    root = tmp_path / "store"
    _runs(root, 3, compact=False)
    derive.want(root)
    time.sleep(derive.RACY_SECONDS + derive._SLACK_SECONDS + 0.1)
    assert not build_bundles(root).busy  # a reader's builder, begun after it settled
    assert derive.derive(root) == 0


def test_a_live_derivers_claim_leaves_the_work_to_it(tmp_path: Path, quick: None) -> None:
    root = tmp_path / "store"
    _runs(root, 3, compact=False)
    derive.want(root)
    with hold_claim(root / BUNDLE_DIR, derive.CLAIM, root=root) as claim:
        assert claim is not None
        assert derive.running(root)
        assert derive.derive(root) == 0
    assert not derive.running(root)


@pytest.mark.parametrize("planted", ["future", "garbage", "fifo", "link"])
def test_a_planted_wanted_file_neither_hangs_nor_holds_the_deriver(
        tmp_path: Path, quick: None, planted: str) -> None:
    root = tmp_path / "store"
    _runs(root, 3, compact=False)
    wanted = root / BUNDLE_DIR / derive.WANTED
    wanted.parent.mkdir(parents=True)
    if planted == "future":
        wanted.write_text(json.dumps({"at": time.time() + 10 * 365 * 86400}))
    elif planted == "garbage":
        wanted.write_text('{"at": "soon"}')
    elif planted == "fifo":
        os.mkfifo(wanted)
    else:
        (tmp_path / "elsewhere").write_text(json.dumps({"at": time.time()}))
        wanted.symlink_to(tmp_path / "elsewhere")
    started = time.monotonic()
    builds = derive.derive(root)
    assert time.monotonic() - started < 30
    assert builds == (1 if planted == "future" else 0)  # a future time counts as now



def test_runs_ending_all_the_time_do_not_hold_the_build_off(
        tmp_path: Path, quick: None) -> None:
    """In a sweep a run ends every few seconds: the deriver builds for what had settled
    when it began to wait, instead of waiting for the newest run for ever."""
    root = tmp_path / "store"
    _runs(root, 3, compact=False)
    derive.want(root)
    sweeping = threading.Event()

    def sweep() -> None:  # a run ends every 50 ms for 4 s
        ends = time.monotonic() + 4.0
        while time.monotonic() < ends:
            derive.want(root)
            time.sleep(0.05)
        sweeping.set()

    threading.Thread(target=sweep, daemon=True).start()
    builds = derive.derive(root)
    assert sweeping.is_set()  # it left only once the runs stopped ending
    assert builds >= 2  # and built while they ended (waiting for the newest: once, after)


def test_the_claim_of_a_killed_deriver_holds_nothing_up(tmp_path: Path, quick: None) -> None:
    from tracklake._format.liveness import process_identity

    root = tmp_path / "store"
    _runs(root, 3, compact=False)
    derive.want(root)
    claim = root / BUNDLE_DIR / derive.CLAIM
    claim.write_text(json.dumps({**process_identity(), "pid": 2 ** 22 + 7}))  # no such pid
    assert not derive.running(root)
    assert derive.derive(root) == 1
    assert not claim.exists()


def test_with_bundles_off_no_deriver_is_started(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    _runs(root, 1, compact=False)
    monkeypatch.setenv("TRACKLAKE_BUNDLES", "0")
    assert derive.start(root) is False
    assert not (root / BUNDLE_DIR / derive.WANTED).exists()


def test_a_deriver_killed_at_random_points_leaves_what_the_next_one_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL of the deriver process (as a finished run's compactor starts it) at 8
    random moments of its work: readers answer exactly whatever it left, a bundle in place is
    whole, and the next deriver takes over the dead one's claims and finishes."""
    import random
    import signal
    import subprocess
    import sys

    monkeypatch.setattr("tracklake._read.bundles.BUILD_MIN_RUNS", 10**9)  # no reader's
    root = tmp_path / "store"
    _runs(root, BUNDLE_MIN_RUNS + 3, compact=False)
    question = "SELECT run, key, step, value FROM metrics ORDER BY ALL"
    monkeypatch.setenv("TRACKLAKE_BUNDLES", "0")  # the answer from the parts alone
    expected = tracklake.query(question, root=root)
    rng = random.Random(20261204)
    for _ in range(8):  # from nothing derived each time: it builds at once, in ≈ 0.6 s
        shutil.rmtree(root / ".cache", ignore_errors=True)
        derive.want(root, time.time() - 60)  # settled long ago
        deriver = subprocess.Popen([sys.executable, "-m", "tracklake._ops.derive", str(root)],
                                   env={k: v for k, v in os.environ.items()
                                        if k != "TRACKLAKE_BUNDLES"})
        time.sleep(rng.uniform(0.1, 0.8))  # imports, catalog, bundle, marker, or after
        deriver.send_signal(signal.SIGKILL)
        deriver.wait()
        for path in bundle_paths(root):
            read_bundle(path)  # a bundle in place is whole
        monkeypatch.delenv("TRACKLAKE_BUNDLES")
        assert tracklake.query(question, root=root) == expected  # from what it left
        monkeypatch.setenv("TRACKLAKE_BUNDLES", "0")
    monkeypatch.delenv("TRACKLAKE_BUNDLES")
    derive.want(root, time.time() - 60)
    built = last_build(root)[1] > 0  # the last one killed after its build ended
    # past the dead deriver's and builder's claims (no build if the last one's ended)
    assert derive.derive(root) == (0 if built else 1)
    assert len(_catalogued(root)) == BUNDLE_MIN_RUNS + 3
    assert len(_bundled_runs(root)) == BUNDLE_MIN_RUNS + 3
    left = sorted(os.listdir(root / BUNDLE_DIR))
    assert [n for n in left if not n.startswith("bundle-")] == sorted(
        [derive.WANTED, CHECKED]), left  # no claim, no temporary
    assert tracklake.query(question, root=root) == expected


def test_a_waiting_deriver_keeps_its_claim_fresh(tmp_path: Path, quick: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Between builds a deriver naps; its claim is touched after each nap and build, as a
    compactor touches its own, so that another host sharing the store, which takes a
    claim it watched stand still for ten minutes for a dead holder's, leaves it alone."""
    monkeypatch.setattr(derive, "_NAP_SECONDS", 0.05)
    root = tmp_path / "store"
    _runs(root, 3, compact=False)
    derive.want(root)
    claim = root / BUNDLE_DIR / derive.CLAIM
    ages: list[float] = []
    now = [time.time()]

    def sleep(seconds: float) -> None:
        ages.append(time.time() - claim.stat().st_mtime)
        old = time.time() - 3600
        os.utime(claim, (old, old))  # as if it had stood still for an hour
        now[0] += seconds

    assert derive.derive(root, clock=lambda: now[0], sleep=sleep) == 1
    assert len(ages) >= 3, ages
    assert all(age < 60 for age in ages), ages  # touched again after every nap


def test_a_long_build_keeps_both_claims_fresh(tmp_path: Path, quick: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A build of many runs can outlast the ten minutes after which another host takes a
    claim for a dead holder's: the builder touches its own claim and the deriver's as each
    bundle is written."""
    monkeypatch.setattr(bundle, "BUNDLE_MIN_RUNS", 2)
    monkeypatch.setattr(bundle, "BUNDLE_MAX_VALUES", 20)  # 10 values a run: 2 a bundle
    root = tmp_path / "store"
    _runs(root, 6, compact=False)
    derive.want(root)
    claims = [root / BUNDLE_DIR / derive.CLAIM, root / BUNDLE_DIR / ".compacting"]
    write = bundle._write_bundle
    ages: list[list[float]] = []

    def slow_write(*args: object) -> object:
        ages.append([time.time() - c.stat().st_mtime for c in claims])
        old = time.time() - 3600
        for c in claims:
            os.utime(c, (old, old))  # as if the write had taken an hour
        return write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(bundle, "_write_bundle", slow_write)
    assert derive.derive(root) == 1
    assert len(_bundled_runs(root)) == 6
    assert len(ages) == 3, ages
    assert all(age < 60 for pair in ages for age in pair), ages
