"""Disk faults while a run logs: injected errors, a real full disk, a read-only remount, and
stores that cannot be written at `init()`.

The policy under test (docs/concepts.md, "When the disk fails"): `run.log()` never raises
for a write failure; one message goes to stderr; unwritten batches are kept and retried,
but no more than `max_buffer_bytes` — beyond that new values are dropped and counted;
after recovery the kept data is written and an `events` row of kind 'write_error' says
what happened; `finish()` reports it all.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tracklake
import tracklake._format.segment as segment_module

KEYS = 8
TEXT_EVERY = 50


def value_of(step: int, k: int) -> float:
    return float(step * 10 + k)


def log_step(run: tracklake.Run, step: int) -> None:
    run.log({f"k{k}": value_of(step, k) for k in range(KEYS)}, step=step)
    if step % TEXT_EVERY == 0:
        run.log_text("note", f"step {step}", step=step)


def stored_steps(root: Path, run_id: str) -> dict[int, dict[str, float]]:
    """step -> {key: value} of one run's metrics, as the SQL view sees them."""
    table = tracklake.query(
        f"SELECT step, key, value FROM metrics WHERE run = '{run_id}'", root=root)
    out: dict[int, dict[str, float]] = {}
    for step, key, value in zip(*table.to_pydict().values(), strict=True):
        keys = out.setdefault(step, {})
        assert key not in keys, f"step {step} key {key} stored twice"
        keys[key] = value
    return out


def assert_whole_steps(steps: dict[int, dict[str, float]], expected: Iterator[int] | range,
                       value: Callable[[int, int], float] = value_of) -> None:
    for step in expected:
        assert steps.get(step) == {f"k{k}": value(step, k) for k in range(KEYS)}, step


def store_fds(root: Path) -> list[str]:
    """Files under `root` that this process holds open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(target)
    return out


def flush_until_written(run: tracklake.Run) -> None:
    """The writer's next retry, without waiting out its backoff: it must write everything."""
    run._writer._flusher._retry_at = 0.0  # the backoff has elapsed
    assert run.flush(), "the writer did not recover once the fault was gone"


def cannot_write_messages(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("tracklake: cannot write")]


# -- (a) injected faults at the file layer ------------------------------------------------


class FaultyOS:
    """Stands in for the `os` module inside tracklake._format.segment: while `active`, the chosen
    calls fail with `err`. With `partial`, the first failing write first writes half of
    its bytes (a short write, as a filling disk does), leaving a torn batch behind."""

    def __init__(self, err: int, calls: frozenset[str], partial: bool) -> None:
        self.err = err
        self.calls = calls
        self.partial = partial
        self.active = False
        self.injected = 0
        self.failed = threading.Event()  # set at the first injected failure
        self._short_write_done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _fail(self, call: str) -> None:
        if self.active and call in self.calls:
            self.injected += 1
            self.failed.set()
            raise OSError(self.err, os.strerror(self.err))

    def open(self, path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        self._fail("open")
        return os.open(path, flags, mode, **kwargs)

    def write(self, fd: int, data: Any) -> int:
        if self.active and "write" in self.calls and self.partial \
                and not self._short_write_done and len(data) > 1:
            self._short_write_done = True
            return os.write(fd, bytes(data[: len(data) // 2]))
        self._fail("write")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._fail("fsync")
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._fail("ftruncate")
        os.ftruncate(fd, length)


@dataclass(frozen=True)
class Fault:
    name: str
    err: int
    calls: frozenset[str]
    partial: bool = False


FAULTS = [
    # disk full: a short write, then ENOSPC; truncating the torn batch still works
    Fault("ENOSPC", errno.ENOSPC, frozenset({"write"}), partial=True),
    # read-only file system: nothing can be created, written or truncated
    Fault("EROFS", errno.EROFS, frozenset({"open", "write", "ftruncate"})),
    # I/O error mid-write that also defeats truncation: the torn tail stays in the file
    Fault("EIO", errno.EIO, frozenset({"write", "ftruncate"}), partial=True),
    # I/O error reported by fsync: the bytes went out but are not known to be durable
    Fault("EIO-fsync", errno.EIO, frozenset({"fsync"})),
]

BUDGET = 48 << 10  # max_buffer_bytes
SLACK = 4 << 10  # one flush's worth of batches may land on top of the budget
HEALTHY, FAULTY, RECOVERED = 200, 1500, 200


@pytest.fixture
def faulty_os(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FaultyOS:
    fault: Fault = request.param
    fake = FaultyOS(fault.err, fault.calls, fault.partial)
    monkeypatch.setattr(segment_module, "os", fake)
    return fake


@pytest.mark.parametrize("faulty_os", FAULTS, ids=[f.name for f in FAULTS], indirect=True)
def test_write_fault_never_raises_bounds_memory_reports_and_recovers(
        root: Path, faulty_os: FaultyOS, capfd: pytest.CaptureFixture[str]) -> None:
    """During a fault `log()` never raises, one stderr message is printed, pending bytes
    stay within max_buffer_bytes (plus one small batch) and the excess is dropped and
    counted; after the fault clears, what was kept and what comes next is written, a
    'write_error' event is stored, and finish() reports failed writes and drops. Nothing
    written before the fault is lost."""
    run_id = f"fault-{faulty_os.err}-{'-'.join(sorted(faulty_os.calls))}"
    run = tracklake.init(project="faults", run_id=run_id, root=root, flush_interval=0.02,
                         segment_bytes=16 << 10, max_buffer_bytes=BUDGET,
                         capture_identity=False)
    writer = run._writer
    try:
        for step in range(HEALTHY):
            log_step(run, step)
            if step % 50 == 49:  # the budget bounds memory whether the disk works or not
                assert run.flush()

        faulty_os.active = True
        peak = 0
        for step in range(HEALTHY, HEALTHY + FAULTY):
            log_step(run, step)  # must not raise
            run.flush()
            peak = max(peak, writer._pending_bytes)
            assert writer._pending_bytes <= BUDGET + SLACK
            assert writer.buffered_values <= KEYS
        assert faulty_os.injected > 0
        assert writer.failures.count > 0
        assert writer.failures.dropped_values > 0, "the budget was exceeded: values must drop"
        assert peak > BUDGET // 2
        assert not run.flush(), "nothing can be written while the fault lasts"

        faulty_os.active = False
        flush_until_written(run)  # the next retry (after its backoff) succeeds
        assert not writer.dropping
        for step in range(HEALTHY + FAULTY, HEALTHY + FAULTY + RECOVERED):
            log_step(run, step)
            if step % 50 == 49:
                assert run.flush()
        assert run.flush()
    finally:
        faulty_os.active = False
        report = run.finish()

    err = capfd.readouterr().err
    messages = cannot_write_messages(err)
    assert len(messages) == 1, err
    assert str(root) in messages[0] and os.strerror(faulty_os.err) in messages[0]
    assert "finished with unwritten data" in err  # values were dropped: finish() says so

    steps = stored_steps(root, run_id)
    assert_whole_steps(steps, range(HEALTHY))  # written before the fault
    assert_whole_steps(steps, range(HEALTHY + FAULTY, HEALTHY + FAULTY + RECOVERED))
    during = sorted(s for s in steps if HEALTHY <= s < HEALTHY + FAULTY)
    kept = len(during)
    # what was buffered within budget is the first part of the fault window, whole steps
    assert during == list(range(HEALTHY, HEALTHY + kept)), "kept steps must be a prefix"
    assert 0 < kept < FAULTY
    assert_whole_steps(steps, during)
    assert kept * KEYS + report.dropped_values == FAULTY * KEYS

    assert report.status == "finished"
    assert report.complete is False
    assert report.failed_writes == writer.failures.count > 0
    assert report.dropped_values == writer.failures.dropped_values
    assert report.unwritten_records == 0
    name = errno.errorcode[faulty_os.err]
    assert report.errors_by_errno == {name: report.failed_writes}
    assert os.strerror(faulty_os.err) in (report.last_error or "")
    dropped_texts = len([s for s in range(HEALTHY + kept, HEALTHY + FAULTY)
                         if s % TEXT_EVERY == 0])
    assert report.dropped_records == dropped_texts

    texts = tracklake.query(f"SELECT step FROM texts WHERE run = '{run_id}' ORDER BY step",
                            root=root).column("step").to_pylist()
    assert texts == [s for s in sorted(steps) if s % TEXT_EVERY == 0]

    events = tracklake.query(
        f"SELECT level, kind, title, text FROM events WHERE run = '{run_id}'",
        root=root).to_pylist()
    assert [e["kind"] for e in events] == ["write_error"]
    assert events[0]["level"] == "warning"
    assert name in events[0]["text"]
    assert f"dropped {report.dropped_values} metric values" in events[0]["text"]

    attempt = tracklake.find_run(root, run_id).attempts[0]
    assert attempt["status"] == "finished"
    assert attempt["write_report"]["failed_writes"] == report.failed_writes
    assert attempt["write_report"]["dropped_values"] == report.dropped_values

    problems = tracklake.ReadProblems()
    rows = sum(b.num_rows for _, b in tracklake.read_run(
        root, tracklake.Cursor("faults", run_id), kinds=("metrics",), problems=problems))
    assert problems.damaged == []
    assert rows == len(steps) * KEYS
    compaction = tracklake.compact(root=root)
    assert compaction.skipped == []
    assert stored_steps(root, run_id) == steps


@pytest.mark.parametrize("faulty_os", [FAULTS[0]], ids=["ENOSPC"], indirect=True)
def test_pending_bytes_stay_bounded_with_only_the_background_flush(
        root: Path, faulty_os: FaultyOS) -> None:
    """Without explicit flush() calls (only the background thread flushes), a loop logging
    through a long fault keeps pending bytes within the budget plus what one flush interval
    buffers, far below what it logged, and drops (and counts) the rest."""
    steps = 8000
    run = tracklake.init(project="faults", run_id="no-flush-calls", root=root,
                         flush_interval=0.01, max_buffer_bytes=BUDGET,
                         capture_identity=False)
    writer = run._writer
    try:
        faulty_os.active = True
        run.log({f"k{k}": value_of(0, k) for k in range(KEYS)}, step=0)
        assert faulty_os.failed.wait(60), "the background thread never tried to write"
        peak = 0
        for step in range(1, steps):
            run.log({f"k{k}": value_of(step, k) for k in range(KEYS)}, step=step)
            if step % 10 == 0:
                peak = max(peak, writer._pending_bytes)
        peak = max(peak, writer._pending_bytes)
        assert writer.failures.count > 0
        # unbounded, the 64,000 values would take ~2.5 MB of batches
        assert peak <= BUDGET + (256 << 10), peak
        assert writer.failures.dropped_values > steps * KEYS // 2
    finally:
        faulty_os.active = False
        report = run.finish()
    assert report.failed_writes > 0 and report.dropped_values > 0
    assert report.unwritten_records == 0
    kept = stored_steps(root, "no-flush-calls")
    assert len(kept) * KEYS + report.dropped_values == steps * KEYS
    assert_whole_steps(kept, sorted(kept))


@pytest.mark.parametrize("faulty_os", [FAULTS[0], FAULTS[3]], ids=["ENOSPC", "EIO-fsync"],
                         indirect=True)
def test_failed_segment_creation_does_not_leak_file_descriptors(
        root: Path, faulty_os: FaultyOS) -> None:
    """Retries that fail while creating a new segment must not leave descriptors open."""
    run = tracklake.init(project="faults", run_id="fd-leak", root=root, flush_interval=0.001,
                         capture_identity=False)
    try:
        faulty_os.active = True
        for step in range(50):
            log_step(run, step)
            run._writer._flusher._retry_at = 0.0  # each flush retries now, as after its backoff
            run.flush()
        assert run._writer.failures.count >= 2
        faulty_os.active = False
        flush_until_written(run)
    finally:
        faulty_os.active = False
        report = run.finish()
    assert report.failed_writes >= 2
    assert len(stored_steps(root, "fd-leak")) == 50
    assert store_fds(root) == []


@pytest.mark.parametrize("faulty_os", [FAULTS[1]], ids=["EROFS"], indirect=True)
def test_write_error_event_is_stored_when_recovery_happens_in_finish(
        root: Path, faulty_os: FaultyOS) -> None:
    """A fault that clears just before finish(): finish() writes the kept data, and the
    'write_error' event saying that writes failed must reach the store too."""
    run = tracklake.init(project="faults", run_id="late-recovery", root=root,
                         flush_interval=1.0, capture_identity=False)
    faulty_os.active = True
    for step in range(20):
        log_step(run, step)
    assert not run.flush()
    faulty_os.active = False
    report = run.finish()
    assert report.failed_writes >= 1 and report.unwritten_records == 0
    assert len(stored_steps(root, "late-recovery")) == 20
    kinds = tracklake.query("SELECT kind FROM events", root=root).column("kind").to_pylist()
    assert kinds == ["write_error"]


@pytest.mark.parametrize("faulty_os", [FAULTS[1]], ids=["EROFS"], indirect=True)
def test_write_error_event_is_stored_with_a_long_flush_interval(
        root: Path, faulty_os: FaultyOS) -> None:
    """flush_interval=60: after a failed write and a later successful retry, the
    'write_error' event is stored like with the default interval."""
    run = tracklake.init(project="faults", run_id="slow-flush", root=root,
                         flush_interval=60.0, capture_identity=False)
    try:
        faulty_os.active = True
        log_step(run, 0)
        assert not run.flush()
        faulty_os.active = False
        flush_until_written(run)
    finally:
        faulty_os.active = False
        run.finish()
    kinds = tracklake.query("SELECT kind FROM events", root=root).column("kind").to_pylist()
    assert kinds == ["write_error"]


# -- (b) a real tmpfs: full disk, read-only remount ----------------------------------------


def _run_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for this test (skipped where mounting is not permitted)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    result = _run_cmd("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mnt
    finally:
        _run_cmd("mount", "-o", "remount,rw", str(mnt))
        if _run_cmd("umount", str(mnt)).returncode != 0:
            _run_cmd("umount", "-l", str(mnt))


def fill_disk(path: Path, leave: int = 0) -> int:
    """Write a filler file until the file system is full (or only `leave` bytes remain)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    written = 0
    try:
        while True:
            st = os.statvfs(path)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                break
            try:
                written += os.write(fd, b"\0" * min(room, 64 << 10))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    return written


def noise(step: int, k: int) -> float:
    """A deterministic, incompressible value in [0, 1) (so the disk really fills)."""
    digest = hashlib.blake2b(step.to_bytes(8, "little"), digest_size=64).digest()
    return int.from_bytes(digest[8 * k: 8 * k + 8], "little") / 2.0**64


def log_noise(run: tracklake.Run, step: int) -> None:
    run.log({f"k{k}": noise(step, k) for k in range(KEYS)}, step=step)


def test_real_full_disk_keeps_training_and_earlier_data_readable(
        tmpfs: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """On a tmpfs that really fills up: the loop keeps logging, everything flushed before
    the disk filled stays readable with tracklake.query in place and from a copy, and once
    space is freed the run recovers and records the failure."""
    root = tmpfs / "store"
    filler = tmpfs / "filler"
    fill_disk(filler, leave=300 << 10)  # ~300 KiB left for the store
    run = tracklake.init(project="full", run_id="tmpfs", root=root, flush_interval=0.02,
                         segment_bytes=32 << 10, max_buffer_bytes=128 << 10,
                         capture_identity=False)
    writer = run._writer
    durable = -1  # last step of a flush() that reported everything written
    step = 0
    try:
        while writer.failures.count == 0:
            log_noise(run, step)
            if step % 20 == 19 and run.flush():
                durable = step
            step += 1
            assert step < 100_000, "the tmpfs never filled"
        assert durable > 100
        first_failure = step
        for _ in range(3000):  # the training loop goes on regardless
            log_noise(run, step)
            run.flush()
            step += 1
        assert "ENOSPC" in writer.failures.by_errno
        assert writer.failures.dropped_values > 0

        in_place = stored_steps(root, "tmpfs")
        assert_whole_steps(in_place, range(durable + 1), noise)
        assert max(in_place) < first_failure + 3000
        copy = tmp_path / "copy"
        shutil.copytree(root, copy)
        assert stored_steps(copy, "tmpfs") == in_place
        assert tracklake.compact(root=copy).skipped == []
        assert stored_steps(copy, "tmpfs") == in_place

        filler.unlink()  # space comes back
        flush_until_written(run)  # the next retry (after its backoff) succeeds
        resumed = step
        for _ in range(200):
            log_noise(run, step)
            step += 1
        assert run.flush()
    finally:
        report = run.finish()
    assert report.failed_writes > 0 and report.errors_by_errno.get("ENOSPC", 0) > 0
    assert report.dropped_values > 0 and report.complete is False
    assert report.unwritten_records == 0
    final = stored_steps(root, "tmpfs")
    assert_whole_steps(final, range(durable + 1), noise)
    assert_whole_steps(final, range(resumed, step), noise)
    kinds = tracklake.query("SELECT kind FROM events", root=root).column("kind").to_pylist()
    assert kinds == ["write_error"]
    assert len(cannot_write_messages(capfd.readouterr().err)) == 1


def test_compact_on_a_full_disk_fails_cleanly(tmpfs: Path) -> None:
    """compact() on a full disk raises OSError (it is not in the training loop) and leaves
    the store exactly as readable as before, with no temporary part left behind."""
    root = tmpfs / "store"
    run = tracklake.init(project="full", run_id="compact", root=root, flush_interval=3600,
                         capture_identity=False)
    for step in range(2000):
        log_noise(run, step)
    assert run.finish().complete
    before = stored_steps(root, "compact")
    files_before = sorted(p for p in root.rglob("*") if p.is_file())
    fill_disk(tmpfs / "filler")
    with pytest.raises(OSError) as info:
        tracklake.compact(root=root)
    assert info.value.errno == errno.ENOSPC
    assert sorted(p for p in root.rglob("*") if p.is_file()) == files_before
    assert stored_steps(root, "compact") == before
    (tmpfs / "filler").unlink()
    assert tracklake.compact(root=root).parts_written
    assert stored_steps(root, "compact") == before


def test_failed_artifact_on_full_disk_leaves_no_partial_blob(tmpfs: Path) -> None:
    """log_artifact() larger than the free space returns None without raising, and the
    space it took is given back, so metrics logged afterwards are still written."""
    root = tmpfs / "store"
    run = tracklake.init(project="full", run_id="artifact", root=root, flush_interval=0.02,
                         capture_identity=False)
    try:
        log_step(run, 0)
        assert run.flush()
        st = os.statvfs(tmpfs)
        free = st.f_bavail * st.f_frsize
        assert run.log_artifact(os.urandom(free + (64 << 10)), name="big.bin") is None
        assert run._writer.failures.count == 1
        log_step(run, 1)
        partial = list((root / "blobs" / "tmp").iterdir())
        written = run.flush()
    finally:
        report = run.finish(timeout=1.0)
    assert partial == [], f"partial blob left behind: {partial}"
    assert written
    assert report.unwritten_records == 0


def test_finish_on_a_still_full_disk_reports_consistently(tmpfs: Path,
                                                          capfd: pytest.CaptureFixture[str]
                                                          ) -> None:
    """finish() while the disk is still full: it returns (no exception) an incomplete
    report whose per-errno counts add up to failed_writes, and says so on stderr."""
    root = tmpfs / "store"
    run = tracklake.init(project="full", run_id="still-full", root=root, flush_interval=0.02,
                         capture_identity=False)
    log_step(run, 0)
    assert run.flush()
    fill_disk(tmpfs / "filler")
    for step in range(1, 50):
        log_step(run, step)
    report = run.finish(timeout=0.5)
    assert report.complete is False
    assert report.unwritten_records > 0
    assert "finished with unwritten data" in capfd.readouterr().err
    assert stored_steps(root, "still-full").keys() >= {0}
    assert sum(report.errors_by_errno.values()) == report.failed_writes


def test_read_only_remount_mid_run(tmpfs: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The store's file system is remounted read-only while the run is idle between
    segments: logging goes on without raising, the store stays queryable, and after the
    remount back to read-write everything logged meanwhile is written (nothing dropped)."""
    root = tmpfs / "store"
    run = tracklake.init(project="ro", run_id="remount", root=root, flush_interval=0.02,
                         capture_identity=False)
    try:
        for step in range(100):
            log_step(run, step)
        assert run.flush()
        # a file system with files open for writing cannot be remounted read-only: let the
        # segments reach their age limit, so that the next flush seals and closes them
        run._writer._flusher.segment_seconds = 0
        assert run.flush()
        run._writer._flusher.segment_seconds = 600
        assert store_fds(root) == []
        result = _run_cmd("mount", "-o", "remount,ro", str(tmpfs))
        if result.returncode != 0:
            pytest.skip(f"cannot remount read-only: {result.stderr.strip()}")
        try:
            for step in range(100, 400):
                log_step(run, step)
                assert not run.flush()
            assert set(run._writer.failures.by_errno) == {"EROFS"}
            during = stored_steps(root, "remount")
            assert sorted(during) == list(range(100))
            assert_whole_steps(during, range(100))
        finally:
            assert _run_cmd("mount", "-o", "remount,rw", str(tmpfs)).returncode == 0
        flush_until_written(run)
    finally:
        report = run.finish()
    assert report.complete is True  # nothing was dropped: all of it reached the disk
    assert report.failed_writes > 0 and set(report.errors_by_errno) == {"EROFS"}
    assert "Read-only file system" in (report.last_error or "")
    steps = stored_steps(root, "remount")
    assert sorted(steps) == list(range(400))
    assert_whole_steps(steps, range(400))
    kinds = tracklake.query("SELECT kind FROM events", root=root).column("kind").to_pylist()
    assert kinds == ["write_error"]
    messages = cannot_write_messages(capfd.readouterr().err)
    assert len(messages) == 1 and "Read-only file system" in messages[0]


# -- (c) a store that cannot be written at init() -----------------------------------------


def test_init_with_root_that_is_a_file_raises_naming_it(tmp_path: Path) -> None:
    """init() is outside the training loop: a root that is a regular file raises at once,
    naming the path."""
    root = tmp_path / "not-a-dir"
    root.write_text("x")
    with pytest.raises(OSError) as info:
        tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    assert str(root) in str(info.value)
    assert root.read_text() == "x"


def test_init_without_write_permission_raises_naming_the_path(tmp_path: Path) -> None:
    """A store root the process may not write (permission bits; checked in a child without
    CAP_DAC_OVERRIDE, since root ignores them) makes init() raise PermissionError naming
    the path, and creates nothing."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to drop CAP_DAC_OVERRIDE in a child")
    parent = tmp_path / "locked"
    parent.mkdir()
    existing = parent / "store"
    existing.mkdir()
    parent.chmod(0o555)
    existing.chmod(0o555)
    code = ("import sys, tracklake\n"
            "try:\n"
            "    tracklake.init(project='p', run_id='r', root=sys.argv[1],"
            " capture_identity=False)\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__, exc.filename, str(exc), sep='\\n')\n"
            "else:\n"
            "    print('no error')\n")
    try:
        for root, named in ((parent / "new-store", parent / "new-store"),
                            (existing, existing / "runs")):
            result = subprocess.run(
                ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                 sys.executable, "-c", code, str(root)],
                capture_output=True, text=True, check=False, timeout=60)
            if "setpriv" in result.stderr:
                pytest.skip(f"setpriv cannot drop capabilities: {result.stderr.strip()}")
            lines = result.stdout.splitlines()
            assert result.returncode == 0, result.stderr
            assert lines[0] == "PermissionError", result.stdout
            assert str(root) in lines[2] and lines[1] == str(named)
        assert sorted(parent.iterdir()) == [existing]
        assert list(existing.iterdir()) == []
    finally:
        parent.chmod(0o755)
        existing.chmod(0o755)


def test_init_on_read_only_mount_raises_naming_the_path(tmpfs: Path) -> None:
    """A store on a read-only file system: init() raises OSError(EROFS) naming the path."""
    root = tmpfs / "store"
    root.mkdir()
    assert _run_cmd("mount", "-o", "remount,ro", str(tmpfs)).returncode == 0
    with pytest.raises(OSError) as info:
        tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    assert info.value.errno == errno.EROFS
    assert str(root) in str(info.value)


def test_init_on_a_full_disk_raises_naming_the_path(tmpfs: Path) -> None:
    """init() on a full disk raises OSError naming the store path, and leaves no empty
    attempt claim or temporary file behind."""
    root = tmpfs / "store"
    root.mkdir()
    fill_disk(tmpfs / "filler")
    with pytest.raises(OSError) as info:
        tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    assert info.value.errno == errno.ENOSPC
    leftovers = sorted(p.name for p in (root / "runs").rglob("*") if p.is_file())
    assert str(root) in str(info.value), str(info.value)
    assert leftovers == []


# -- (d) a file system that hangs ------------------------------------------------------


class HangingOS:
    """Stands in for the `os` module inside tracklake._format.segment: while `hang` is set,
    write and fsync block (as on a stuck NFS/Lustre mount) until `release` is set."""

    def __init__(self) -> None:
        self.hang = False
        self.entered = threading.Event()  # a write is blocked now
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _block(self) -> None:
        if self.hang and not self.release.is_set():
            self.entered.set()
            self.release.wait()

    def write(self, fd: int, data: Any) -> int:
        self._block()
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._block()
        os.fsync(fd)


def test_a_hung_write_never_stalls_logging_and_finish_returns_by_its_deadline(
        root: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """While a write does not return, log() keeps returning: the buffer is bounded by
    dropping (counted, said once), flush(timeout) and finish(timeout) return while the
    write still hangs, and the report says what is unwritten. Once the file system comes
    back, what was kept is written and the attempt is finished."""
    hung = HangingOS()
    monkeypatch.setattr(segment_module, "os", hung)
    # turns a stalled test into a failure instead of a hang; it never fires when all is well
    watchdog = threading.Timer(60, hung.release.set)
    watchdog.start()
    run = tracklake.init(project="hung", run_id="nfs", root=root, flush_interval=0.01,
                         max_buffer_bytes=BUDGET, capture_identity=False)
    try:
        for step in range(50):
            log_step(run, step)
        assert run.flush()
        hung.hang = True
        log_step(run, 50)
        assert hung.entered.wait(60), "the writer never started the hung write"
        for step in range(51, 1000):
            log_step(run, step)  # must return although the write never does
            if step % 250 == 0:
                assert not run.flush(timeout=0.01)
        report = run.finish(timeout=0.5)
        assert not hung.release.is_set(), "finish() returned only once the write did"
    finally:
        hung.release.set()
        watchdog.cancel()
    assert report.complete is False
    assert report.unwritten_records > 0 and report.dropped_values > 0
    assert report.failed_writes == 0
    assert "has not returned" in (report.last_error or "")
    err = capfd.readouterr().err
    assert err.count("has not returned for") == 2, err  # once when dropping, once at finish
    assert run._writer._flusher._stopped.wait(60), "the writer did not finish after the release"
    steps = stored_steps(root, "nfs")
    kept = sorted(steps)
    assert kept == list(range(len(kept))), "what was kept is a prefix of the steps"
    assert_whole_steps(steps, kept)
    assert len(kept) * KEYS + report.dropped_values == 1000 * KEYS
    assert tracklake.find_run(root, "nfs").attempts[0]["status"] == "finished"


def test_lifecycle_commands_on_a_full_disk_say_so_in_one_line(tmpfs: Path) -> None:
    """compact, fsck --repair, retain --apply and unpack on a full disk: each either does
    what fits or stops with one line naming the file and the error, never a traceback;
    and the store still answers as before."""
    root = tmpfs / "store"
    with tracklake.init(project="p", run_id="r", root=root, compact=False) as run:
        for step in range(2000):
            run.log({"loss": float(step), "acc": 0.5}, step=step)
    pack = tmpfs.parent / "r.tlpack"
    cli = [sys.executable, "-m", "tracklake._cli"]
    assert _run_cmd(*cli, "pack", "--root", str(root), "--run", "r",
                    "--output", str(pack)).returncode == 0
    before = tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist()
    fill_disk(tmpfs / "filler")
    for args in (["compact", "--root", str(root)],
                 ["fsck", "--root", str(root), "--repair"],
                 ["retain", "--root", str(root), "--downsample-after", "0s", "--apply"],
                 ["unpack", str(pack), "--root", str(tmpfs / "other")]):
        result = _run_cmd(*cli, *args)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        if result.returncode != 0:
            lines = [x for x in result.stderr.splitlines() if x.startswith("tracklake: error")]
            assert len(lines) == 1 and "No space left on device" in lines[0], (
                args, result.stderr)
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist() == before


def test_a_full_disk_leaves_questions_answering_and_nothing_derived_half_written(
        tmpfs: Path) -> None:
    """With the disk full, a finished run's compactor cannot record that the catalog and
    bundles are wanted, a deriver cannot build them, and a question cannot save its
    catalog or decoded cache: each says so in one line or goes on without them, the
    answers are those of before, and nothing half-written stays under `.cache`. Once
    space is freed, the next deriver builds as usual."""
    from _settled import age

    from tracklake._ops import derive
    from tracklake._ops.bundle import BUNDLE_MIN_RUNS
    from tracklake._read.bundles import bundle_paths
    from tracklake._read.catalog import RunCatalog

    root = tmpfs / "store"
    for i in range(BUNDLE_MIN_RUNS):
        with tracklake.init(project="p", run_id=f"r{i:03d}", root=root,
                            capture_identity=False, compact=False) as run:
            for step in range(5):
                run.log({"loss": float(i * 10 + step)}, step=step)
    tracklake.compact(root=root)
    question = "SELECT run, arg_max(value, step) AS last FROM metrics GROUP BY run ORDER BY run"
    want = tracklake.query(question, root=root).to_pylist()
    assert len(want) == BUNDLE_MIN_RUNS
    shutil.rmtree(root / ".cache")
    derive.want(root, time.time() - 600)  # a run settled long ago: no waiting
    age(root)
    fill_disk(tmpfs / "filler")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    compactor = subprocess.run([sys.executable, "-m", "tracklake._ops.auto", str(root), "p",
                                "r000", "0"], capture_output=True, text=True, env=env,
                               timeout=120)
    deriver = subprocess.run([sys.executable, "-m", "tracklake._ops.derive", str(root)],
                             capture_output=True, text=True, env=env, timeout=120)
    for done in (compactor, deriver):
        assert "Traceback" not in done.stderr, done.stderr
        if done.returncode:
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr
            assert f"{root}/.cache/" in lines[0], done.stderr  # naming the file
    assert deriver.returncode == 1, deriver.stderr  # it could not build, and said why
    assert tracklake.query(question, root=root).to_pylist() == want
    assert tracklake.query(question, root=root).to_pylist() == want
    left = sorted(str(p.relative_to(root)) for p in (root / ".cache").rglob("*")
                  if (p.is_file() and p.stat().st_size == 0) or ".part-" in p.name
                  or p.name.endswith(".tmp"))
    assert left == [], left
    assert bundle_paths(root) == [] and RunCatalog(root)._table.num_rows == 0
    (tmpfs / "filler").unlink()
    deriver = subprocess.run([sys.executable, "-m", "tracklake._ops.derive", str(root)],
                             capture_output=True, text=True, env=env, timeout=120)
    assert deriver.returncode == 0, deriver.stderr
    assert len(bundle_paths(root)) == 1
    assert len(RunCatalog(root)._table) == BUNDLE_MIN_RUNS
    assert tracklake.query(question, root=root).to_pylist() == want
