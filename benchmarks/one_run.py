#!/usr/bin/env python
"""One run's history of one key, warm, beside DuckDB over the same files.

In one process: `tracklake.query` of ``step, value WHERE run = RUN AND key = 'k5'`` (RUN
is the run in the middle of the store, as in benchmarks/read_cost.py) against DuckDB's
own ``read_parquet`` of that run's parts (``ROOT/metrics/project=*/run=RUN/**/*.parquet``)
on a database kept open, a new connection per question, as tracklake keeps one. Both
answers are made Python rows and compared first. After ``--warmup`` untimed questions, the
median of ``--repeat`` in milliseconds, and the ratio.

A third reader gives the floor under any reader that hands DuckDB rows it has read and
verified itself: the same question over the run's rows already in memory (the parts read
once, before timing, into one Arrow table with a ``run`` column), registered on a new
connection per question and asked, its answer made Python rows. No reading, no
verification, no listing: only DuckDB's own cost for a registered table.

To compare two versions of the code, run it again with ``PYTHONPATH`` at a directory
where ``tracklake`` is a link to the other checkout's ``store/``; the first word printed
is the directory tracklake was imported from.

Usage (a store built by benchmarks/read_cost.py)::

    python benchmarks/one_run.py --root /tmp/tracklake-read-cost/runs-1000-steps-200/store
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from read_cost import duckdb_asker, middle_run, sql_of

QUESTION = "one run's k5"


def _median_ms(ask: Callable[[], Any], warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        ask()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        ask()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    import tracklake

    root = args.root
    run = middle_run(root)
    ours = sql_of(root, "tracklake", QUESTION, run)

    def tracklake_rows() -> list[dict[str, Any]]:
        return tracklake.query(ours, root=root).to_pylist()

    duckdb_rows = duckdb_asker(sql_of(root, "parts", QUESTION, run))
    in_memory_rows = _in_memory_asker(root, run)
    if not tracklake_rows() == duckdb_rows() == in_memory_rows():
        raise SystemExit("the answers differ")
    mine = _median_ms(tracklake_rows, args.warmup, args.repeat)
    duck = _median_ms(duckdb_rows, args.warmup, args.repeat)
    floor = _median_ms(in_memory_rows, args.warmup, args.repeat)
    print(f"{Path(tracklake.__file__).parent.parent.name}: tracklake {mine:.2f} ms, DuckDB "
          f"over the run's parts {duck:.2f} ms, ratio {mine / duck:.2f}; DuckDB over the "
          f"run's rows in memory {floor:.2f} ms ({floor / duck:.2f} of the parts')")


def _in_memory_asker(root: Path, run: str) -> Callable[[], list[dict[str, Any]]]:
    """The question over `run`'s rows read once into one Arrow table, registered on a new
    connection of one kept database per question."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted(root.glob(f"metrics/project=*/run={run}/**/*.parquet"))
    table = pa.concat_tables([pq.read_table(p).replace_schema_metadata(None) for p in parts])
    table = table.append_column("run", pa.array([run] * table.num_rows, pa.string()))
    return duckdb_asker(_SQL_IN_MEMORY.format(run=run), {"rows": table})


_SQL_IN_MEMORY = "SELECT step, value FROM rows WHERE run = '{run}' AND key = 'k5' ORDER BY step"


if __name__ == "__main__":
    main()
