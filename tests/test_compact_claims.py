"""Compaction killed at any point: its claim is recognised as stale at once, segments a
part already holds are removed by the next run, and every record is there exactly once."""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import tracklake
from tracklake._format.liveness import CLOCK_SKEW_SECONDS, UNWATCHED_LIMIT_SECONDS
from tracklake._ops.claims import CLAIM_STALE_SECONDS

#: Runs compaction over argv[1], SIGKILLing itself around its argv[2]-th file operation
#: (argv[3]: "before" or "after" it; argv[4]: which operations count, "all" or one name);
#: with argv[2] == 0 it prints how many there were.
CHILD = r"""
import os, pathlib, signal, sys
import tracklake

target, where, counted = int(sys.argv[2]), sys.argv[3], sys.argv[4]
calls = 0

def killing(fn):
    def wrapped(*args, **kwargs):
        global calls
        if counted not in ("all", fn.__name__):
            return fn(*args, **kwargs)
        calls += 1
        if calls == target and where == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = fn(*args, **kwargs)
        if calls == target and where == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return wrapped

os.replace = killing(os.replace)
os.fsync = killing(os.fsync)
os.link = killing(os.link)
pathlib.Path.unlink = killing(pathlib.Path.unlink)
report = tracklake.compact(root=sys.argv[1])
assert not report.skipped, report.skipped
print(calls)
"""


def _contents(root: Path) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in tracklake.query(
        "SELECT 'm' AS kind, run, seq, step, key, value::VARCHAR AS v FROM metrics_all "
        "UNION ALL SELECT 't', run, seq, step, key, text FROM texts_all ORDER BY ALL",
        root=root).to_pylist()]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished runs, each stream in several sealed segments."""
    root = tmp_path_factory.mktemp("claims") / "store"
    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                            segment_bytes=2048) as run:
            for step in range(120):
                run.log({"loss": step / 3, "acc": step / 7, "phase": f"s{step}"}, step=step)
                if step % 20 == 19:
                    run.flush()
    assert len(list(root.glob("metrics/project=p/run=a/**/*.arrows"))) >= 3
    return root


def _copy(template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(template, root)
    return root


def _kill_at(root: Path, target: int, where: str, counted: str = "all"
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(root), str(target), where,
                           counted], capture_output=True, text=True, timeout=120, check=False)


def _assert_recovers(root: Path, expected: object,
                     contents: Callable[[Path], object] = _contents) -> None:
    """The next compaction is not held off, leaves nothing behind, and loses nothing."""
    assert contents(root) == expected  # readers see every record once, even before
    report = tracklake.compact(root=root)
    assert report.skipped == []
    assert not list(root.rglob("*.arrows")), "a consumed or sealed segment was left"
    assert not list(root.rglob(".compacting*"))
    assert contents(root) == expected
    # a compacted part being written when the kill came is removed by the next holder of
    # the claim; another part's is left for a while (unpack writes parts without a
    # claim, perhaps from another host), then removed
    assert not list(root.rglob(".part-new.parquet.*.tmp"))
    leftovers = list(root.rglob(".part-*.tmp"))
    for tmp in leftovers:
        os.utime(tmp, (0, 0))
    tracklake.compact(root=root)
    assert not [tmp for tmp in leftovers if tmp.exists()]
    assert tracklake.compact(root=root).segments_removed == []


def test_a_kill_between_the_part_rename_and_the_unlinks_leaves_nothing_forever(
        template: Path, tmp_path: Path) -> None:
    root = _copy(template, tmp_path)
    expected = _contents(root)
    child = _kill_at(root, 1, "after", "replace")  # right after the first part's rename
    assert child.returncode == -signal.SIGKILL, child.stderr
    claim = next(root.rglob(".compacting"))
    assert json.loads(claim.read_text())["host"] == platform.node()
    assert list(root.rglob("part-*.parquet")) and list(root.rglob("*.arrows"))
    _assert_recovers(root, expected)


@pytest.mark.slow
def test_sigkill_at_random_points_of_compaction_never_blocks_or_loses(
        template: Path, tmp_path: Path) -> None:
    total = int(_kill_at(_copy(template, tmp_path / "count"), 0, "none").stdout)
    expected = _contents(_copy(template, tmp_path / "expected"))
    rng = random.Random(14)
    for i in range(12):
        root = _copy(template, tmp_path / f"trial{i}")
        target, where = rng.randint(1, total), rng.choice(["before", "after"])
        child = _kill_at(root, target, where)
        assert child.returncode == -signal.SIGKILL, (target, where, child.stderr)
        _assert_recovers(root, expected)


#: Compacts argv[1], saying "go" once imported (a kill timed from then hits compaction).
TIMED_CHILD = r"""
import sys, tracklake
print("go", flush=True)
tracklake.compact(root=sys.argv[1])
"""


def _wide_contents(root: Path) -> list[object]:
    table = tracklake.query("SELECT seq, step, key, value FROM metrics_all ORDER BY ALL",
                            root=root)
    digest = tracklake.query(
        "SELECT count(*) AS n, count(DISTINCT seq) AS seqs, sum(hash(seq, step, key, value)"
        "::HUGEINT) AS h FROM metrics_all", root=root).to_pylist()
    return [table.num_rows, digest]


def _timed_compaction(root: Path, delay: float | None) -> tuple[int, float]:
    """Compaction of `root` in a child killed `delay` seconds after it is ready (None:
    left to finish); its return code and how long it ran from then."""
    with subprocess.Popen([sys.executable, "-c", TIMED_CHILD, str(root)],
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdout.readline() == "go\n"
        started = time.monotonic()
        if delay is not None:
            time.sleep(delay)
            child.kill()
        code = child.wait(120)
        return code, time.monotonic() - started


def test_sigkill_while_a_part_of_many_row_groups_is_written_loses_nothing(
        tmp_path: Path) -> None:
    """A run of 2,000 keys: its part is cut into row groups at key changes; killed at
    random moments of writing it, the next compaction finishes and every value is there
    once."""
    template = tmp_path / "template"
    keys = [f"layer{k // 100}/k{k}" for k in range(2_000)]
    with tracklake.init(project="p", run_id="wide", root=template, capture_identity=False,
                        compact=False, system_metrics=False, segment_bytes=1 << 18) as run:
        for step in range(100):
            run.log({key: step + k / 7 for k, key in enumerate(keys)}, step=step)
            if step % 20 == 19:
                run.flush()
    assert len(list(template.rglob("*.arrows"))) >= 2
    expected = _wide_contents(template)
    assert expected[0] == 200_000
    code, duration = _timed_compaction(_copy(template, tmp_path / "timed"), None)
    assert code == 0
    (part,) = (tmp_path / "timed").rglob("part-*.parquet")
    assert pq.ParquetFile(part).metadata.num_row_groups >= 5
    rng = random.Random(26)
    killed = 0
    for i in range(6):
        root = _copy(template, tmp_path / f"trial{i}")
        code, _ = _timed_compaction(root, rng.uniform(0, duration))
        killed += code == -signal.SIGKILL
        _assert_recovers(root, expected, _wide_contents)
    assert killed >= 3  # most trials were killed mid-way, not after it ended


def test_the_next_compaction_removes_a_part_a_stopped_compaction_was_writing(
        template: Path, tmp_path: Path) -> None:
    """A compactor stopped (SIGKILL, or SIGTERM at the wrong moment) while it wrote a part
    leaves it aside as `.part-new.parquet.RANDOM.PID.tmp`. Only the holder of the stream's
    claim writes one, so the next holder removes it however recent; a part of another
    name written aside (unpack's, made without a claim) stays while it is recent."""
    root = _copy(template, tmp_path)
    directory = next(root.glob("metrics/project=p/run=a/rank=0/attempt=*"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    compacted = directory / f".part-new.parquet.a014f7523635.{pid}.tmp"
    unpacked = directory / (f".part-{0:020d}-{9:020d}-{1:06d}.parquet.0123456789ab."
                            f"{pid}.tmp")
    for left in (compacted, unpacked):
        left.write_bytes(b"PAR1 stopped half-way")
    expected = _contents(root)
    report = tracklake.compact(root=root)
    assert report.skipped == [] and report.segments_removed
    assert not compacted.exists()
    assert unpacked.exists()
    assert _contents(root) == expected


def _claim_dir(template: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = _copy(template, tmp_path)
    directory = next(root.glob("metrics/project=p/run=a/rank=0/attempt=*"))
    return root, directory / ".compacting"


def test_a_claim_of_a_live_process_holds_the_stream_off(template: Path,
                                                         tmp_path: Path) -> None:
    root, claim = _claim_dir(template, tmp_path)
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                          stdin=subprocess.PIPE) as holder:
        ticks = Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        claim.write_text(json.dumps({
            "pid": holder.pid, "host": platform.node(),
            "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
            "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
            "start_ticks": int(ticks), "claimed_at": "2026-01-01T00:00:00+00:00"}))
        os.utime(claim, (0, 0))  # however old: its process lives
        report = tracklake.compact(root=root)
        assert [d for d, _ in report.skipped] == [claim.parent]
        assert "live process" in report.skipped[0][1]
        assert claim.exists()
        assert holder.stdin is not None
        holder.stdin.close()
    # the holder is gone (and reaped): the claim is stale at once
    report = tracklake.compact(root=root)
    assert report.skipped == [] and not claim.exists()


_BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
_PID_NS = os.stat("/proc/self/ns/pid").st_ino


@pytest.mark.parametrize(("record", "age", "stale"), [
    ({"pid": 1, "host": "another-node", "boot_id": None, "start_ticks": None}, 5, False),
    # another host's clock may differ by hours: its file time alone tells only past a day
    # (else this host watches it stand still: the test below)
    ({"pid": 1, "host": "another-node", "boot_id": None, "start_ticks": None},
     CLAIM_STALE_SECONDS + 5, False),
    ({"pid": 1, "host": "another-node", "boot_id": None, "start_ticks": None},
     CLAIM_STALE_SECONDS + CLOCK_SKEW_SECONDS + 5, False),
    ({"pid": 1, "host": "another-node", "boot_id": None, "start_ticks": None},
     UNWATCHED_LIMIT_SECONDS + 5, True),
    ({"pid": 1, "host": platform.node(), "boot_id": "a-boot-before-the-last-reboot",
      "start_ticks": 1}, 5, True),
    ({"pid": os.getpid(), "host": platform.node(), "boot_id": _BOOT, "pid_ns": _PID_NS,
      "start_ticks": 1}, 5, True),  # this pid, but started at another time: reused
    # the same host and boot, but another PID namespace (a container with this hostname):
    # its pid means another process here, so only the claim's age tells
    ({"pid": 999_999, "host": platform.node(), "boot_id": _BOOT, "pid_ns": _PID_NS + 1,
      "start_ticks": 1}, 5, False),
    ({"pid": 999_999, "host": platform.node(), "boot_id": _BOOT, "pid_ns": _PID_NS + 1,
      "start_ticks": 1}, UNWATCHED_LIMIT_SECONDS + 5, True),
    # a record without its PID namespace (an older version's): not probed either
    ({"pid": 999_999, "host": platform.node(), "boot_id": _BOOT, "start_ticks": 1}, 5,
     False),
    (None, 5, False),  # unreadable (being written by an older version): only its age tells
    (None, CLAIM_STALE_SECONDS + CLOCK_SKEW_SECONDS + 5, False),
    (None, UNWATCHED_LIMIT_SECONDS + 5, True),
])
def test_stale_claims_are_told_by_host_boot_pid_start_time_or_age(
        template: Path, tmp_path: Path, record: dict[str, object] | None, age: float,
        stale: bool) -> None:
    root, claim = _claim_dir(template, tmp_path)
    claim.write_text("" if record is None else json.dumps(record))
    then = time.time() - age
    os.utime(claim, (then, then))
    report = tracklake.compact(root=root)
    assert (report.skipped == []) is stale
    assert claim.exists() is not stale


def test_a_claim_from_another_host_is_stale_once_watched_still_whatever_its_time(
        template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim from another host whose file time is far ahead (its clock, or the file
    server's): not broken while this host sees it refreshed, broken once this host has
    watched it stand still for the limit by its own clock."""
    import tracklake._ops.claims as claims
    root, claim = _claim_dir(template, tmp_path)
    claim.write_text(json.dumps({"pid": 1, "host": "another-node", "boot_id": None,
                                 "start_ticks": None}))
    ahead = time.time() + 3600
    os.utime(claim, (ahead, ahead))
    assert tracklake.compact(root=root).skipped  # first seen
    real = time.time
    monkeypatch.setattr(claims, "time", types.SimpleNamespace(
        time=lambda: real() + CLAIM_STALE_SECONDS - 60, monotonic=time.monotonic))
    os.utime(claim, (ahead + 30, ahead + 30))  # its holder refreshed it
    assert tracklake.compact(root=root).skipped and claim.exists()
    monkeypatch.setattr(claims, "time", types.SimpleNamespace(
        time=lambda: real() + 2 * CLAIM_STALE_SECONDS, monotonic=time.monotonic))
    assert tracklake.compact(root=root).skipped == [] and not claim.exists()


def test_a_refreshed_claim_from_a_host_whose_clock_is_hours_behind_is_never_broken(
        template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim from another host that its holder refreshes, its file time 3 hours behind
    this host's clock (that host's clock, or its file server's): kept however long this
    host watches it, and broken once it stands still for the limit."""
    import tracklake._ops.claims as claims
    root, claim = _claim_dir(template, tmp_path)
    claim.write_text(json.dumps({"pid": 1, "host": "another-node", "boot_id": None,
                                 "start_ticks": None}))
    real = time.time
    for minutes in (0, 9, 18, 27):
        monkeypatch.setattr(claims, "time", types.SimpleNamespace(
            time=lambda m=minutes: real() + m * 60, monotonic=time.monotonic))
        behind = real() + minutes * 60 - 3 * 3600
        os.utime(claim, (behind, behind))  # its holder refreshed it, by its clock
        assert tracklake.compact(root=root).skipped and claim.exists(), minutes
    monkeypatch.setattr(claims, "time", types.SimpleNamespace(
        time=lambda: real() + 27 * 60 + CLAIM_STALE_SECONDS + 5, monotonic=time.monotonic))
    assert tracklake.compact(root=root).skipped == [] and not claim.exists()



@pytest.mark.parametrize("claim", [".shipping", ".retaining"])
def test_a_claim_temporary_a_killed_shipper_or_applier_left_is_removed_by_the_next(
        tmp_path: Path, claim: str) -> None:
    """A shipper or retention applier killed while writing its claim aside leaves
    `.CLAIM.HOST.RANDOM.PID.tmp`; the next one to hold that claim removes it."""
    from click.testing import CliRunner

    from tracklake._cli.main import main
    from tracklake._format.layout import local_base
    from tracklake._ops.ship import Shipper

    root, local = tmp_path / "root", tmp_path / "node"
    if claim == ".shipping":  # a writer killed in ship mode leaves its records to ship
        env = {**os.environ, "TRACKLAKE_LOCAL_ROOT": str(local),
               "TRACKLAKE_SHIP_INTERVAL": "3600"}
        subprocess.run([sys.executable, "-c", KILLED_SHIP_WRITER, str(root)], env=env,
                       check=False, timeout=120)
        base = local_base(local.absolute(), root.absolute())
        [directory] = {p.parent for p in base.rglob("_seg-*.arrows")}
    else:
        with tracklake.init(project="p", run_id="r", root=root, compact=False) as r:
            r.log({"loss": 1.0}, step=0)
        directory = root / "trash"
        directory.mkdir()
    left = directory / f"{claim}.{platform.node()}.0123456789ab.{2 ** 22 + 7}.tmp"
    left.write_text("killed while writing its claim")
    os.utime(left, (1, 1))
    if claim == ".shipping":
        shipper = Shipper(base, root)
        shipper.ship(leftovers=True)
        shipper.close()
        assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root
                               ).to_pylist() == [{"n": 1}]
    else:
        done = CliRunner().invoke(main, ["retain", "--root", str(root), "--keep-last", "0",
                                         "--apply"])
        assert done.exit_code == 0, done.output
    assert not left.exists()


KILLED_SHIP_WRITER = """
import os, sys, tracklake
r = tracklake.init(project="p", run_id="r", root=sys.argv[1], compact=False)
r.log({"loss": 1.0}, step=0)
r.flush()
os._exit(9)
"""
