"""One store on a network file system shared by several hosts (the test bed of
`_nodes.py`: sshfs mounts of one SFTP export with attribute, entry and directory caches,
each node with its own host name, boot id and clock): ranks on two nodes write one run
while a third counts, compacts, exports and applies retention; clocks 5 minutes apart;
claims of another host; a node whose mount hangs. docs/many-nodes.md says what a store
needs from its file system and how to run these checks on another one."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from _node_jobs import KEYS, value
from _nodes import FileServer, Node, missing

import tracklake
from tracklake._ops.backup.restore import restore
from tracklake._read.decoded import RACY_SECONDS

pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())),
              pytest.mark.xdist_group("many-nodes")]

T = TypeVar("T")
CACHE = 2.0  # seconds each mount caches attributes, entries and listings
STEPS = 150


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FileServer]:
    served = FileServer(tmp_path / "bed")
    try:
        yield served
    finally:
        served.close()


def _job(call: str) -> str:
    return f"import _node_jobs as j; j.{call}"


def _lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _quiet() -> None:
    """Long enough for every mount's caches to have expired."""
    time.sleep(2 * CACHE + 1)


def test_ranks_on_two_nodes_while_a_third_compacts_exports_and_retains(
        server: FileServer, tmp_path: Path) -> None:
    """Rank 0 on node A (clock 5 min behind) and rank 1 on node B write one run; node C
    (clock 5 min ahead, so A's heartbeats look 10 min old) meanwhile counts, compacts,
    exports every rank to TensorBoard, backs up and applies a retention deleting every
    run ended over 5 minutes ago, and follows the run with a second export (`--follow`,
    polling). While it runs, C never counts a row twice (counts only grow, never past
    what was written), never shows the run crashed and never deletes it (an ended run of
    A's it does delete); once quiet, every node reads every value exactly, TensorBoard's
    reader finds each value once in both exports (the follower ending by itself once the
    run has finished), and the backup restores every value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    a = Node("node-a", server.mount("a", cache_seconds=CACHE), clock=-300)
    b = Node("node-b", server.mount("b", cache_seconds=CACHE))
    c = Node("node-c", server.mount("c", cache_seconds=CACHE), clock=300)
    a.run("import tracklake\nwith tracklake.init(project='p', run_id='old', "
          "capture_identity=False) as r: r.log({'x': 1.0}, step=0)")
    _quiet()
    stop, no_retention, export_dir = tmp_path / "stop", tmp_path / "no-retention", \
        tmp_path / "tb"
    backup_dir, followed = tmp_path / "backup", tmp_path / "tb-follow"
    watcher = c.popen(_job(f"watch('shared', {str(stop)!r}, 0.5, {str(no_retention)!r})"),
                      env_extra={"EXPORT_DIR": str(export_dir), "BACKUP_DIR": str(backup_dir)})
    follower = c.popen(_job(f"follow('shared', {str(followed)!r}, "
                            f"{str(tmp_path / 'follow-state')!r})"))
    writers = [node.popen(_job(f"write_rank('shared', {rank}, {STEPS}, 0.03, "
                               "hold_finish=True)"), stdin=subprocess.PIPE)
               for rank, node in ((0, a), (1, b))]
    for writer in writers:  # every step written, the run not finished yet
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
    # three passes of the watcher while the run is live, however long a pass takes on a
    # busy machine (a fixed 2 s wait saw two there)
    assert watcher.stdout is not None
    early = [watcher.stdout.readline() for _ in range(3)]
    no_retention.touch()  # a finished run would rightly go at the next pass
    time.sleep(2)
    for writer in writers:
        out, err = writer.communicate("\n", timeout=300)
        assert writer.returncode == 0, err
    _quiet()
    stop.touch()
    out, err = watcher.communicate(timeout=300)
    assert watcher.returncode == 0, err
    _, err = follower.communicate(timeout=120)  # it ends once the run has finished
    assert follower.returncode == 0, err
    passes = _lines("".join(early) + out)
    live = [p for p in passes if p["retained"] is not None]
    assert len(live) >= 3, "the watcher should have looked while the ranks wrote"
    written = len(KEYS) * STEPS
    for rank in ("0", "1"):
        seen = [int(p["counts"].get(rank, 0)) for p in passes]  # type: ignore[union-attr]
        assert seen == sorted(seen) and seen[-1] == written, (rank, seen)
        assert all(p["status"].get(rank) in (None, "running")  # type: ignore[union-attr]
                   for p in live), live
    assert any(0 < int(p["counts"].get("0", 0)) < written for p in passes), (  # type: ignore
        "no pass saw the run half written")
    deleted = [run for p in live for run in p["retained"]]  # type: ignore[union-attr]
    assert deleted == ["old"]
    for node in (a, b, c):
        final = _lines(node.run(_job("counts('shared')")))[0]
        assert final == {"counts": {"0": written, "1": written}, "wrong": 0,
                         "status": {"0": "finished", "1": "finished"}}, node.name
    want = Counter((f"rank{r}/{k}", s, round(value(r, s, k), 3))
                   for r in (0, 1) for s in range(STEPS) for k in KEYS)
    for logdir in (export_dir, followed):
        [events] = {p.parent for p in logdir.rglob("events.out.tfevents.*")}
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        got = Counter((tag, e.step, round(e.value, 3)) for tag in acc.Tags()["scalars"]
                      if tag.startswith("rank") for e in acc.Scalars(tag))
        assert got == want, logdir
    restored = tmp_path / "restored"
    restore(str(backup_dir), restored)
    assert tracklake.query("SELECT count(*) AS n FROM metrics WHERE run = 'shared'",
                           root=restored).column("n")[0].as_py() == 2 * written


def test_a_claim_of_a_live_host_is_kept_whatever_the_clocks_and_taken_once_it_stops(
        server: FileServer) -> None:
    """Node A holds a stream's compaction claim and refreshes it every second, its clock
    5 minutes behind; node C, 5 minutes ahead and with claims stale after 6 s, finds
    the stream busy at every pass while A lives, and takes it over once A is gone."""
    a = Node("node-a", server.mount("a", cache_seconds=CACHE), clock=-300)
    c = Node("node-c", server.mount("c", cache_seconds=CACHE), clock=300)
    a.run("import tracklake\nwith tracklake.init(project='p', run_id='r', "
          "capture_identity=False, compact=False) as r:\n"
          "    [r.log({'x': float(i)}, step=i) for i in range(10)]")
    stream = "metrics/project=p/run=r/rank=0/attempt=1"
    holder = a.popen(_job(f"hold_claim({stream!r}, 1.0)"), stdin=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    try:
        alive = _lines(c.run(_job(f"compact_until_taken({stream!r}, 6.0, 6, 2.0)")))
        assert [p["busy"] for p in alive] == [True] * 6, alive  # twice the limit
    finally:
        holder.kill()
        holder.communicate(timeout=60)
    gone = _lines(c.run(_job(f"compact_until_taken({stream!r}, 6.0, 10, 2.0)")))
    assert gone[0]["busy"] and not gone[-1]["busy"]
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=server.export / "store"
                           ).column("n")[0].as_py() == 10
    assert list((server.export / "store" / stream).glob("*.parquet"))  # compacted by C


def _hang_while_it_logs(node: Node, writer: subprocess.Popen[str],
                        meanwhile: Callable[[], T]) -> tuple[float, T]:
    """Hang `node`'s mount for 8 s once `writer` (a `write_rank` that said "hang") goes on
    logging, calling `meanwhile()` during the hang; once the mount is back and the
    writer has ended (successfully), its longest `log()` call and what `meanwhile` gave."""
    assert writer.stdin is not None
    node.mount.hang()
    try:
        writer.stdin.write("\n")
        writer.stdin.flush()
        during = meanwhile()
        time.sleep(8)
    finally:
        node.mount.resume()
    out, err = writer.communicate(timeout=300)
    assert writer.returncode == 0, err
    longest = _lines(out)[-1]["longest_log"]
    assert isinstance(longest, float), longest
    return longest, during


def test_a_hung_mount_never_blocks_log_and_other_nodes_read_on(server: FileServer) -> None:
    """Node A's mount hangs for 8 s while its rank logs (its sshfs stopped): no `log()`
    call waits for it, node C reads the store meanwhile, and once the mount is back
    every value of A is there."""
    a = Node("node-a", server.mount("a", cache_seconds=CACHE))
    c = Node("node-c", server.mount("c", cache_seconds=CACHE))
    writer = a.popen(_job("write_rank('hung', 0, 120, 0.02, hang_at=40)"),
                     stdin=subprocess.PIPE)
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().strip() == "hang"
    longest, during = _hang_while_it_logs(
        a, writer, lambda: _lines(c.run(_job("counts('hung')"), timeout=60))[0])
    assert longest < 2.0, longest  # the hang lasted 8 s
    assert during["status"] == {"0": "running"}
    _quiet()
    final = _lines(c.run(_job("counts('hung')")))[0]
    assert final == {"counts": {"0": 120 * len(KEYS)}, "wrong": 0,
                     "status": {"0": "finished"}}


def test_in_ship_mode_a_hung_mount_holds_up_neither_log_nor_the_records(
        server: FileServer, tmp_path: Path) -> None:
    """Node A writes in ship mode (segments on its own disk, the root on its mount) and
    its mount hangs for 8 s while it logs: no `log()` call waits, node C reads the live
    run meanwhile, and once the mount is back every value arrives, once, and nothing is
    left on A's disk."""
    a = Node("node-a", server.mount("a", cache_seconds=CACHE))
    c = Node("node-c", server.mount("c", cache_seconds=CACHE))
    disk = tmp_path / "node-a-disk"
    writer = a.popen(_job("write_rank('shipped', 0, 120, 0.02, hang_at=40)"),
                     stdin=subprocess.PIPE, env_extra={"TRACKLAKE_LOCAL_ROOT": str(disk),
                                                       "TRACKLAKE_SHIP_INTERVAL": "0.3"})
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().strip() == "hang"
    time.sleep(2 * CACHE)  # shipped, and past C's caches
    shipped = _lines(c.run(_job("counts('shipped')"), timeout=60))[0]
    longest, _ = _hang_while_it_logs(a, writer, lambda: None)
    assert longest < 2.0, longest
    assert shipped["status"] == {"0": "running"} and shipped["counts"]["0"] >= 30 * len(KEYS)
    _quiet()
    final = _lines(c.run(_job("counts('shipped')")))[0]
    assert final == {"counts": {"0": 120 * len(KEYS)}, "wrong": 0,
                     "status": {"0": "finished"}}
    assert not list(disk.rglob("*.arrows"))


def test_a_reader_never_serves_a_bundled_runs_old_data_once_the_caches_expire(
        server: FileServer) -> None:
    """Node A writes 32 small runs; node C compacts them into a bundle and reads run r0
    from it; A then resumes r0 on its node (a second attempt, other values at the same
    steps). Once the mounts' caches have expired, C answers with the new attempt's values:
    neither the run catalog nor the bundle serves what a changed run held."""
    a = Node("node-a", server.mount("a", cache_seconds=CACHE), clock=-300)
    c = Node("node-c", server.mount("c", cache_seconds=CACHE), clock=300)
    a.run(_job("small_runs(32, 5, 0.0)"))
    _quiet()
    c.run(_job("bundled_answers()"))  # compacts: parts just written, not bundled yet
    # the parts settled by the file server's clock (C's own is 5 minutes ahead, by
    # which they looked settled at once)
    time.sleep(RACY_SECONDS + 2 * CACHE + 1)
    first = _lines(c.run(_job("bundled_answers()")))[0]
    assert first == {"bundles": 1, "r0": [[s, float(s)] for s in range(5)]}
    a.run(_job("small_runs(1, 5, 100.0)"))
    _quiet()
    again = _lines(c.run(_job("bundled_answers()")))[0]
    assert again["r0"] == [[s, s + 100.0] for s in range(5)]


def _cli(*args: str) -> str:
    """Code that runs the `tracklake` command line with `args` on a node."""
    return ("import sys\nfrom tracklake._cli.main import run\n"
            f"sys.argv = {['tracklake', *args]!r}\nrun()")


BOUND = "1.5"  # seconds a read may go without an answer, in the tests of a hung mount


def test_on_a_node_whose_mount_hangs_reads_and_fsck_end_naming_what_they_could_not_read(
        server: FileServer) -> None:
    """Node C's mount hangs (its sshfs stopped) under a store holding a run: there,
    `tracklake sql`, `tracklake runs` and `tracklake fsck` (reads bounded at 1.5 s) each
    end within seconds, non-zero, with an error naming a path of the store and the
    bound, instead of waiting for the mount. The processes end although a thread of
    each is still blocked on the mount."""
    c = Node("node-c", server.mount("c", cache_seconds=CACHE))
    c.run(_job("small_runs(2, 5, 0.0)"))
    _quiet()
    c.mount.hang()
    commands = {"sql": ("sql", "SELECT count(*) FROM metrics"), "runs": ("runs",),
                "fsck": ("fsck",)}
    try:
        started = time.monotonic()
        processes = {name: c.popen(_cli(*args), env_extra={"TRACKLAKE_READ_TIMEOUT": BOUND})
                     for name, args in commands.items()}
        ended = {}
        for name, process in processes.items():
            try:
                out, err = process.communicate(timeout=max(1.0, started + 30 - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                raise AssertionError(f"{name} still waits for the hung mount\n{err}") from None
            ended[name] = (process.returncode, out + err, time.monotonic() - started)
    finally:
        c.mount.resume()
    for name, (code, output, seconds) in ended.items():
        assert code != 0, (name, output)
        assert f"no answer within {BOUND} s" in output, (name, output)
        assert str(c.root) in output and "Traceback" not in output, (name, output)
        assert seconds < 20, (name, seconds)


def test_a_follower_on_a_node_whose_mount_hangs_reports_the_stall_and_carries_on(
        server: FileServer, tmp_path: Path) -> None:
    """Node C follows a run node A writes (`tracklake export tensorboard --follow`,
    reads bounded at 1.5 s); C's mount hangs for 8 s meanwhile: the follower says on
    stderr which path of the store gave no answer, keeps trying, and once the mount is
    back exports every value once and ends with the run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    a = Node("node-a", server.mount("a", cache_seconds=CACHE))
    c = Node("node-c", server.mount("c", cache_seconds=CACHE))
    writer = a.popen(_job("write_rank('hung', 0, 60, 0.02, hold_finish=True)"),
                     stdin=subprocess.PIPE)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "written"
    logdir = tmp_path / "tb"
    follower = c.popen(_job(f"follow('hung', {str(logdir)!r}, "
                            f"{str(tmp_path / 'state')!r})"),
                       env_extra={"TRACKLAKE_READ_TIMEOUT": BOUND})
    deadline = time.monotonic() + 60
    while not list(logdir.rglob("events.out.tfevents.*")):  # it has read the run once
        assert time.monotonic() < deadline and follower.poll() is None, follower.stderr
        time.sleep(0.2)
    c.mount.hang()
    try:
        time.sleep(8)
    finally:
        c.mount.resume()
    writer.communicate("\n", timeout=120)
    assert writer.returncode == 0
    _, err = follower.communicate(timeout=120)  # it ends once the run has finished
    assert follower.returncode == 0, err
    assert f"no answer within {BOUND} s" in err and str(c.root) in err, err
    [events] = {p.parent for p in logdir.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    got = Counter((tag, e.step) for tag in acc.Tags()["scalars"] if tag.startswith("rank0/")
                  for e in acc.Scalars(tag))
    assert got == Counter((f"rank0/{k}", s) for k in KEYS for s in range(60))


def test_in_ship_mode_sigterm_while_the_mount_hangs_ends_in_time_and_keeps_the_records(
        server: FileServer, tmp_path: Path) -> None:
    """Node A writes in ship mode, ships a round (its segment in the root stays
    unsealed), and its mount hangs while it logs on; SIGTERM comes (its finish bounded
    at 3 s, as SIGTERM_FINISH_SECONDS bounds it): the process ends in time, its last
    shipping round stuck in the mount (a process holding a file of a hung FUSE mount
    open could not end: closing it waits for the mount), and the node's disk keeps every
    row it flushed, which `tracklake ship` there moves into the root once the mount is
    back, each once."""
    import signal

    a = Node("node-a", server.mount("a", cache_seconds=CACHE))
    disk = tmp_path / "node-a-disk"
    writer = a.popen(_job("log_until_signal('termed', 60)"), stdin=subprocess.PIPE,
                     env_extra={"TRACKLAKE_LOCAL_ROOT": str(disk),
                                "TRACKLAKE_SHIP_INTERVAL": "3600", "SIGTERM_FINISH": "3"})
    assert writer.stdout is not None and writer.stdin is not None
    while (line := writer.stdout.readline().strip()) != "hang":
        assert line.startswith("flushed"), line
    a.mount.hang()
    try:
        writer.stdin.write("\n")
        writer.stdin.flush()
        flushed = 0
        while flushed < 300:  # written to A's disk while every shipping round waits
            flushed = int(writer.stdout.readline().split()[1])
        writer.send_signal(signal.SIGTERM)
        termed = time.monotonic()
        out, err = writer.communicate(timeout=60)
        took = time.monotonic() - termed
    finally:
        a.mount.resume()
    assert writer.returncode == -signal.SIGTERM, err
    assert took < 3 + 5, (took, err)
    flushed = max([flushed] + [int(line.split()[1]) for line in out.splitlines()])
    a.run(_job(f"ship({str(disk)!r})"), timeout=120)
    rows = tracklake.query("SELECT step, key, value FROM metrics WHERE run = 'termed'",
                           root=server.export / "store").to_pylist()
    held = Counter((r["step"], r["key"]) for r in rows)
    assert max(held.values()) == 1
    assert {s for s, _ in held} >= set(range(flushed + 1)), (flushed, len(held))
    assert all(r["value"] == value(0, r["step"], r["key"]) for r in rows)
    assert not list(disk.rglob("*.arrows"))
