"""Ship mode: ranks write to a node-local folder and their records are moved into the
store's root exactly once — live within seconds, after the writer is killed (by `tracklake
ship`, itself killed again and again), while the root is compacted, and never by two
shippers at once."""

from __future__ import annotations

import os
import platform
import random
import re
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
from tracklake._format import StreamId, segment_name, stream_dir
from tracklake._format.layout import local_base
from tracklake._format.segment import read_segment
from tracklake._ops.ship import Shipper, ShipReport

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
        elif path.suffix == ".arrows":  # a shipper killed right after creating one: empty
            tables = [pa.Table.from_batches(b) for b in [read_segment(path).batches] if b]
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
    assert "shipped 0 records" in done.stdout and "a live process ships it" in done.stdout
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
    (root.parent / "link-to-root").symlink_to(root)
    (root.parent / "link-to-parent").symlink_to(root.parent)
    for local in (root / "local", root.parent, root.parent / "link-to-root",
                  root.parent / "link-to-parent", root.parent / "link-to-root" / "sub"):
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


#: Rank argv[2] of run "many" in ship mode: logs argv[3] steps (-1: until killed),
#: flushing every 20, and prints "flushed S" once every step up to S is on the node's
#: disk (a SIGKILL may come at any moment after).
RANK = textwrap.dedent("""
    import sys, tracklake
    root, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    run = tracklake.init(project="p", run_id="many", rank=rank, root=root,
                         capture_identity=False, flush_interval=0.05, segment_bytes=16 << 10)
    step = 0
    while step != steps:
        run.log({"loss": rank * 1e6 + step, "acc": step / 1000.0}, step=step)
        if step % 20 == 19 and run.flush(timeout=30):
            print("flushed", step, flush=True)
        step += 1
    run.finish()
""")


def _metric_rows(root: Path) -> Counter[tuple[int, int, int, str]]:
    """(rank, attempt, step, key) of every metric row in the root's files, read with
    plain pyarrow: a record held twice counts twice."""
    import pyarrow.parquet as pq

    rows: Counter[tuple[int, int, int, str]] = Counter()
    for path in (root / "metrics").rglob("*"):
        if path.suffix == ".parquet":
            table = pq.read_table(path, columns=["step", "key"])
        elif path.suffix == ".arrows" and (batches := read_segment(path).batches):
            table = pa.Table.from_batches(batches)
        else:
            continue
        rank = int(path.parent.parent.name.removeprefix("rank="))
        attempt = int(path.parent.name.removeprefix("attempt="))
        for step, key in zip(table.column("step").to_pylist(),
                             table.column("key").to_pylist(), strict=True):
            rows[(rank, attempt, step, key)] += 1
    return rows


def _flushed_steps(text: str) -> list[int]:
    """The steps of the whole `flushed N` lines a rank printed; a line cut short by its
    SIGKILL, or anything else on its stdout, is no evidence of a flush."""
    return [int(m.group(1)) for m in re.finditer(r"^flushed (\d+)\n", text, re.MULTILINE)]


def test_ranks_of_one_node_killed_together_lose_and_double_nothing(
        root: Path, tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    """Three ranks of one run in ship mode on one node are killed together (SIGKILL) while
    they log, with records shipped and records not; then the next rank started on that
    node and `tracklake ship` ship what they left, at the same time. Every row a rank
    flushed before its kill is in the root exactly once, and nothing is doubled."""
    local = tmp_path / "node-local"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "TRACKLAKE_LOCAL_ROOT": str(local), "TRACKLAKE_SHIP_INTERVAL": "0.3"}
    for rank in range(3):
        writers.append(subprocess.Popen(
            [sys.executable, str(script), str(root), str(rank), "-1"], env=env,
            stdout=subprocess.PIPE, text=True))
    last = [0, 0, 0]
    for rank, writer in enumerate(writers):  # each flushed hundreds of steps, some shipped
        assert writer.stdout is not None
        while last[rank] < 400:
            line = writer.stdout.readline()
            assert line, f"rank {rank} ended: {writer.wait()}"
            last[rank] = max([last[rank], *_flushed_steps(line)])
    deadline = time.monotonic() + 60
    while {r for r, _, _, _ in _metric_rows(root)} != {0, 1, 2}:  # each shipped some
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for writer in writers:
        writer.send_signal(signal.SIGKILL)
    for rank, writer in enumerate(writers):
        assert writer.wait(30) == -signal.SIGKILL and writer.stdout is not None
        last[rank] = max([last[rank], *_flushed_steps(writer.stdout.read())])
    assert _local_segments(local)  # and each left records unshipped
    nxt = subprocess.Popen([sys.executable, str(script), str(root), "0", "100"], env=env,
                           stdout=subprocess.PIPE, text=True)  # attempt 2 of rank 0
    writers.append(nxt)
    done = _ship(root, local)
    assert done.returncode == 0, done.stderr
    assert nxt.wait(60) == 0
    done = _ship(root, local)
    assert done.returncode == 0, done.stderr
    rows = _metric_rows(root)
    assert max(rows.values()) == 1, [r for r, n in rows.items() if n > 1][:5]
    for rank in range(3):
        held = {step for (r, a, step, _) in rows if r == rank and a == 1}
        assert held >= set(range(last[rank] + 1)), (rank, last[rank], len(held))
        assert held == set(range(len(held)))  # a prefix: nothing in between missing
    assert {s for (r, a, s, _) in rows if (r, a) == (0, 2)} == set(range(100))
    assert _local_segments(local) == []


def _left_locally(root: Path, tmp_path: Path, batches: int = 10) -> tuple[Path, Path]:
    """A node-local folder holding what a killed writer left: run "r" rank 0 in one
    segment of `batches` batches of 10 steps (and rank 1, whole, in a stream of its own);
    that segment's path."""
    local = local_base(tmp_path / "node-local", root)
    for rank in (0, 1):
        with tracklake.init(project="p", run_id="r", rank=rank, root=local,
                            capture_identity=False, flush_interval=3600) as run:
            for step in range(10 * batches):
                run.log({"x": float(step)}, step=step)
                if step % 10 == 9:
                    run.flush()
    shutil.copytree(local / "runs", root / "runs", dirs_exist_ok=True)
    shutil.rmtree(local / "runs")
    segments = sorted(stream_dir(local, StreamId("p", "r", 0, 1, "metrics")).glob("*.arrows"))
    assert len(segments) == 1 and len(read_segment(segments[0]).ends) == batches
    return local, segments[0]


def _damage(path: Path, how: str) -> tuple[int, Path]:
    """Damage the segment at `path` as `how` says: the number of its whole batches that
    stay readable before the damage, and the damaged file."""
    ends = read_segment(path).ends
    data = bytearray(path.read_bytes())
    if how == "truncated mid-batch":
        del data[ends[5] + (ends[6] - ends[5]) // 2 :]
    elif how == "a flipped byte in a batch":
        data[ends[6] - 20] ^= 0x55
    elif how == "a zero-filled tail":
        data[ends[5] :] = bytes(len(data) - ends[5])
    elif how == "a crafted length field":
        data[ends[5] + 4 : ends[5] + 8] = (0x7FFFFFF0).to_bytes(4, "little")
    else:  # garbage planted under the name of the next segment: the segment is whole
        planted = path.with_name(segment_name(1, 100))
        planted.write_bytes(random.Random(7).randbytes(5000))
        return 10, planted
    path.write_bytes(bytes(data))
    return 6, path


@pytest.mark.parametrize("how", ["truncated mid-batch", "a flipped byte in a batch",
                                 "a zero-filled tail", "a crafted length field",
                                 "garbage named as a segment"])
def test_a_damaged_local_segment_ships_its_whole_batches_before_the_damage_and_is_kept(
        root: Path, tmp_path: Path, how: str) -> None:
    """`tracklake ship` ships every whole batch before the damage and none after, goes on
    with the other streams, says what it found naming the file, and keeps the file (as
    `<name>.damaged`, never read again) instead of deleting it."""
    local, segment = _left_locally(root, tmp_path)
    good, segment = _damage(segment, how)
    damaged = segment.read_bytes()
    done = _ship(root, tmp_path / "node-local")
    assert done.returncode == 1, done.stderr  # told by its status too, not only in words
    rows = tracklake.query("SELECT rank, step FROM metrics", root=root).to_pylist()
    assert Counter((r["rank"], r["step"]) for r in rows) == Counter(
        [(0, s) for s in range(10 * good)] + [(1, s) for s in range(100)])
    _once(root)
    kept = segment.with_name(segment.name + ".damaged")
    assert f"{segment}: " in done.stderr and f"kept as {kept}" in done.stderr, done.stderr
    assert kept.read_bytes() == damaged and _local_segments(local) == []
    again = _ship(root, tmp_path / "node-local")  # the kept file is not read again
    assert again.returncode == 0 and "shipped 0 records" in again.stdout, again.stdout
    assert not again.stderr


def test_a_length_field_claiming_gigabytes_is_never_read(root: Path, tmp_path: Path) -> None:
    """A local segment whose batch after the first claims a 100 MB header, followed by a
    64 GB hole: `tracklake ship`, its memory capped at 3 GB, ships the first batch and
    reports the rest, instead of reading the file to its end."""
    import resource

    _, segment = _left_locally(root, tmp_path, batches=1)
    end = read_segment(segment).ends[-1]
    with segment.open("r+b") as f:
        f.truncate(end)
        f.seek(end)
        f.write(b"\xff\xff\xff\xff" + (100 << 20).to_bytes(4, "little"))
        f.truncate(64 << 30)  # sparse: nothing is written

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run([sys.executable, "-m", "tracklake._cli.main", "ship", "--root",
                           str(root), "--local", str(tmp_path / "node-local")],
                          capture_output=True, text=True, timeout=120, preexec_fn=capped)
    assert done.returncode == 1, done.stderr
    assert f"{segment}: " in done.stderr and f"batch at byte {end}" in done.stderr
    rows = tracklake.query("SELECT rank, step FROM metrics", root=root).to_pylist()
    assert Counter((r["rank"], r["step"]) for r in rows) == Counter(
        [(0, s) for s in range(10)] + [(1, s) for s in range(10)])


def test_a_shipper_that_cannot_start_fails_init_and_records_the_attempt_failed(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipping thread cannot start (no threads left): init() raises naming the root
    and the node-local folder, the attempt is recorded failed (not running for as long
    as the process lives), and its streams' claims are given back."""
    import threading
    import types

    from tracklake._write import shipping

    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(shipping, "threading", types.SimpleNamespace(
        Thread=NoThread, Lock=threading.Lock, Event=threading.Event))
    local = tmp_path / "node-local"
    with pytest.raises(RuntimeError, match=f"shipping from {local}.* into {root} could not"):
        tracklake.init(project="p", run_id="r", root=root, local_root=local,
                       capture_identity=False)
    status = tracklake.query("SELECT status FROM runs", root=root).to_pylist()
    assert status == [{"status": "failed"}]
    assert not list(local.rglob(".shipping"))


def test_a_round_that_raises_does_not_end_the_shipping(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of the shipping thread raises something else than OSError (a bug): the
    thread says so and goes on, so the records reach the root while the run lives."""
    real_ship = Shipper.ship
    calls = 0

    def ship_once_broken(self: Shipper, *, leftovers: bool = False) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("a bug")
        return real_ship(self, leftovers=leftovers)

    monkeypatch.setattr(Shipper, "ship", ship_once_broken)
    monkeypatch.setenv("TRACKLAKE_SHIP_INTERVAL", "0.05")
    run = tracklake.init(project="p", run_id="r", root=root, local_root=tmp_path / "local",
                         capture_identity=False, flush_interval=0.01)
    try:
        for step in range(20):
            run.log({"x": float(step)}, step=step)
        run.flush()
        deadline = time.monotonic() + 30
        while sum(_points(root).values()) < 20:  # shipped live, not only at finish()
            assert time.monotonic() < deadline, calls
            time.sleep(0.05)
    finally:
        run.finish()
    assert calls > 1


def test_records_a_failing_root_left_are_shipped_by_the_command_finish_names(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The root refuses the records right after init() (its metrics folder replaced by a
    file): the failure is said naming the root, finish() returns by its timeout with the
    attempt recorded, reports the records left on the node's disk and the command that
    ships them; once the root is mended, that command ships every record once."""
    local = tmp_path / "node-local"
    run = tracklake.init(project="p", run_id="r", root=root, local_root=local,
                         capture_identity=False)
    (root / "metrics").write_text("")
    for step in range(50):
        run.log({"x": float(step)}, step=step)
    report = run.finish(timeout=2)
    err = capsys.readouterr().err
    assert f"cannot ship run 'r' rank 0 into {root}: " in err and "buffered" not in err, err
    assert not report.complete and report.last_error is not None
    command = report.last_error.split("`")[1]
    assert command == f"tracklake ship --root {root} --local {local}"
    assert _local_segments(local)
    (root / "metrics").unlink()
    done = subprocess.run([sys.executable, "-m", "tracklake._cli.main",
                           *command.split()[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _points(root) == Counter({(s, "x", float(s)): 1 for s in range(50)})
    _once(root)
    status = tracklake.query("SELECT status FROM runs", root=root).to_pylist()
    assert status == [{"status": "finished"}]


@pytest.mark.parametrize("file_clock", [-3 * 3600, 3 * 3600])
def test_a_claim_of_a_live_shipper_is_kept_whatever_the_clocks_and_taken_once_it_stops(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        file_clock: float) -> None:
    """A stream's `.shipping` claim held by a process this one cannot probe (another PID
    namespace: a container on the same node), its file time 3 hours off this host's
    clock: while its holder refreshes it, no shipper takes it, however long; once it
    stands still, it is taken after this host has watched it for the documented 10
    minutes, and the records are shipped once."""
    import json
    import types

    import tracklake._ops.claims as claims
    from tracklake._ops.claims import CLAIM_STALE_SECONDS

    local, segment = _left_locally(root, tmp_path)
    claim = segment.parent / ".shipping"
    claim.write_text(json.dumps({
        "pid": 999_999, "host": platform.node(), "pid_ns": os.stat("/proc/self/ns/pid").st_ino
        + 1, "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "start_ticks": 1}))
    real = time.time
    skew = 0.0

    def at(minutes: float, *, refresh: bool) -> ShipReport:
        nonlocal skew
        skew = minutes * 60
        if refresh:  # the holder sets the file's time, by its own clock
            os.utime(claim, (real() + file_clock + skew,) * 2)
        shipper = Shipper(local, root)
        try:
            return shipper.ship(leftovers=True)
        finally:
            shipper.close()

    monkeypatch.setattr(claims, "time", types.SimpleNamespace(
        time=lambda: real() + skew, monotonic=time.monotonic))
    held = StreamId("p", "r", 0, 1, "metrics")
    for minutes in (0, 9, 18, 27, 36):  # refreshed: kept, past any limit
        report = at(minutes, refresh=True)
        assert held in report.busy, minutes
    assert at(36 + CLAIM_STALE_SECONDS / 60 - 1, refresh=False).busy == [held]
    report = at(36 + CLAIM_STALE_SECONDS / 60 + 1, refresh=False)
    assert report.busy == [] and report.records == 100
    rows = tracklake.query("SELECT rank, step FROM metrics", root=root).to_pylist()
    assert Counter((r["rank"], r["step"]) for r in rows) == Counter(
        [(0, s) for s in range(100)] + [(1, s) for s in range(100)])
    _once(root)


def test_a_live_writer_refreshes_its_shipping_claims(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims a writer's shipper holds are refreshed while it ships (every
    REFRESH_SECONDS, here every round), so a shipper that cannot probe it sees them move."""
    import tracklake._ops.ship as ship

    monkeypatch.setattr(ship, "REFRESH_SECONDS", 0.0)
    monkeypatch.setenv("TRACKLAKE_SHIP_INTERVAL", "0.05")
    local = tmp_path / "node-local"
    with tracklake.init(project="p", run_id="r", root=root, local_root=local,
                        capture_identity=False, flush_interval=0.01) as run:
        claim = stream_dir(local_base(local, root), StreamId("p", "r", 0, 1, "metrics")
                           ) / ".shipping"
        first = claim.stat().st_mtime_ns
        deadline = time.monotonic() + 30
        step = 0
        while claim.stat().st_mtime_ns == first:
            assert time.monotonic() < deadline
            run.log({"x": float(step)}, step=step)
            step += 1
            time.sleep(0.01)


def test_tracklake_ship_run_three_times_at_once_ships_every_record_once(
        root: Path, tmp_path: Path) -> None:
    """Three `tracklake ship` against one node-local folder at the same time: each stream
    is shipped by one of them (the others say a live process ships it), every record
    once, nothing left behind."""
    local, _ = _left_locally(root, tmp_path, batches=60)
    shippers = [subprocess.Popen([sys.executable, "-m", "tracklake._cli.main", "ship",
                                  "--root", str(root), "--local", str(tmp_path / "node-local")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(3)]
    for shipper in shippers:
        _, err = shipper.communicate(timeout=120)
        assert shipper.returncode == 0 and not err, err
    rows = tracklake.query("SELECT rank, step FROM metrics", root=root).to_pylist()
    assert Counter((r["rank"], r["step"]) for r in rows) == Counter(
        (rank, s) for rank in (0, 1) for s in range(600))
    _once(root)
    assert _local_segments(local) == []


def test_the_command_that_ships_what_is_left_is_said_whatever_failed_before(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The root refuses the records, then the attempt's final record too (read-only): the
    report's last error is the latter, and the command that ships what is left is still
    said on stderr (a failure message is said once per run, and the first one was the
    root's)."""
    import errno

    from tracklake._write import finish

    local = tmp_path / "node-local"
    run = tracklake.init(project="p", run_id="r", root=root, local_root=local,
                         capture_identity=False)
    (root / "metrics").write_text("")

    def read_only(path: Path, record: object, **options: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(finish, "write_attempt", read_only)
    for step in range(10):
        run.log({"x": float(step)}, step=step)
    report = run.finish(timeout=2)
    assert not report.complete and "Read-only" in (report.last_error or "")
    assert f"`tracklake ship --root {root} --local {local}`" in capsys.readouterr().err
