"""A warm question over every run of a store of many small projects (a sweep in a project
each, say), against the same runs in one project.

Builds, through `init`/`log`/`finish`, ``--projects`` projects of ``--runs`` runs of 20
steps x 16 keys (and the same number of runs in one project, for comparison), compacts
both (which bundles them), makes their files look a minute old (so the run catalog takes
them at once), then times ``--repeat`` warm questions of the last value of `k0` per run
in one process, after ``--warmup``, with the change watch off and on
(`TRACKLAKE_WATCH_DIRS`), each the median in milliseconds; and what DuckDB answers from
the parts and the bundles tracklake built, for scale.

    python benchmarks/many_projects.py --data-dir /tmp/many-projects --projects 1000

A store is built once per size under ``--data-dir`` and reused.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SQL = ("SELECT project, run, arg_max(value, step) AS last FROM metrics WHERE key = 'k0' "
       "GROUP BY ALL ORDER BY ALL")


def build(root: Path, projects: int, runs: int, one_project: bool) -> None:
    import tracklake

    for p in range(projects):
        for r in range(runs):
            project = "all" if one_project else f"proj{p:05d}"
            with tracklake.init(project=project, run_id=f"r{p:05d}-{r}", root=root,
                                compact=False, capture_identity=False,
                                system_metrics=False) as run:
                for step in range(20):
                    run.log({f"k{i}": float(step * i + p) for i in range(16)}, step=step)
    tracklake.compact(root=root)
    past = time.time() - 60
    for dirpath, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            os.utime(os.path.join(dirpath, name), (past, past))


_TIMED = """
import statistics, sys, time
import tracklake
root, sql, warmup, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for _ in range(warmup):
    tracklake.query(sql, root=root)
    time.sleep(0.2)  # the watch is set up in the background from the second question
times = []
for _ in range(repeat):
    started = time.perf_counter()
    tracklake.query(sql, root=root)
    times.append(time.perf_counter() - started)
print(statistics.median(times) * 1000)
"""


def tracklake_ms(root: Path, watch: bool, warmup: int, repeat: int) -> float:
    env = {**os.environ, "TRACKLAKE_WATCH_DIRS": "1" if watch else "0"}
    out = subprocess.run([sys.executable, "-c", _TIMED, str(root), SQL, str(warmup),
                          str(repeat)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def duckdb_ms(source: str, repeat: int) -> float:
    import duckdb

    sql = SQL.replace("metrics", source)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        con = duckdb.connect(config={"threads": 2})
        con.sql(sql).to_arrow_table()
        con.close()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/many-projects"))
    parser.add_argument("--projects", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1, help="runs per project")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.projects} projects x {args.runs} runs, last k0 per run, warm, median ms")
    print(f"{'store':<24}{'watch off':>10}{'watch on':>10}{'DuckDB parts':>14}"
          f"{'DuckDB bundles':>16}")
    for label, one in (("one project", True), ("a project a run", False)):
        root = args.data_dir / f"{'one' if one else 'many'}-{args.projects}x{args.runs}"
        if not root.exists():
            started = time.perf_counter()
            build(root, args.projects, args.runs, one)
            print(f"(built {root} in {time.perf_counter() - started:.0f} s)")
        parts = f"read_parquet('{root}/metrics/**/*.parquet', hive_partitioning = true)"
        bundles = f"read_parquet('{root}/.cache/bundles/bundle-*.parquet')"
        bundled = f"{duckdb_ms(bundles, args.repeat):>16.1f}" if any(
            (root / ".cache" / "bundles").glob("bundle-*.parquet")) else f"{'none':>16}"
        print(f"{label:<24}"
              f"{tracklake_ms(root, False, args.warmup, args.repeat):>10.1f}"
              f"{tracklake_ms(root, True, args.warmup, args.repeat):>10.1f}"
              f"{duckdb_ms(parts, args.repeat):>14.1f}{bundled}")


if __name__ == "__main__":
    main()
