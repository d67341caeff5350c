#!/usr/bin/env python
"""The first questions right after the writers, as a sweep leaves the store: each run
written through the real write path with its automatic compaction on (the default),
which also has the run catalog and bundles brought up to date as runs finish
(store/_ops/derive.py).

A fresh store of ``--runs`` runs x ``--steps`` steps x 16 keys is built by ``--jobs``
processes (many_runs.py's runs), each waiting ``--pause`` seconds after a run, so that
the runs end over a while as a sweep's do. The moment the last writer returns, questions are
asked one after the other, each in a fresh process (read_cold.py's child: seconds after
``import tracklake``, wall seconds, peak RSS); then, once no compactor or deriver is left
at work, the same question again. Each line also says what ``.cache`` held before the
question: runs catalogued, bundles, and whether a deriver was at work; and before the
questions once all is done, each run the catalog does not hold, with what its files hold.

Usage (from the repository root)::

    python benchmarks/read_after_writers.py --runs 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from read_cold import _CHILD
from read_cost import sql_of

QUESTION = "last k0 per run"


def _cache_state(root: Path) -> str:
    from tracklake._ops.derive import running
    from tracklake._read.bundles import bundle_paths
    from tracklake._read.catalog import RunCatalog

    catalogued = RunCatalog(root)._table.num_rows
    return (f"{catalogued} catalogued, {len(bundle_paths(root))} bundles"
            + (", deriver at work" if running(root) else ""))


def _not_catalogued(root: Path) -> None:
    """Print each run the catalog does not hold, with what its files hold (segments,
    parts, attempt files) and how long ago its newest path changed."""
    from tracklake._read.catalog import RunCatalog

    held = RunCatalog(root).settled(None, None)
    now = time.time()
    for kind_dir in sorted((root / "metrics").glob("project=*/run=*")):
        project = kind_dir.parent.name.removeprefix("project=")
        run = kind_dir.name.removeprefix("run=")
        if (project, run) in held:
            continue
        paths = [*kind_dir.rglob("*"), *(root / "runs" / kind_dir.parent.name
                                          / kind_dir.name).rglob("*")]
        names = [p.name for p in paths if p.is_file()]
        newest = max((p.lstat().st_mtime for p in paths), default=0.0)
        print(json.dumps({"not catalogued": f"{project}/{run}",
                          "segments": sum(n.endswith(".arrows") for n in names),
                          "parts": sum(n.endswith(".parquet") for n in names),
                          "attempt files": sum(n.endswith(".json") for n in names),
                          "newest change, seconds ago": round(now - newest, 1)}),
              flush=True)


def _busy() -> bool:
    """Whether a compactor, deriver or builder of this machine is at work (not one
    sleeping until replaced parts may go, which starts with ``python -S -c``)."""
    found = subprocess.run(["pgrep", "-f", r"^\S+ -m tracklake\._ops\.(auto|derive|bundle) "],
                           capture_output=True, text=True)
    return bool(found.stdout.strip())


def _paced(task: tuple[str, int, int, float]) -> int:
    """many_runs.py's run, then a pause: a sweep's runs end over time, not all at once."""
    from many_runs import _write_run

    root, i, steps, pause = task
    _write_run((root, i, steps))
    time.sleep(pause)
    return i


def _build(base: Path, runs: int, steps: int, jobs: int, pause: float) -> Path:
    import multiprocessing as mp

    root = base / "store"
    root.mkdir(parents=True)
    with mp.get_context("spawn").Pool(jobs) as pool:
        for done, _ in enumerate(pool.imap_unordered(
                _paced, [(str(root), i, steps, pause) for i in range(runs)], chunksize=1), 1):
            if done % max(1, runs // 10) == 0:
                print(f"  written {done}/{runs} runs", flush=True)
    return root


def _ask(root: Path, label: str, since: float) -> dict[str, object]:
    state = _cache_state(root)
    at = time.perf_counter() - since
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(root), QUESTION,
                           sql_of(root, "tracklake", QUESTION, "")],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    row = {"question": label, "asked_at_s": round(at, 1),
           "after_import_s": round(figures["after_import"], 3), "wall_s": round(wall, 3),
           "rss_mib": round(figures["rss_mib"]), "cache_before": state}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/tracklake-after-writers"))
    parser.add_argument("--pause", type=float, default=0.1,
                        help="Seconds each writing process waits after a run.")
    parser.add_argument("--settle-timeout", type=float, default=1800.0)
    args = parser.parse_args()
    if args.data_dir.exists():
        shutil.rmtree(args.data_dir)
    started = time.perf_counter()
    root = _build(args.data_dir, args.runs, args.steps, args.jobs, args.pause)
    ended = time.perf_counter()
    print(f"{args.runs:,} runs x {args.steps} steps x 16 keys written by {args.jobs} "
          f"processes in {ended - started:.1f} s (load average {os.getloadavg()[0]:.1f})",
          flush=True)
    for n in (1, 2, 3):
        _ask(root, f"{QUESTION}, #{n} after the writers", ended)
    deadline = time.perf_counter() + args.settle_timeout
    while _busy() and time.perf_counter() < deadline:
        time.sleep(1.0)
    print(f"compactors and derivers done {time.perf_counter() - ended:.1f} s after the "
          "writers", flush=True)
    _not_catalogued(root)
    _ask(root, f"{QUESTION}, once they are done", ended)
    _ask(root, f"{QUESTION}, again", ended)


if __name__ == "__main__":
    main()
