"""Ship mode: ranks write to a node-local folder and their records are moved into the
store's root exactly once — live within seconds, after the writer is killed (by `tracklake
ship`, itself killed again and again), while the root is compacted, and never by two
shippers at once."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import tracklake
from tracklake._format import StreamId, stream_dir
from tracklake._format.layout import local_base
from tracklake._format.segment import read_segment
from tracklake._ops.ship import Shipper

WRITER = textwrap.dedent("""
    import sys, time, tracklake
    root, steps, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    run = tracklake.init(project="p", run_id="live", root=root, capture_identity=False,
                         flush_interval=0.05, segment_bytes=32 << 10)
    for step in range(steps):
        run.log({"loss": step * 0.5, "acc": step / 1000.0}, step=step)
        if step == 50:
            print("logging", flush=True)
        time.sleep(pause)
    run.finish()
    print("finished", flush=True)
""")


@pytest.fixture
def writers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def _writer(writers: list[subprocess.Popen[str]], tmp_path: Path, root: Path, local: Path,
            steps: int, pause: float, interval: float = 0.2) -> subprocess.Popen[str]:
    """A process writing a run in ship mode (the one setting: TRACKLAKE_LOCAL_ROOT); it
    prints "logging" once it has logged 50 steps."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "TRACKLAKE_LOCAL_ROOT": str(local),
           "TRACKLAKE_SHIP_INTERVAL": str(interval)}
    writers.append(subprocess.Popen(
        [sys.executable, str(script), str(root), str(steps), str(pause)], env=env,
        stdout=subprocess.PIPE, text=True))
    return writers[-1]


def _points(root: Path) -> Counter[tuple[int, str, float]]:
    rows = tracklake.query("SELECT step, key, value FROM metrics", root=root).to_pylist()
    return Counter((r["step"], r["key"], r["value"]) for r in rows)


def _stored_rows(root: Path) -> Counter[tuple[str, int, str]]:
    """(stream directory, seq, key) of every metric row in the root's files, read with
    plain pyarrow: a record shipped twice shows here even where the reader would hide it
    (a seq range held by two files is read once)."""
    import pyarrow.parquet as pq

    rows: Counter[tuple[str, int, str]] = Counter()
    for path in (root / "metrics").rglob("*"):
        if path.suffix == ".parquet":
            tables = [pq.read_table(path, columns=["seq", "key"])]
        elif path.suffix == ".arrows":
            tables = [pa.Table.from_batches(read_segment(path).batches)]
        else:
            continue
        for table in tables:
            for seq, key in zip(table.column("seq").to_pylist(),
                                table.column("key").to_pylist(), strict=True):
                rows[(str(path.parent), seq, key)] += 1
    return rows


def _once(root: Path) -> None:
    rows = _stored_rows(root)
    assert rows and max(rows.values()) == 1, [r for r, n in rows.items() if n > 1][:5]


def _expected(steps: int) -> Counter[tuple[int, str, float]]:
    return Counter({(s, k, v): 1 for s in range(steps)
                    for k, v in (("loss", s * 0.5), ("acc", s / 1000.0))})


def _local_segments(local: Path) -> list[Path]:
    return sorted(local.rglob("*.arrows"))


def _ship(root: Path, local: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracklake._cli.main", "ship", "--root",
                           str(root), "--local", str(local)], capture_output=True, text=True,
                          timeout=120)


def test_a_run_shows_in_the_root_while_it_is_written_and_whole_once_finished(
        root: Path, tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    local = tmp_path / "node-local"
    writer = _writer(writers, tmp_path, root, local, steps=1500, pause=0.004)
    assert writer.stdout is not None and writer.stdout.readline() == "logging\n"
    seen_live = 0
    deadline = time.monotonic() + 20
    while writer.poll() is None and time.monotonic() < deadline and not seen_live:
        seen_live = sum(_points(root).values())
        time.sleep(0.2)
    assert writer.wait(60) == 0
    assert 0 < seen_live < 3000  # records were in the root while the run was written
    assert _points(root) == _expected(1500)
    _once(root)
    assert _local_segments(local) == []  # shipped segments leave the node's disk
    status = tracklake.query("SELECT status FROM runs", root=root).to_pylist()
    assert status == [{"status": "finished"}]


def test_records_a_killed_writer_left_are_shipped_once_by_tracklake_ship_killed_too(
        root: Path, tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    """The writer is killed with its records not shipped yet (a long shipping interval);
    `tracklake ship`, killed at random moments and run again, ends with each record in
    the root exactly once."""
    local = tmp_path / "node-local"
    writer = _writer(writers, tmp_path, root, local, steps=60_000, pause=0.0001,
                     interval=3600)
    assert writer.stdout is not None and writer.stdout.readline() == "logging\n"
    time.sleep(2.0)  # logging, its first shipping round an hour away
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(30) == -signal.SIGKILL
    shipped_by_writer = sum(_points(root).values())
    logged = _local_segments(local)
    assert logged, "the killed writer left nothing to ship"
    # shippers ended by os._exit at random moments of their work
    rng = random.Random(20261203)
    cut_short = 0
    for _ in range(8):
        grow = rng.randint(512, 8 << 10)  # a few batches: the backlog is far larger
        killed = subprocess.run([sys.executable, "-c", SHIP_THEN_DIE, str(local), str(root),
                                 str(grow)], capture_output=True, text=True, timeout=120)
        assert killed.returncode in (0, 9), killed.stderr
        cut_short += killed.returncode == 9
    done = _ship(root, local)
    assert done.returncode == 0, done.stderr
    points = _points(root)
    steps = max(s for s, _, _ in points) + 1
    assert points == _expected(steps)  # a prefix of the run, each point once
    _once(root)
    assert shipped_by_writer == 0 and _local_segments(local) == []
    assert cut_short >= 3


#: A shipper of every leftover stream that ends its process with os._exit(9) once the
#: root's metric files grew by argv[3] bytes (exit 0 if it finished first): a kill in
#: the middle of its work, wherever that falls.
SHIP_THEN_DIE = textwrap.dedent("""
    import os, sys, threading, time
    from pathlib import Path
    from tracklake._format.layout import local_base
    from tracklake._ops.ship import Shipper
    local, root, grow = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    def size():
        return sum(p.stat().st_size for p in (root / "metrics").rglob("*.arrows"))
    def watch(start):
        while size() < start + grow:
            time.sleep(0.0005)
        os._exit(9)
    shipper = Shipper(local_base(local.absolute(), root.absolute()), root)
    threading.Thread(target=watch, args=(size(),), daemon=True).start()
    shipper.ship(leftovers=True)
    shipper.close()
    os._exit(0)
""")


def test_compaction_of_the_root_between_a_kill_and_the_late_shipping_loses_nothing(
        root: Path, tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    """The root compacts the killed writer's shipped segments (its torn last one too);
    the records shipped later go into a segment numbered above the parts."""
    local = tmp_path / "node-local"
    writer = _writer(writers, tmp_path, root, local, steps=60_000, pause=0.0001,
                     interval=0.5)
    assert writer.stdout is not None and writer.stdout.readline() == "logging\n"
    time.sleep(1.5)
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(30) == -signal.SIGKILL
    assert _local_segments(local)
    compacted = subprocess.run([sys.executable, "-m", "tracklake._cli.main", "compact",
                                "--root", str(root)], capture_output=True, text=True)
    assert compacted.returncode == 0, compacted.stderr
    assert "compacted 0 segments" not in compacted.stdout
    done = _ship(root, local)
    assert done.returncode == 0, done.stderr
    points = _points(root)
    assert points == _expected(max(s for s, _, _ in points) + 1)
    _once(root)


def test_a_live_writer_s_streams_are_left_to_its_own_shipper(
        root: Path, tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    local = tmp_path / "node-local"
    writer = _writer(writers, tmp_path, root, local, steps=600, pause=0.005, interval=3600)
    assert writer.stdout is not None and writer.stdout.readline() == "logging\n"
    done = _ship(root, local)
    assert done.returncode == 0, done.stderr
    assert "shipped 0 records" in done.stdout and "its writer lives" in done.stdout
    assert writer.wait(60) == 0
    assert _points(root) == _expected(600)  # shipped at finish(), once
    _once(root)


def test_a_shipper_killed_mid_batch_ships_the_torn_batch_again_into_a_new_segment(
        root: Path, tmp_path: Path) -> None:
    """What a kill mid-append leaves: the root's last segment unsealed, its last batch
    cut in half, and the local files not yet deleted. The next shipper starts from the
    last complete batch, in a new segment: every record once."""
    local = local_base(tmp_path / "node-local", root)
    ident = StreamId("p", "r", 0, 1, "metrics")
    with tracklake.init(project="p", run_id="r", root=local, capture_identity=False,
                        segment_bytes=4 << 10, flush_interval=0.01) as run:
        for step in range(400):  # a local folder has a store's layout
            run.log({"x": float(step)}, step=step)
            if step % 50 == 0:
                run.flush()
    shutil.copytree(local / "runs", root / "runs", dirs_exist_ok=True)
    shutil.rmtree(local / "runs")
    kept = tmp_path / "kept"
    shutil.copytree(local, kept)
    first = Shipper(local, root)
    first.ship(leftovers=True)
    first.close()
    shutil.rmtree(local)
    shutil.copytree(kept, local)  # killed before it deleted the local files
    shipped = sorted(stream_dir(root, ident).glob("*.arrows"))
    ends = read_segment(shipped[-1]).ends
    assert len(shipped) > 1 and len(ends) > 1
    with shipped[-1].open("r+b") as f:
        f.truncate(ends[-2] + (ends[-1] - ends[-2]) // 2)
    again = Shipper(local, root)
    try:
        report = again.ship(leftovers=True)
    finally:
        again.close()
    assert 0 < report.records < 400
    assert len(list(stream_dir(root, ident).glob("*.arrows"))) == len(shipped) + 1
    rows = tracklake.query("SELECT step FROM metrics WHERE key = 'x'", root=root).to_pylist()
    assert Counter(r["step"] for r in rows) == Counter(range(400))
    _once(root)


def test_a_local_folder_inside_the_store_or_around_it_is_refused(root: Path) -> None:
    for local in (root / "local", root.parent):
        with pytest.raises(ValueError, match="must be apart"):
            tracklake.init(project="p", run_id="r", root=root, local_root=local)
    unusable = root.parent / "a-file"
    unusable.write_text("")
    with pytest.raises(OSError, match="node-local folder"):
        tracklake.init(project="p", run_id="r", root=root, local_root=unusable / "x")
    assert not list((root / "runs").iterdir())  # refused before anything was written


def test_a_fifo_or_a_link_named_as_a_segment_is_never_opened(root: Path,
                                                              tmp_path: Path) -> None:
    """Planted in the node-local folder or in the root's stream directory, a FIFO (which
    would block its reader) or a link out of the folder is passed over, and the records
    are shipped."""
    from tracklake._format import segment_name

    local = local_base(tmp_path / "node-local", root)
    with tracklake.init(project="p", run_id="r", root=local, capture_identity=False) as run:
        run.log({"x": 1.0}, step=0)
    shutil.copytree(local / "runs", root / "runs", dirs_exist_ok=True)
    shutil.rmtree(local / "runs")
    ident = StreamId("p", "r", 0, 1, "metrics")
    os.mkfifo(stream_dir(local, ident) / segment_name(7, 100))
    (stream_dir(local, ident) / segment_name(8, 200)).symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"not a segment")
    stream_dir(root, ident).mkdir(parents=True)
    os.mkfifo(stream_dir(root, ident) / segment_name(9, 50))
    done = _ship(root, tmp_path / "node-local")
    assert done.returncode == 0, done.stderr
    assert "shipped 1 records" in done.stdout
    rows = tracklake.query("SELECT step, value FROM metrics WHERE key = 'x'",
                           root=root).to_pylist()
    assert rows == [{"step": 0, "value": 1.0}]
    assert (tmp_path / "elsewhere").read_bytes() == b"not a segment"


def test_a_root_that_fails_mid_append_loses_and_doubles_nothing(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's disk fills while a batch is appended (half of it written): that
    segment is cut and ended, and the next round ships from the last whole batch into a
    new segment: readers see every record once, none lost behind a tear."""
    import errno

    from tracklake._format import segment as segments

    local = local_base(tmp_path / "node-local", root)
    with tracklake.init(project="p", run_id="r", root=local, capture_identity=False,
                        flush_interval=0.01) as run:
        for step in range(300):
            run.log({"x": float(step)}, step=step)
            if step % 20 == 0:
                run.flush()
    shutil.copytree(local / "runs", root / "runs", dirs_exist_ok=True)
    shutil.rmtree(local / "runs")
    real_write = segments.SegmentWriter._write
    calls = 0

    def full_disk(self: segments.SegmentWriter, data: bytes | bytearray) -> None:
        nonlocal calls
        calls += 1
        if calls == 6:  # half a batch reaches the disk, then it is full
            real_write(self, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, data)

    shipper = Shipper(local, root)
    with monkeypatch.context() as m:
        m.setattr(segments.SegmentWriter, "_write", full_disk)
        with pytest.raises(OSError, match="No space"):
            shipper.ship(leftovers=True)
    shipper.ship()
    shipper.close()
    rows = tracklake.query("SELECT step FROM metrics WHERE key = 'x'", root=root).to_pylist()
    assert Counter(r["step"] for r in rows) == Counter(range(300))
    _once(root)
    assert _local_segments(local) == []
