#!/usr/bin/env python
"""What bounding reads in time costs (docs/many-nodes.md, "A hung mount").

Reads of the store run in a worker thread watched for progress (`TRACKLAKE_READ_TIMEOUT`,
30 s by default); 0 turns the bound off. On a store of ``--runs`` runs x ``--steps``
steps x 8 keys (live segments, and compacted with ``--compact``), each read is timed
with the bound on and off, alternately in one process, median of ``--repeat``:

- ``list_runs``; ``tracklake.query("SELECT count(*) FROM metrics")``;
- ``read_run`` of every run (one bounded hand-off per batch);
- ``fsck`` (one hand-off per stream and per check);

and the two primitives: one `bounded` hand-off of a call that does nothing, and one
`touch` (what each file or directory asked for costs).

Usage (from the repository root)::

    python benchmarks/read_bounds.py                  # 200 runs x 100 steps
    python benchmarks/read_bounds.py --runs 20 --repeat 3   # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tracklake
from tracklake._format.bounded import READ_TIMEOUT_ENV, bounded, touch
from tracklake._ops.fsck import fsck


def _build(root: Path, runs: int, steps: int) -> None:
    for i in range(runs):
        with tracklake.init(project="p", run_id=f"r{i}", root=root, capture_identity=False,
                            compact=False, system_metrics=False) as r:
            for step in range(steps):
                r.log({f"k{k}": float(step + k) for k in range(8)}, step=step)


def _read_all(root: Path) -> int:
    rows = 0
    for run in tracklake.list_runs(root):
        for _, batch in tracklake.read_run(root, tracklake.Cursor(run.project, run.run)):
            rows += batch.num_rows
    return rows


def _timed(call: Callable[[], object], bound: str) -> float:
    os.environ[READ_TIMEOUT_ENV] = bound
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compact", action="store_true", help="compact the store first")
    args = parser.parse_args()
    os.environ["TRACKLAKE_COMPACT"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        _build(root, args.runs, args.steps)
        if args.compact:
            tracklake.compact(root=root)
        reads: dict[str, Callable[[], object]] = {
            "list_runs": lambda: tracklake.list_runs(root),
            "query count(*)": lambda: tracklake.query("SELECT count(*) FROM metrics",
                                                      root=root),
            "read_run, every run": lambda: _read_all(root),
            "fsck": lambda: fsck(root),
        }
        print(f"{args.runs} runs x {args.steps} steps x 8 keys"
              f"{' (compacted)' if args.compact else ' (live segments)'}, "
              f"median of {args.repeat}")
        print(f"{'read':24} {'unbounded':>10} {'bounded':>10} {'ratio':>7}")
        for name, call in reads.items():
            call()  # warm: caches, imports
            off, on = [], []
            for _ in range(args.repeat):
                off.append(_timed(call, "0"))
                on.append(_timed(call, "30"))
            a, b = statistics.median(off), statistics.median(on)
            print(f"{name:24} {a * 1e3:8.1f}ms {b * 1e3:8.1f}ms {b / a:7.3f}")
        os.environ[READ_TIMEOUT_ENV] = "30"
        n = 20_000
        start = time.perf_counter()
        for _ in range(n):
            bounded(lambda: None, root)
        hand_off = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            touch(root)
        touched = (time.perf_counter() - start) / n
        print(f"one bounded hand-off: {hand_off * 1e6:.0f} us; one touch (no watch): "
              f"{touched * 1e9:.0f} ns")


if __name__ == "__main__":
    main()
