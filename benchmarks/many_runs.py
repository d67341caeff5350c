#!/usr/bin/env python
"""Many-runs benchmark: what reading costs as a lab's store fills up with runs.

A store of ``--runs`` runs (default 1,000) x ``--steps`` steps (200) x 16 keys is built
through tracklake's real write path (``init`` / one ``log`` of 16 float64 values per
step / ``finish``, fsync off, no identity capture) by ``--jobs`` processes. It is timed
twice: as the writers left it (live segments only: nobody ran ``tracklake compact``), and
after ``tracklake.compact(root=...)``. Each question runs in a fresh process (what a user
waits for at the shell), median of ``--repeat`` runs:

- ``tracklake runs --root ROOT``                          (the run table: newest 50)
- ``tracklake runs --all --format tsv --root ROOT``       (every run, plain text)
- ``tracklake sql "SELECT count(*) FROM metrics"``        (points in the store)
- ``tracklake sql "<last value of key k0 per run>"``      (``arg_max(value, step)``)

and, where plain DuckDB answers the same question correctly over the same files (only the
compacted store: DuckDB cannot read live Arrow IPC segments), the same SQL in a fresh
``python -c "import duckdb; ..."`` over ``read_parquet(ROOT/metrics/**/*.parquet)``. Wall
and CPU (user + system of the child) seconds are printed, and the ratios tracklake /
DuckDB of both: on a shared machine the CPU time is the steadier one. A store under
``--data-dir`` built with the same parameters is reused (``--rebuild`` builds it again);
``--root STORE`` only times an existing store as it is (run it with ``PYTHONPATH``
pointing at another checkout to time that code on the same files). Readers keep a derived
run catalog in ``ROOT/.cache``: the first question after a change rebuilds it, so each
question is run once untimed first (``--cold`` times that first run instead).

Usage (from the repository root)::

    python benchmarks/many_runs.py                    # 1,000 runs x 200 steps x 16 keys
    python benchmarks/many_runs.py --runs 10000       # the lab-sized store (long build)
    python benchmarks/many_runs.py --runs 50 --steps 20 --repeat 1   # smoke test
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PROJECT = "many"
KEYS = [f"k{i}" for i in range(16)]
SEED = 20261201


def _write_run(task: tuple[str, int, int]) -> int:
    import tracklake

    root, i, steps = task
    rows = np.random.default_rng([SEED, i]).random((steps, len(KEYS))).tolist()
    run = tracklake.init(project=PROJECT, run_id=f"run-{i:05d}", root=root,
                         capture_identity=False, fsync=False)
    for step, row in enumerate(rows):
        run.log(dict(zip(KEYS, row, strict=True)), step=step)
    report = run.finish()
    if not report.complete:
        raise RuntimeError(f"run-{i:05d}: finish() reported unwritten data: {report}")
    return i


def build(base: Path, runs: int, steps: int, jobs: int, rebuild: bool) -> Path:
    root = base / f"runs-{runs}-steps-{steps}" / "store"
    manifest = root.parent / "manifest.json"
    if manifest.exists() and root.is_dir() and not rebuild:
        print(f"reusing {root}")
        return root
    if root.parent.exists():
        shutil.rmtree(root.parent)
    root.mkdir(parents=True)
    started = time.perf_counter()
    tasks = [(str(root), i, steps) for i in range(runs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        for done, _ in enumerate(pool.imap_unordered(_write_run, tasks, chunksize=4), 1):
            if done % max(1, runs // 10) == 0:
                print(f"  written {done}/{runs} runs, {time.perf_counter() - started:.0f} s",
                      flush=True)
    manifest.write_text(json.dumps({"runs": runs, "steps": steps, "keys": len(KEYS),
                                    "write_s": time.perf_counter() - started}))
    return root


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], repeat: int, warm: bool = True) -> tuple[float, float, str]:
    """Median wall and CPU (user + system) seconds of `argv` in a fresh process: on a
    shared machine the wall time carries other jobs' load, the CPU time much less. With
    `warm`, after one untimed run (which writes what the readers' caches lack)."""
    if warm:
        subprocess.run(argv, capture_output=True, check=True)
    times, cpus, out = [], [], ""
    for _ in range(repeat):
        started, cpu = time.perf_counter(), _cpu()
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - started)
        cpus.append(_cpu() - cpu)
        out = done.stdout
    return statistics.median(times), statistics.median(cpus), out


def _tracklake(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tracklake._cli.main", *args, "--root", str(root)]


def _duckdb(sql: str) -> list[str]:
    code = ("import duckdb, sys; con = duckdb.connect(); con.execute('SET threads = 2'); "
            "print(con.execute(sys.argv[1]).fetchall()[:3])")
    return [sys.executable, "-c", code, sql]


def measure(root: Path, repeat: int, compacted: bool, warm: bool = True
            ) -> list[dict[str, Any]]:
    parquet = f"read_parquet('{root}/metrics/**/*.parquet', hive_partitioning = true)"
    last = ("SELECT run, arg_max(value, step) AS last FROM {src} WHERE key = 'k0' "
            "GROUP BY run ORDER BY run")
    rows = []
    for name, args, direct_sql in [
        ("tracklake runs", ["runs"], None),
        ("runs --all --format tsv", ["runs", "--all", "--format", "tsv"], None),
        ("count(*) of metrics", ["sql", "SELECT count(*) FROM metrics"],
         f"SELECT count(*) FROM {parquet}"),
        ("last k0 per run", ["sql", last.format(src="metrics")], last.format(src=parquet)),
    ]:
        seconds, cpu, _ = _timed(_tracklake(root, *args), repeat, warm)
        row: dict[str, Any] = {"question": name, "tracklake_s": seconds, "tracklake_cpu": cpu}
        if compacted and direct_sql is not None:
            row["duckdb_s"], row["duckdb_cpu"], _ = _timed(_duckdb(direct_sql), repeat, warm)
            row["ratio"] = seconds / row["duckdb_s"]
            row["cpu_ratio"] = cpu / row["duckdb_cpu"]
        rows.append(row)
    return rows


def _print(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}  (wall / CPU seconds, fresh process each)")
    print(f"  {'question':<24} {'tracklake':>14} {'duckdb':>14} {'ratio':>11}")
    for r in rows:
        ours = f"{r['tracklake_s']:.2f} / {r['tracklake_cpu']:.2f}"
        duck = f"{r['duckdb_s']:.2f} / {r['duckdb_cpu']:.2f}" if "duckdb_s" in r else "-"
        ratio = f"{r['ratio']:.2f} / {r['cpu_ratio']:.2f}" if "ratio" in r else "-"
        print(f"  {r['question']:<24} {ours:>14} {duck:>14} {ratio:>11}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/tracklake-many-runs"))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-live", action="store_true",
                        help="Do not time the store before compaction (slow at 10,000 runs).")
    parser.add_argument("--root", type=Path,
                        help="Only time this existing store as it is (no build, no compaction);"
                             " with PYTHONPATH pointing at another checkout, that code's times.")
    parser.add_argument("--cold", action="store_true",
                        help="Time each question's first run (caches as the store left them)"
                             " instead of warming the readers' caches first.")
    args = parser.parse_args()
    warm = not args.cold
    if args.root is not None:
        compacted = not any(args.root.rglob("*.arrows"))
        rows = measure(args.root, args.repeat, compacted, warm)
        _print(f"{args.root} ({'compacted' if compacted else 'with live segments'})", rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    root = build(args.data_dir, args.runs, args.steps, args.jobs, args.rebuild)
    values = args.runs * args.steps * len(KEYS)
    print(f"{args.runs:,} runs x {args.steps} steps x {len(KEYS)} keys = {values:,} values")
    result: dict[str, Any] = {"runs": args.runs, "steps": args.steps, "values": values}
    if any(root.rglob("*.arrows")):
        if not args.skip_live:
            result["live"] = measure(root, args.repeat, compacted=False, warm=warm)
            _print("as the writers left it (segments not yet in Parquet)", result["live"])
        import tracklake

        started = time.perf_counter()
        tracklake.compact(root=root)
        result["compact_s"] = time.perf_counter() - started
        print(f"\ncompacted in {result['compact_s']:.1f} s")
    result["compacted"] = measure(root, args.repeat, compacted=True, warm=warm)
    _print("compacted", result["compacted"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
