#!/usr/bin/env python
"""Lifecycle benchmark: retention on a many-run store, fsck throughput, and backup
throughput against ``cp -r`` and ``rsync -a`` of the same files.

A store of ``--runs`` runs (default 1,000) is built through tracklake's real write path:
per run ``tracklake.init`` (fsync off, no identity capture), ``--steps`` ``run.log``
calls of 8 float64 values, a text and a trace span per 100 steps, ``run.finish``, then
``tracklake.compact``; half of the runs are made to have ended 60 days ago by rewriting
their attempt files' times. Then, each timed once:

1. ``make_plan`` of a policy with every rule (keep_last 400 per project over 4 projects,
   max_age 90 d, best 3 by max ``reward``, drop_after 30 d, downsample_after 30 d), and
   ``apply_plan`` of it (on a copy of the store);
2. ``fsck`` of the store (MB/s over the bytes it checked);
3. ``backup`` to an empty directory (MB/s) against ``cp -r`` and ``rsync -a`` (when
   installed) of the same store, each into a fresh directory on the same file system,
   then ``sync`` (so the copies are durable as the backup's are: the backup syncs its
   destination before its manifest names a file); and a second, incremental ``backup``
   of the unchanged store (which reads no file's data, only lists and stats).

``--blob-mb N`` adds N MB of artifacts (10 MB blobs, one run each, random bytes) to make
a store of big files as well as many small ones: ``--blob-mb 1000`` gives the 1 GB-class
store of the incremental figure. ``--skip-retention`` leaves step 1 out.

Usage (from the repository root)::

    python benchmarks/lifecycle.py                  # 1,000 runs
    python benchmarks/lifecycle.py --runs 100 --steps 200    # a quick look
    python benchmarks/lifecycle.py --skip-retention --blob-mb 1000    # backup, 1 GB class
    python benchmarks/lifecycle.py --skip-retention --store /tmp/s   # build once, reuse
    python benchmarks/lifecycle.py --skip-retention --blob-mb 1000 --repeat 5  # medians
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import tracklake
from tracklake._format.attempt import read_attempt, write_attempt
from tracklake._ops.backup import backup
from tracklake._ops.fsck import fsck
from tracklake._ops.retention import BestRule, Policy, apply_plan, make_plan


def build(root: Path, runs: int, steps: int) -> None:
    for i in range(runs):
        run = tracklake.init(project=f"p{i % 4}", run_id=f"r{i:05d}", root=root,
                             capture_identity=False, fsync=False)
        for step in range(steps):
            run.log({f"k{j}": (i + step + j) / 1000 for j in range(7)} | {
                "reward": (i * 7919 % 1000) / 1000 + step / steps}, step=step)
            if step % 100 == 0:
                run.log_text("note", f"step {step}", step=step)
                with run.span("rollout", step=step):
                    pass
        run.finish()
        if i % 2:
            for path in (root / "runs" / f"project=p{i % 4}" / f"run=r{i:05d}").rglob(
                    "*.json"):
                record = read_attempt(path)
                assert record is not None
                for key in ("started_at", "heartbeat_at", "finished_at"):
                    t = _dt.datetime.fromisoformat(record[key]) - _dt.timedelta(days=60)
                    record[key] = t.isoformat()
                record.pop("format")
                write_attempt(path, record)
    tracklake.compact(root=root)


def add_blobs(root: Path, megabytes: int) -> None:
    """Artifacts of `megabytes` MB in all, 10 MB each, each logged by a run of its own."""
    for i in range(-(-megabytes // 10)):
        with tracklake.init(project="blobs", run_id=f"b{i:04d}", root=root,
                            capture_identity=False, fsync=False) as run:
            run.log_artifact(os.urandom(10 << 20), name="weights.bin")


def du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads) and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(label: str, fn: object) -> float:
    """Wall time of `fn()`, printed with the CPU time it used: on a shared machine the
    CPU seconds move less than the wall time does."""
    cpu, start = cpu_seconds(), time.perf_counter()
    fn()  # type: ignore[operator]
    took = time.perf_counter() - start
    print(f"{label:<44} {took:8.2f} s  (cpu {cpu_seconds() - cpu:6.2f} s)")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--blob-mb", type=int, default=0)
    parser.add_argument("--skip-retention", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="Rounds of the backup, cp "
                        "and rsync copies, taking turns; medians are compared.")
    parser.add_argument("--store", type=Path, help="Build the store here once and reuse it "
                        "in later runs with the same flags (only its record of backups changes).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = args.store or base / "store"
        if not (root / "runs").is_dir():
            timed(f"build {args.runs} runs x {args.steps} steps", lambda: build(
                root, args.runs, args.steps))
            if args.blob_mb:
                timed(f"add {args.blob_mb} MB of artifacts", lambda: add_blobs(
                    root, args.blob_mb))
        size = du(root)
        print(f"store: {size / 1e6:.1f} MB in {sum(1 for _ in root.rglob('*'))} paths")

        if not args.skip_retention and args.runs:
            retention(root, base, args.runs)
        backups(root, base, size, args.repeat)


def retention(root: Path, base: Path, runs: int) -> None:
    policy = Policy(keep_last=400, max_age=90 * 86400.0, best=BestRule("reward", "max", 3),
                    drop_after=30 * 86400.0, downsample_after=30 * 86400.0)
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    plans = []
    timed("retention plan (every rule)", lambda: plans.append(make_plan(root, policy, now)))
    print(f"  {len(plans[0].actions)} actions, {len(plans[0].kept)} kept")
    work = base / "retain"
    shutil.copytree(root, work)
    timed("retention apply (on a copy)", lambda: apply_plan(
        work, make_plan(work, policy, now), now))

    reports = []
    took = timed("fsck", lambda: reports.append(fsck(root)))
    print(f"  {reports[0].bytes / 1e6 / took:.1f} MB/s, clean: {reports[0].clean}")


def backups(root: Path, base: Path, size: int, repeat: int) -> None:
    """Each copy into a fresh directory, then a timed sync(2): `cp` and `rsync` leave
    their copies in the page cache, while a backup makes its copies durable before its
    manifest names them; both figures are printed. With `repeat` > 1 the three copies
    take turns, `repeat` rounds, and the medians are compared (a shared machine's noise
    moves single figures by 2x and more)."""
    copies = [("cp -r", ["cp", "-r", str(root), str(base / "cp")], base / "cp")]
    if shutil.which("rsync"):
        copies.append(("rsync -a", ["rsync", "-a", f"{root}/", str(base / "rsync")],
                       base / "rsync"))
    else:
        print("rsync is not installed: no rsync figure (apt-get install rsync)")
    took_bk: list[float] = []
    took: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in copies}
    for _ in range(repeat):
        for label, command, where in copies:
            shutil.rmtree(where, ignore_errors=True)
            os.sync()  # nothing of the build or of the last round left to flush
            copied = timed(label, lambda c=command: subprocess.run(c, check=True))  # type: ignore[misc]
            took[label].append((copied, timed("  then sync", os.sync)))
        shutil.rmtree(base / "backup", ignore_errors=True)
        os.sync()
        took_bk.append(timed("backup (full, synced)", lambda: backup(root, base / "backup")))
    mbs, bk = size / 1e6, statistics.median(took_bk)
    print(f"median of {repeat}: backup {bk:.2f} s, {mbs / bk:.1f} MB/s")
    for label, _, _ in copies:
        alone = statistics.median(t for t, _ in took[label])
        synced = statistics.median(t + s for t, s in took[label])
        print(f"  {label} {alone:.2f} s ({mbs / alone:.1f} MB/s), {synced:.2f} s with sync: "
              f"backup is {alone / bk:.2f}x of {label}, {synced / bk:.2f}x of {label} + sync")
    timed("backup (incremental, unchanged store)", lambda: backup(root, base / "backup"))


if __name__ == "__main__":
    main()
