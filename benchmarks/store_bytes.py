#!/usr/bin/env python
"""Bytes on disk before and after compaction, for many small runs and for one wide part.

1. ``--runs`` runs (default 1,000) x ``--steps`` steps (10) x 16 keys, each written through
   tracklake's real write path (``init`` / ``log`` / ``finish``, fsync off, no identity
   capture) by ``--jobs`` processes, then ``tracklake.compact``. Printed: the bytes of
   every file of the store as the writers left it and after compaction, and the ratio
   after / before (the goal: never above 1).
2. ``--runs`` / 10 runs x 20 steps x 3 keys, each with a config, a text, a generation, a
   span, an artifact and an alert: every record kind, before and after, per kind.
3. One run logging ``--keys`` keys (default 1,000) at 10 steps, compacted: the part's size,
   its footer's size and the size of the metric summary the footer carries (stored once,
   and only when it is at most a quarter of the part's data: else readers compute it
   from the rows, and "none" is printed).

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
                         capture_identity=False, fsync=False, compact=False)
    for step in range(steps):
        run.log({k: step * 0.25 + n for n, k in enumerate(KEYS)}, step=step)
    run.finish()


def _write_mixed_run(task: tuple[str, int, int]) -> None:
    import tracklake

    root, i, steps = task
    with tracklake.init(project="mixed", run_id=f"run-{i:05d}", root=root,
                        capture_identity=False, fsync=False, compact=False,
                        config={"lr": 1e-4, "seed": i, "model": "tiny"}) as run:
        for step in range(steps):
            run.log({"loss": 1 / (step + 1), "reward": step * 0.1, "kl": 0.01}, step=step)
        run.log_text("note", f"run {i} done")
        run.log_generations([("what is 2+2?", "4", 1.0)], step=steps - 1)
        with run.span("rollout", step=steps - 1, token_ids=[1, 2, 3]):
            pass
        run.log_artifact(b"weights", name="ckpt.bin")
        run.alert("finished", f"run {i}")


def _bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _bytes_by_kind(root: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for p in root.rglob("*"):
        if p.is_file():
            kind = p.relative_to(root).parts[0]
            sizes[kind] = sizes.get(kind, 0) + p.stat().st_size
    return sizes


def every_kind(base: Path, runs: int, jobs: int) -> None:
    import tracklake

    root = base / "mixed"
    with mp.get_context("spawn").Pool(jobs) as pool:
        list(pool.imap_unordered(_write_mixed_run, [(str(root), i, 20) for i in range(runs)],
                                 chunksize=8))
    before = _bytes_by_kind(root)
    tracklake.compact(root=root)
    after = _bytes_by_kind(root)
    print(f"{runs} runs x 20 steps x 3 keys, every kind: "
          f"{sum(before.values()):,} B live, {sum(after.values()):,} B compacted "
          f"(after/before {sum(after.values()) / sum(before.values()):.2f})")
    for kind in sorted(before):
        print(f"  {kind:12} {before[kind]:>10,} -> {after.get(kind, 0):>10,} B "
              f"({after.get(kind, 0) / before[kind]:.2f})")


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
                        fsync=False, compact=False) as run:
        for step in range(10):
            run.log({f"key/{n:04d}": step + n / 7 for n in range(keys)}, step=step)
    live = _bytes(root / "metrics")
    tracklake.compact(root=root)
    part = next((root / "metrics").rglob("*.parquet"))
    size = part.stat().st_size
    data = part.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    summary = pq.ParquetFile(part).metadata.metadata.get(b"tracklake.summary")
    stored = f"{len(summary) / 1e3:.1f} KB" if summary else "none (computed from the rows)"
    print(f"one part of {keys} keys x 10 steps: {live / 1e3:.1f} KB live, part "
          f"{size / 1e3:.1f} KB, footer {footer / 1e3:.1f} KB, summary {stored}")


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
        every_kind(base, max(1, args.runs // 10), args.jobs)
        wide_part(base, args.keys)
    finally:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
