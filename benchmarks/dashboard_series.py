#!/usr/bin/env python
"""Dashboard curve benchmark: the time `tracklake ui` takes to answer one chart of a key
with many points, against DuckDB only reading those points (the floor any answer pays).

A store of one run, one rank, one key with ``--points`` values (default 10,000,000; a
random walk from ``numpy.random.default_rng(0)``) is written through the real write path
(``tracklake.init``, one ``run.log`` per step) and compacted, unless ``--root`` holds it
already. Timed (best of ``--repeat``, default 3), each as the dashboard's ``/api/series``
computes it (`tracklake._ui.answers.series`, 1,000 pixel buckets):

- the whole run on the step axis; a zoom to 1 % of it; the ranks' mean; the time since
  the run started on the x axis;
- the floor: ``SELECT sum(step), sum(value)`` of the key through ``tracklake.query``.

Printed: each time and its ratio to the floor.

Usage (from the repository root)::

    python benchmarks/dashboard_series.py
    python benchmarks/dashboard_series.py --points 1000000 --root /tmp/series-store
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tracklake
from tracklake._ui.answers import series
from tracklake._ui.series import SeriesQuery


def write(root: Path, points: int) -> None:
    values = np.random.default_rng(0).standard_normal(points).cumsum().tolist()
    run = tracklake.init(project="p", run_id="big", root=root, system_metrics=False,
                         capture_identity=False)
    log = run.log
    for step, value in enumerate(values):
        log({"loss": value}, step=step)
    run.finish()
    subprocess.run([sys.executable, "-m", "tracklake._cli.main", "compact", "--root",
                    str(root)], check=True, stdout=subprocess.DEVNULL)


def best(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", type=Path, help="a store written by this benchmark")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp) / "store"
        if not (root / "runs").exists():
            start = time.perf_counter()
            write(root, args.points)
            print(f"wrote and compacted {args.points:,} points in "
                  f"{time.perf_counter() - start:.1f} s")
        run = (("p", "big"),)
        floor = best(lambda: tracklake.query(
            "SELECT sum(step), sum(value) FROM metrics WHERE key = 'loss'", root=root),
            args.repeat)
        print(f"{'DuckDB reading the points':28s} {floor:6.2f} s   1.0x")
        mid = args.points / 2
        for label, q in (
                ("whole run, step axis", SeriesQuery(key="loss", runs=run)),
                ("zoom to 1 %", SeriesQuery(key="loss", runs=run, lo=mid,
                                            hi=mid + args.points / 100)),
                ("mean of the ranks", SeriesQuery(key="loss", runs=run, ranks="mean")),
                ("time since the start", SeriesQuery(key="loss", runs=run, x="relative"))):
            took = best(lambda q=q: series(root, q), args.repeat)
            print(f"{label:28s} {took:6.2f} s  {took / floor:4.1f}x")


if __name__ == "__main__":
    main()
