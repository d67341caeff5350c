#!/usr/bin/env python
"""Report-at-scale benchmark: `tracklake report` of a run with many keys, against drawing
the same curves with matplotlib (what one would otherwise use to make SVG charts).

A store of one run with ``--keys`` metric keys (default 1,000) x ``--steps`` steps
(default 1,000; values from ``numpy.random.default_rng(0)``) is written through the real
write path (``tracklake.init`` with fsync off, one ``run.log`` per step) and compacted.

Timed (median of ``--repeat``, default 3, after one warm-up):

(a) tracklake: ``read_answers`` (every answer the page shows, the curves of both x axes
    downsampled in DuckDB) plus ``to_page``: the whole page, as ``tracklake report``
    writes it;
(b) matplotlib: only the charts, from the curves the Markdown report reads (read before
    timing, so (b) does no I/O):
    one ``Figure`` per key with one ``plot`` line, saved as SVG into memory, the Agg
    backend, ``svg.fonttype = 'none'`` (text as text, as ours).

Printed: both times, their ratio, the page's size and its bytes per chart.

Usage (from the repository root)::

    python benchmarks/report_scale.py
    python benchmarks/report_scale.py --keys 100 --steps 10000
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tracklake
from tracklake._read.reader import ReadProblems, find_run
from tracklake._report.content import read_report
from tracklake._report.series import CurveQuery
from tracklake._ui.offline import read_answers, to_page


def build(root: Path, keys: int, steps: int) -> None:
    rng = np.random.default_rng(0)
    names = [f"layer{k:04d}/grad_norm" for k in range(keys)]
    with tracklake.init(project="bench", run_id="wide", root=root, fsync=False,
                        capture_identity=False) as run:
        for step in range(steps):
            run.log(dict(zip(names, rng.standard_normal(keys).tolist(), strict=True)),
                    step=step)
    tracklake.compact(root=root)


def median_time(func: Callable[[], object], repeat: int) -> float:
    func()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    from matplotlib.figure import Figure

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        started = time.perf_counter()
        build(root, args.keys, args.steps)
        print(f"store: 1 run x {args.keys:,} keys x {args.steps:,} steps written and "
              f"compacted in {time.perf_counter() - started:.1f} s")
        record = find_run(root, "wide")
        spec = CurveQuery()
        page: list[str] = []

        def ours() -> None:
            page[:] = [to_page(read_answers(root, [record], spec, ReadProblems()))]

        ours_s = median_time(ours, args.repeat)
        report = read_report(root, [record], spec, ReadProblems())

        def peer() -> None:
            for key, curves in report.charts.items():
                fig = Figure(figsize=(4.4, 2.4))
                ax = fig.add_subplot()
                for curve in curves:
                    ax.plot(curve.xs, curve.ys, linewidth=1)
                ax.set_title(key)
                fig.savefig(io.BytesIO(), format="svg")

        peer_s = median_time(peer, args.repeat)
        size = len(page[0].encode())
        print(f"(a) tracklake report, whole page: {ours_s:.2f} s; {size / 1e6:.1f} MB, "
              f"{size / max(len(report.charts), 1) / 1e3:.1f} KB per chart")
        print(f"(b) matplotlib, the charts only:  {peer_s:.2f} s")
        print(f"ratio (a)/(b): {ours_s / peer_s:.3f}")


if __name__ == "__main__":
    main()
