#!/usr/bin/env python
"""Read-cost benchmark: what one question costs beyond the data it reads.

Stores of ``--sizes`` runs (default 100 and 1,000; 10,000 as an option) x ``--steps``
steps (200) x 16 keys are built through tracklake's real write path by
``benchmarks/many_runs.py``'s builder (``init`` / one ``log`` of 16 values per step /
``finish``, fsync off, no identity capture, the writers' automatic compaction), then
compacted as a user would (``tracklake.compact(root=...)``, which also builds the
bundles). Each store is read untimed first (``tracklake runs``, then the last ``k0``
per run), so the derived run catalog and bundles are as a user meets them after the
first questions.

Questions (``RUN`` is the run in the middle of the store):

- last value of ``k0`` per run   ``arg_max(value, step) WHERE key = 'k0' GROUP BY run``
- max of ``k3`` per run          ``max(value) WHERE key = 'k3' GROUP BY run``
- one run's history of ``k5``    ``step, value WHERE run = RUN AND key = 'k5'``
- ``tracklake runs``             the run table (the newest 50 runs, rendered with rich);
                                 DuckDB: the attempt files (``read_json``) joined with
                                 each run's last step

Each is answered by four readers: tracklake (``tracklake.query(sql, root=ROOT)``; the
run table through the CLI's own ``print_runs``; the first two questions are answered
from ``metric_summaries``, docs/concepts.md), tracklake over the values (``values``: the
same with a CTE before those two, which keeps them from the summaries; the other two are
asked as tracklake asks them), DuckDB over the parts
(``read_parquet('ROOT/metrics/**/*.parquet', hive_partitioning = true)``; for one run's
history, that run's parts only: ``ROOT/metrics/project=*/run=RUN/**/*.parquet``) and DuckDB over
the bundles tracklake built (``read_parquet('ROOT/.cache/bundles/bundle-*.parquet')``,
which store the partition columns), DuckDB with ``SET threads = 2``: one in-memory
database per process, opened by the first question, and a new connection to it per
question, as tracklake keeps one. Two timings of each:

- **after import**: in a fresh process that has imported the reader (``import
  tracklake`` / ``import duckdb``), the first question (``first``: what a notebook's first
  cell pays, including what the reader imports on first use), then the median of
  ``--repeat`` more (``warm``);
- **whole process**: ``python -m tracklake._cli.main sql "..." --root ROOT`` (and
  ``runs``) against ``python -c "import duckdb; ..."``, wall and CPU (user + system) of
  the child, median of ``--fresh-repeat``, the readers interleaved.

A fourth reader is trackio (0.43.0), as a trackio user asks these questions without a
dashboard: the same values logged through trackio's own write path (``trackio.init`` /
one ``trackio.log`` of the 16 values per step / ``trackio.finish``, in trackio's own
interpreter, ``--trackio-python``, made as a venv when missing, as benchmarks/dashboard.py
does) and read with the standard library's ``sqlite3`` from its database (a row per step,
the values as JSON: ``json_extract(metrics, '$.k0')``; the last value through SQLite's
bare column of ``max(step)``; the run table as each run's first time and last step, since
trackio keeps no table of runs). ``--no-trackio`` leaves it out.

Ratios are tracklake / the other reader; answers of the SQL readers are compared (rows,
as Python values). Timing starts after two untimed questions (the run table, the last
``k0`` per run) once no bundle builder has held its claim for 5 s: those questions may
start one, and DuckDB's glob of the bundles would read a set being rewritten. The
100,000-key run is benchmarks/wide_runs.py's.

Usage (from the repository root)::

    python benchmarks/read_cost.py                          # 100 and 1,000 runs
    python benchmarks/read_cost.py --sizes 10000            # 10,000 runs (a few minutes)
    python benchmarks/read_cost.py --root STORE             # an existing store as it is
    python benchmarks/read_cost.py --sizes 50 --steps 20 --repeat 2 --fresh-repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READERS = ("tracklake", "values", "parts", "bundles", "trackio")
#: What keeps a question from `metric_summaries`: asked so, it reads the values.
AS_WRITTEN = "WITH as_written AS (SELECT 1) "
#: The questions `metric_summaries` answers (the others are asked alike by both).
SUMMARY_QUESTIONS = ("last k0 per run", "max k3 per run")
QUESTIONS = ("last k0 per run", "max k3 per run", "one run's k5", "tracklake runs")
_SQL = {
    "last k0 per run": "SELECT run, arg_max(value, step) AS last FROM {src} WHERE key = 'k0' "
                       "GROUP BY run ORDER BY run",
    "max k3 per run": "SELECT run, max(value) AS max FROM {src} WHERE key = 'k3' "
                      "GROUP BY run ORDER BY run",
    "one run's k5": "SELECT step, value FROM {src} WHERE run = '{run}' AND key = 'k5' "
                    "ORDER BY step",
}
#: What `tracklake runs` shows, from the files: each run's attempts and its last step.
_RUNS_SQL = (
    "SELECT a.project, a.run, a.status, a.started_at, s.last_step "
    "FROM read_json('{root}/runs/**/*.json', columns = {{project: 'VARCHAR', run: 'VARCHAR', "
    "rank: 'INTEGER', attempt: 'INTEGER', status: 'VARCHAR', started_at: 'TIMESTAMPTZ'}}) a "
    "LEFT JOIN (SELECT project, run, max(step) AS last_step FROM {src} GROUP BY ALL) s "
    "USING (project, run) ORDER BY a.started_at DESC LIMIT 50")
#: The same questions over trackio's database (``many.db``: a row per logged step).
_TRACKIO_SQL = {
    "last k0 per run": "SELECT run, last FROM (SELECT run_name AS run, "
                       "json_extract(metrics, '$.k0') AS last, max(step) FROM metrics "
                       "GROUP BY run_name) ORDER BY run",
    "max k3 per run": "SELECT run_name AS run, max(json_extract(metrics, '$.k3')) AS max "
                      "FROM metrics GROUP BY run_name ORDER BY run",
    "one run's k5": "SELECT step, json_extract(metrics, '$.k5') AS value FROM metrics "
                    "WHERE run_name = '{run}' ORDER BY step",
    "tracklake runs": "SELECT run_name AS run, min(timestamp) AS started_at, "
                      "max(step) AS last_step FROM metrics GROUP BY run_name "
                      "ORDER BY started_at DESC LIMIT 50",
}


def source(root: Path, reader: str) -> str:
    if reader in ("tracklake", "values"):
        return "metrics"
    if reader == "parts":
        return f"read_parquet('{root}/metrics/**/*.parquet', hive_partitioning = true)"
    return f"read_parquet('{root}/.cache/bundles/bundle-*.parquet')"


def middle_run(root: Path) -> str:
    runs = sorted(p.name.removeprefix("run=") for p in root.glob("metrics/project=*/run=*"))
    return runs[len(runs) // 2]


def trackio_db(root: Path) -> Path:
    """Where the trackio store built beside `root` keeps its database."""
    return root.parent / "trackio" / f"{PROJECT}.db"


def sql_of(root: Path, reader: str, question: str, run: str) -> str:
    if reader == "trackio":
        return _TRACKIO_SQL[question].format(run=run)
    src = source(root, reader)
    if reader == "parts" and question == "one run's k5":
        # the files tracklake reads for it: that run's parts, found by their directory
        src = f"read_parquet('{root}/metrics/project=*/run={run}/**/*.parquet', " \
              "hive_partitioning = true)"
    if question == "tracklake runs":
        return _RUNS_SQL.format(root=root, src=src)
    as_written = reader == "values" and question in SUMMARY_QUESTIONS
    return (AS_WRITTEN if as_written else "") + _SQL[question].format(src=src, run=run)


# -- one reader's questions in a fresh process (this script run with --child) ----------


def duckdb_asker(sql: str, tables: dict[str, Any] | None = None
                 ) -> Callable[[], list[dict[str, Any]]]:
    """A function asking DuckDB `sql` (2 threads) and giving its rows as dicts: one
    in-memory database, opened by the first question, and a new connection to it per
    question, as tracklake keeps one; `tables` (Arrow tables by name) are registered on
    each connection."""
    import duckdb

    kept: list[Any] = []

    def ask() -> list[dict[str, Any]]:
        if not kept:  # the first question opens the database
            kept.append(duckdb.connect())
            kept[0].execute("SET threads = 2")
        con = kept[0].cursor()
        try:
            for name, table in (tables or {}).items():
                con.register(name, table)
            cursor = con.execute(sql)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            con.close()
    return ask


def _child(reader: str, root: Path, question: str, run: str, repeat: int) -> None:
    """Print, as JSON, the import time, the first and the warm times of `question`."""
    started = time.perf_counter()
    if reader in ("tracklake", "values"):
        import tracklake

        if question == "tracklake runs":
            import contextlib
            import io

            from tracklake._cli.run_list import print_runs

            def ask() -> Any:
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    print_runs(root, None, (), tracklake.ReadProblems())
                return out.getvalue().count("\n")
        else:
            sql = sql_of(root, reader, question, run)

            def ask() -> Any:
                return tracklake.query(sql, root=root).to_pylist()
    elif reader == "trackio":
        import sqlite3

        sql, db = sql_of(root, reader, question, run), trackio_db(root)

        def ask() -> Any:
            con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
            try:
                cursor = con.execute(sql)
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
                return len(rows) if question == "tracklake runs" else rows
            finally:
                con.close()
    else:
        ask = duckdb_asker(sql_of(root, reader, question, run))
    imported = time.perf_counter()
    answer = ask()
    first = time.perf_counter() - imported
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ask()
        times.append(time.perf_counter() - t0)
    rows = answer if isinstance(answer, int) else len(answer)
    print(json.dumps({"import_s": imported - started, "first_s": first,
                      "warm_s": statistics.median(times), "rows": rows,
                      "answer": None if isinstance(answer, int) else repr(answer)}))


def after_import(reader: str, root: Path, question: str, run: str, repeat: int
                 ) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", reader, str(root), question,
                          run, str(repeat)], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_argv(reader: str, root: Path, question: str, run: str) -> list[str]:
    if reader in ("tracklake", "values"):
        cli = [sys.executable, "-m", "tracklake._cli.main"]
        args = ["runs"] if question == "tracklake runs" else \
            ["sql", sql_of(root, reader, question, run)]
        return [*cli, *args, "--root", str(root)]
    if reader == "trackio":
        code = ("import sqlite3, sys; con = sqlite3.connect(sys.argv[2], uri=True); "
                "print(con.execute(sys.argv[1]).fetchall()[:3])")
        return [sys.executable, "-c", code, sql_of(root, reader, question, run),
                f"{trackio_db(root).as_uri()}?mode=ro"]
    code = ("import duckdb, sys; con = duckdb.connect(); con.execute('SET threads = 2'); "
            "print(con.execute(sys.argv[1]).fetchall()[:3])")
    return [sys.executable, "-c", code, sql_of(root, reader, question, run)]


def whole_process(readers: tuple[str, ...], root: Path, question: str, run: str,
                  repeat: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds per reader, a fresh process each, readers interleaved."""
    walls: dict[str, list[float]] = {r: [] for r in readers}
    cpus: dict[str, list[float]] = {r: [] for r in readers}
    for _ in range(repeat):
        for reader in readers:
            argv = process_argv(reader, root, question, run)
            started, cpu = time.perf_counter(), _cpu()
            subprocess.run(argv, capture_output=True, check=True)
            walls[reader].append(time.perf_counter() - started)
            cpus[reader].append(_cpu() - cpu)
    return {r: (statistics.median(walls[r]), statistics.median(cpus[r])) for r in readers}


# -- the stores -------------------------------------------------------------------------

PROJECT = "many"  # many_runs.py's


def _trackio_child(folder: Path, runs: int, steps: int) -> None:
    """In trackio's interpreter (TRACKIO_DIR=`folder`): many_runs.py's values, its run
    names and project, logged through trackio."""
    import numpy as np
    import trackio

    keys = [f"k{i}" for i in range(16)]
    for i in range(runs):
        rows = np.random.default_rng([20261201, i]).random((steps, len(keys))).tolist()
        trackio.init(project=PROJECT, name=f"run-{i:05d}", auto_log_cpu=False,
                     auto_log_gpu=False)
        for step, row in enumerate(rows):
            trackio.log(dict(zip(keys, row, strict=True)), step=step)
        trackio.finish()


def build_trackio(root: Path, runs: int, steps: int, python: str) -> None:
    """The trackio store beside `root` (`trackio_db`), unless it is there."""
    folder = trackio_db(root).parent
    if (folder / "written").exists():
        return
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    started = time.perf_counter()
    subprocess.run([python, __file__, "--trackio-child", str(folder), str(runs), str(steps)],
                   env={**os.environ, "TRACKIO_DIR": str(folder)}, check=True,
                   stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    (folder / "written").write_text(f"{seconds:.1f}\n")
    print(f"  trackio: {runs:,} runs written in {seconds:.1f} s", flush=True)


def build(base: Path, runs: int, steps: int, jobs: int, rebuild: bool) -> Path:
    """A store of `runs` runs built by many_runs.py's builder, then compacted once."""
    sys.path.insert(0, str(Path(__file__).parent))
    import many_runs

    root: Path = many_runs.build(base, runs, steps, jobs, rebuild)
    marker = root.parent / "compacted"
    if not marker.exists():
        import tracklake

        started = time.perf_counter()
        tracklake.compact(root=root)
        seconds = time.perf_counter() - started
        marker.write_text(f"{seconds:.1f}\n")
        print(f"  compacted in {seconds:.1f} s", flush=True)
    return root


def measure(root: Path, repeat: int, fresh_repeat: int) -> list[dict[str, Any]]:
    run = middle_run(root)
    # the catalog and bundles as a user meets them after a first question or two
    for question in ("tracklake runs", "last k0 per run"):
        subprocess.run(process_argv("tracklake", root, question, run),
                       capture_output=True, check=True)
    _wait_for_bundle_builder(root)
    readers = tuple(r for r in READERS
                    if (r != "bundles" or any(root.glob(".cache/bundles/bundle-*.parquet")))
                    and (r != "trackio" or trackio_db(root).exists()))
    rows = []
    for question in QUESTIONS:
        row: dict[str, Any] = {"question": question}
        for reader in readers:
            row[reader] = after_import(reader, root, question, run, repeat)
        row["process"] = whole_process(readers, root, question, run, fresh_repeat)
        answers = {row[r]["answer"] for r in readers}
        row["same"] = "-" if question == "tracklake runs" else \
            "yes" if len(answers) == 1 else f"NO: {len(answers)} answers"
        for reader in readers:
            row[reader].pop("answer")
        rows.append(row)
    return rows


def _wait_for_bundle_builder(root: Path, quiet_s: float = 5.0, most_s: float = 600.0
                             ) -> None:
    """Wait until neither a bundle builder (one the question above may have started) nor
    the deriver a finished run started (which builds again up to `BUILD_EVERY_SECONDS`
    after compaction's build) has held its claim for `quiet_s`: DuckDB's glob of the
    bundles would read a set being rewritten, and answer from part of it."""
    from tracklake._ops.claims import COMPACTING, DERIVING

    claims = [root / ".cache" / "bundles" / name for name in (COMPACTING, DERIVING)]
    started = quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s and time.monotonic() - started < most_s:
        time.sleep(0.5)
        if any(claim.exists() for claim in claims):
            quiet_since = time.monotonic()


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "-"


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    readers = [r for r in READERS if r in rows[0]]
    print(f"\n{title}")
    print("  after import (seconds, first question / median warm):")
    head = "".join(f"{r:>16}" for r in readers)
    ratios = "".join(f"{'warm/' + r:>14}" for r in readers[1:])
    print(f"  {'question':<16}{head}{ratios}  same")
    for row in rows:
        cells = "".join(f"{row[r]['first_s']:7.3f} /{row[r]['warm_s']:7.3f}" for r in readers)
        ratio = "".join(f"{_ratio(row['tracklake']['warm_s'], row[r]['warm_s']):>14}"
                        for r in readers[1:])
        print(f"  {row['question']:<16}{cells}{ratio}  {row['same']}")
    print("  whole process (seconds, wall / CPU):")
    walls = "".join(f"{'wall/' + r:>14}" for r in readers[1:])
    print(f"  {'question':<16}{head}{walls}")
    for row in rows:
        p = row["process"]
        cells = "".join(f"{p[r][0]:7.2f} /{p[r][1]:7.2f}" for r in readers)
        ratio = "".join(f"{_ratio(p['tracklake'][0], p[r][0]):>14}" for r in readers[1:])
        print(f"  {row['question']:<16}{cells}{ratio}")


def main() -> None:
    # the readers' processes as users' installs run them: their bytecode cached (with it
    # unwritten, each fresh process compiles whatever tracklake modules changed)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if len(sys.argv) > 1 and sys.argv[1] == "--trackio-child":
        _trackio_child(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        reader, root, question, run, repeat = sys.argv[2:7]
        _child(reader, Path(root), question, run, int(repeat))
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000",
                        help="Comma-separated numbers of runs (10000: a few minutes to build).")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5,
                        help="Warm questions after the first, in one process.")
    parser.add_argument("--fresh-repeat", type=int, default=3,
                        help="Fresh processes per reader and question.")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/tracklake-read-cost"))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--root", type=Path, help="Only time this existing store as it is.")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--trackio-python", default="/tmp/trackio-venv/bin/python",
                        help="An interpreter with trackio (made as a venv when missing).")
    parser.add_argument("--no-trackio", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if args.root is not None:
        results[str(args.root)] = rows = measure(args.root, args.repeat, args.fresh_repeat)
        print_rows(str(args.root), rows)
    for size in ([] if args.root else [int(s) for s in args.sizes.split(",")]):
        root = build(args.data_dir, size, args.steps, args.jobs, args.rebuild)
        if not args.no_trackio:
            sys.path.insert(0, str(Path(__file__).parent))
            from dashboard import trackio_python

            build_trackio(root, size, args.steps, trackio_python(args.trackio_python))
        results[str(size)] = rows = measure(root, args.repeat, args.fresh_repeat)
        print_rows(f"{size:,} runs x {args.steps} steps x 16 keys, compacted ({root})", rows)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
