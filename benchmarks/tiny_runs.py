#!/usr/bin/env python
"""Many tiny runs in one root: what listing and counting the runs cost as the count grows.

A store of ``--runs`` runs, each one ``log`` of two float64 values at step 0, is built
through tracklake's real write path (``init`` / ``log`` / ``finish``, fsync off, no
identity capture, no system metrics, each finished run compacted by the compactor that
``finish`` starts, as by default) by ``--jobs`` processes. A store is the smallest a run
can be, so that its count, not its data, is what the questions pay for. A store built
with the same count under ``--data-dir`` is reused, and grown to a larger ``--runs``
(the runs already there are kept).

Each question then runs in a fresh process, as a user at the shell waits for it, after
one untimed run (the first after the writers builds the run catalog, printed apart):

- ``tracklake sql "SELECT count(*) FROM runs"``   (how many runs)
- ``tracklake runs``                              (the newest 50 runs)
- one run's values (``sql ... WHERE run = 'run-0000000'``)
- ``tracklake runs`` right after one run changed (its rank directory's mtime set anew:
  the reader reads it from its files and writes the run catalog again)

and, in one process, ``SELECT count(*) FROM runs`` asked ``--warm`` times (no directory
watch, as on NFS; the median of all but the first, in milliseconds).

Printed: the wall seconds (median of ``--repeat``), the peak resident memory of the
process (MiB), and per run the microseconds and bytes above what the same question costs
on a store of 1 run (the imports and the connection, measured the same way), the slope
to extrapolate from.

    python benchmarks/tiny_runs.py --runs 100000 --data-dir /tmp/tiny-runs
    python benchmarks/tiny_runs.py --root STORE     # only time an existing store
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT = "many"
#: Asked of every store: (name, arguments, whether a run changes before each asking).
QUESTIONS = [
    ("count(*) FROM runs", ["sql", "SELECT count(*) FROM runs", "--format", "csv"], False),
    ("tracklake runs", ["runs"], False),
    ("one run's values", ["sql", "SELECT step, key, value FROM metrics "
                          "WHERE run = 'run-0000000'"], False),
    ("runs, one changed", ["runs"], True),
]


def _write_runs(task: tuple[str, list[int], bool]) -> int:
    import tracklake

    root, ids, by_chunk = task
    for i in ids:
        run = tracklake.init(project=PROJECT, run_id=f"run-{i:07d}", root=root,
                             capture_identity=False, fsync=False, system_metrics=False,
                             compact=not by_chunk)
        run.log({"loss": 1.0 / (i + 1), "acc": (i % 100) / 100}, step=0)
        report = run.finish()
        if not report.complete:
            raise RuntimeError(f"run-{i:07d}: finish() reported unwritten data: {report}")
    if by_chunk:  # each run of the chunk, as `tracklake compact --run` would
        from tracklake._ops.derive import start

        for i in ids:
            tracklake.compact(root=root, project=PROJECT, run=f"run-{i:07d}")
        start(Path(root))  # the catalog and bundles derived, as after a compactor's run
    return len(ids)


def _written(root: Path) -> set[int]:
    """The numbers of the runs the store holds already (a build stopped part way leaves
    its runs behind, out of order: those are kept, never written again as a resumed
    attempt)."""
    try:
        names = os.listdir(root / "runs" / f"project={PROJECT}")
    except FileNotFoundError:
        return set()
    return {int(n[len("run=run-"):]) for n in names if n.startswith("run=run-")}


def build(root: Path, runs: int, jobs: int, by_chunk: bool = False) -> float:
    """Grow the store at `root` to `runs` runs (writing those not there yet); the
    seconds it took. `by_chunk`: each writing process compacts its last 1,000 runs
    itself instead of a compactor process started at each run's end, then starts the
    deriver as that compactor would (the same parts, catalog and bundles, written 5 to
    10 times faster: what makes a store of 10⁵ or 10⁶ runs buildable)."""
    have = _written(root)
    missing = [i for i in range(runs) if i not in have]
    if not missing:
        print(f"reusing {root} ({len(have):,} runs)")
        return 0.0
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    chunk = 1000
    tasks = [(str(root), missing[i:i + chunk], by_chunk)
             for i in range(0, len(missing), chunk)]
    done = 0
    with mp.get_context("spawn").Pool(jobs) as pool:
        for n in pool.imap_unordered(_write_runs, tasks):
            done += n
            if done % max(chunk, runs // 20) < chunk:
                rate = done / (time.perf_counter() - started)
                print(f"  {len(have) + done:,}/{runs:,} runs, {rate:.0f} runs/s", flush=True)
        # Ended, not terminated: a worker's last finished runs wait for a compactor its
        # exit starts (`_write/compactor.py`), which SIGTERM would skip.
        pool.close()
        pool.join()
    return time.perf_counter() - started


def _change_a_run(root: Path, i: int) -> None:
    """Change run-0000000 as a new attempt file would (its rank directory's mtime, to one
    long enough ago that the reader catalogues it again)."""
    past = time.time() - 60 - i
    os.utime(root / "runs" / f"project={PROJECT}" / "run=run-0000000" / "rank=0",
             (past, past))


def timed(root: Path, args: list[str], repeat: int, changed: bool
          ) -> tuple[float, float, str]:
    """Median wall seconds and peak resident MiB of `tracklake ARGS --root ROOT`, each in
    a fresh process, after one untimed run (and, if `changed`, after one run of the store
    changed); and the last output."""
    argv = [sys.executable, "-m", "tracklake._cli.main", *args, "--root", str(root)]
    walls, peaks, out = [], [], ""
    for i in range(repeat + 1):
        if changed:
            _change_a_run(root, i)
        # GNU time's -f keeps the child's own peak, not the largest of all children's.
        started = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], capture_output=True,
                              text=True, check=True)
        wall = time.perf_counter() - started
        if i:
            walls.append(wall)
            peaks.append(int(done.stderr.strip().splitlines()[-1]) / 1024)
        out = done.stdout
    return statistics.median(walls), statistics.median(peaks), out


_WARM = """
import statistics, sys, time, tracklake
took = []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    tracklake.query("SELECT count(*) FROM runs", root=sys.argv[1])
    took.append(time.perf_counter() - started)
print(statistics.median(took[1:]) * 1e3)
"""


def warm(root: Path, times: int) -> float:
    """Median milliseconds of the runs view's count asked `times` in one process (the
    first left out), with no directory watch."""
    done = subprocess.run([sys.executable, "-c", _WARM, str(root), str(times)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "TRACKLAKE_WATCH_DIRS": "0"})
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/tracklake-tiny-runs"))
    parser.add_argument("--root", type=Path, help="Only time this existing store as it is.")
    parser.add_argument("--compact-by-chunk", action="store_true",
                        help="Writers compact their runs 1,000 at a time, no compactor "
                             "process a run (to build 10^5 runs and more).")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--warm", type=int, default=20,
                        help="Times the runs view's count is asked in one process.")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    one = args.data_dir / "runs-1" / "store"
    build(one, 1, 1)
    if args.root is None:
        root = args.data_dir / "grown" / "store"
        seconds = build(root, args.runs, args.jobs, args.compact_by_chunk)
        if seconds:
            print(f"built in {seconds:.0f} s ({args.runs / seconds:.0f} runs/s)")
        if args.build_only:
            return
    else:
        root = args.root
    print(f"{root}: questions in fresh processes, median of {args.repeat}")
    print(f"  {'question':<20} {'1 run s':>8} {'MiB':>6} {'store s':>8} {'MiB':>6} "
          f"{'µs/run':>7} {'B/run':>7}")
    count = None
    for name, question, changed in QUESTIONS:
        base_s, base_mib, _ = timed(one, question, args.repeat, changed)
        wall, mib, out = timed(root, question, args.repeat, changed)
        if count is None:
            count = int(out.split()[-1])
        runs = count
        print(f"  {name:<20} {base_s:>8.3f} {base_mib:>6.0f} {wall:>8.3f} {mib:>6.0f} "
              f"{(wall - base_s) / runs * 1e6:>7.1f} {(mib - base_mib) * 2**20 / runs:>7.0f}",
              flush=True)
    print(f"  runs counted: {count:,}")
    if args.warm > 1:
        print(f"  count(*) FROM runs, one process, median of {args.warm - 1} after the "
              f"first: 1 run {warm(one, args.warm):.1f} ms, the store "
              f"{warm(root, args.warm):.1f} ms")


if __name__ == "__main__":
    main()
