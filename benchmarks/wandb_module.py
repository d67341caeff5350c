#!/usr/bin/env python
"""What `import tracklake.wandb as wandb` costs per `wandb.log` call, next to `Run.log`
and the real wandb (offline, if installed).

Each contender logs ``--steps`` (default 20000) rows of 32 float metrics with an explicit
step (and tracklake.wandb once more without a step, on a ``define_metric`` axis), in this
one process, each into a fresh temporary directory; the dicts are built before timing.
Reported: the median and p99 of the per-call time (perf_counter_ns around the call).

Usage (from the repository root)::

    TRACKLAKE_SYSTEM_METRICS=0 .venv/bin/python benchmarks/wandb_module.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

KEYS = [f"actor/k{i}" for i in range(32)]


def timed(label: str, rows: list[dict[str, float]], call: Callable[[dict[str, float], int],
                                                                    Any]) -> None:
    times = []
    for step, row in enumerate(rows):
        start = time.perf_counter_ns()
        call(row, step)
        times.append(time.perf_counter_ns() - start)
    times.sort()
    print(f"{label:48s} median {times[len(times) // 2] / 1000:6.1f} µs   "
          f"p99 {times[int(len(times) * 0.99)] / 1000:6.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    steps = parser.parse_args().steps
    rows = [{k: float(step + i) for i, k in enumerate(KEYS)} for step in range(steps)]

    import tracklake
    import tracklake.wandb as tlwandb

    root = tempfile.mkdtemp(prefix="tracklake-bench-")
    run = tracklake.init(project="bench", root=root, system_metrics=False)
    timed("tracklake Run.log(d, step=i)", rows, lambda d, s: run.log(d, step=s))
    run.finish()
    tlwandb.init(project="bench", root=root)
    timed("tracklake.wandb.log(d, step=i)", rows, lambda d, s: tlwandb.log(d, step=s))
    tlwandb.finish()
    tlwandb.init(project="bench-axis", root=root)
    tlwandb.define_metric("actor/k0")
    tlwandb.define_metric("actor/*", step_metric="actor/k0")
    timed("tracklake.wandb.log(d) on a define_metric axis", rows, lambda d, s: tlwandb.log(d))
    tlwandb.finish()
    try:
        import wandb
    except ImportError:
        print("wandb: not installed, skipped")
        return
    os.environ["WANDB_ERROR_REPORTING"] = "false"
    wb = wandb.init(project="bench", mode="offline", dir=tempfile.mkdtemp(),
                    settings=wandb.Settings(silent=True, x_disable_stats=True))
    timed("wandb 0.31 offline wandb.log(d, step=i)", rows, lambda d, s: wb.log(d, step=s))
    wb.finish()


if __name__ == "__main__":
    main()
