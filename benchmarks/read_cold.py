#!/usr/bin/env python
"""The first questions after the writers: what a store costs before any reader has
derived its run catalog, decoded-file cache or bundles.

The store's ``.cache`` (everything derived) is moved aside, as it is right after the
writers (training ranks never write it), then questions are asked one after the other,
each in a fresh process (``tracklake.query`` after ``import tracklake``; the run table
through the CLI's ``print_runs``), with a reader's background bundle builder started
as a user meets it. Each line: the question, its seconds after import, the process's
wall seconds and peak RSS, and what ``.cache`` holds afterwards. The store's own
``.cache`` is put back at the end, so the store is as it was.

Usage (a store built by ``benchmarks/read_cost.py``)::

    python benchmarks/read_cold.py --root /tmp/tracklake-read-cost/runs-10000-steps-200/store
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from read_cost import middle_run, sql_of

ORDER = ("last k0 per run", "max k3 per run", "last k0 per run", "one run's k5",
         "tracklake runs", "last k0 per run")

_CHILD = """
import json, sys, time, resource
started = time.perf_counter()
import tracklake
imported = time.perf_counter()
root, question, sql = sys.argv[1:4]
if question == "tracklake runs":
    import contextlib, io
    from tracklake._cli.run_list import print_runs
    with contextlib.redirect_stdout(io.StringIO()):
        print_runs(root, None, (), tracklake.ReadProblems())
else:
    tracklake.query(sql, root=root)
print(json.dumps({"after_import": time.perf_counter() - imported,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args()
    root: Path = args.root.resolve()
    cache = root / ".cache"
    aside = root.parent / f"{root.name}.cache-aside"
    if aside.exists():
        sys.exit(f"{aside} exists: a run of this benchmark did not end; put it back as "
                 f"{cache} first")
    run = middle_run(root)
    if cache.exists():
        cache.rename(aside)
    try:
        for question in ORDER:
            sql = "" if question == "tracklake runs" else \
                sql_of(root, "tracklake", question, run)
            started = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", _CHILD, str(root), question, sql],
                                 check=True, capture_output=True, text=True)
            wall = time.perf_counter() - started
            got = json.loads(out.stdout.strip().splitlines()[-1])
            held = sorted(p.name for p in cache.iterdir()) if cache.exists() else []
            print(f"{question:18} {got['after_import']:7.2f} s after import, "
                  f"{wall:7.2f} s wall, {got['rss_mib']:6.0f} MiB; .cache: "
                  f"{', '.join(held) or 'nothing'}", flush=True)
    finally:
        builder = subprocess.run(["pgrep", "-f", f"tracklake._ops.bundle {root}"],
                                 capture_output=True, text=True).stdout.split()
        for pid in builder:
            subprocess.run(["kill", pid], check=False)
        time.sleep(1 if builder else 0)  # let a killed builder end before .cache goes
        shutil.rmtree(cache, ignore_errors=True)
        if aside.exists():
            aside.rename(cache)


if __name__ == "__main__":
    main()
