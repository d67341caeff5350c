#!/usr/bin/env python
"""Bytes on disk before and after compaction, for many small runs and for one wide part.

1. ``--runs`` runs (default 1,000) x ``--steps`` steps (10) x 16 keys, each written through
   tracklake's real write path (``init`` / ``log`` / ``finish``, fsync off, no identity
   capture) by ``--jobs`` processes, then ``tracklake.compact``. Printed: the bytes of
   every file of the store as the writers left it and after compaction, and the ratio
   after / before (the goal: never above 1).
2. One run logging ``--keys`` keys (default 1,000) at 10 steps, compacted: the part's size,
   its footer's size and the size of the metric summary the footer carries (stored once).

Usage (from the repository root)::

    python benchmarks/store_bytes.py                       # 1,000 tiny runs
    python benchmarks/store_bytes.py --runs 100 --jobs 1   # a quick look
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import tempfile
import time
from pathlib import Path

KEYS = [f"k{i}" for i in range(16)]


def _write_run(task: tuple[str, int, int]) -> None:
    import tracklake

    root, i, steps = task
    run = tracklake.init(project="tiny", run_id=f"run-{i:05d}", root=root,
                         capture_identity=False, fsync=False)
    for step in range(steps):
        run.log({k: step * 0.25 + n for n, k in enumerate(KEYS)}, step=step)
    run.finish()


def _bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def many_tiny_runs(base: Path, runs: int, steps: int, jobs: int) -> None:
    import tracklake

    root = base / "tiny"
    with mp.get_context("spawn").Pool(jobs) as pool:
        list(pool.imap_unordered(_write_run, [(str(root), i, steps) for i in range(runs)],
                                 chunksize=8))
    before = _bytes(root)
    started = time.perf_counter()
    tracklake.compact(root=root)
    seconds = time.perf_counter() - started
    after = _bytes(root)
    print(f"{runs} runs x {steps} steps x {len(KEYS)} keys: {before / 1e6:.2f} MB live, "
          f"{after / 1e6:.2f} MB compacted (after/before {after / before:.2f}), "
          f"compaction {seconds:.1f} s")


def wide_part(base: Path, keys: int) -> None:
    import pyarrow.parquet as pq

    import tracklake

    root = base / "wide"
    with tracklake.init(project="wide", run_id="wide", root=root, capture_identity=False,
                        fsync=False) as run:
        for step in range(10):
            run.log({f"key/{n:04d}": step + n / 7 for n in range(keys)}, step=step)
    tracklake.compact(root=root)
    part = next((root / "metrics").rglob("*.parquet"))
    size = part.stat().st_size
    data = part.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    summary = len(pq.ParquetFile(part).metadata.metadata[b"tracklake.summary"])
    print(f"one part of {keys} keys x 10 steps: {size / 1e3:.1f} KB, footer "
          f"{footer / 1e3:.1f} KB, summary {summary / 1e3:.1f} KB "
          f"(footer/summary {footer / summary:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tracklake-bytes-"))
    try:
        many_tiny_runs(base, args.runs, args.steps, args.jobs)
        wide_part(base, args.keys)
    finally:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
