#!/usr/bin/env python
"""What DuckDB's Python API costs a question about one run, by the way it is asked.

A question about one run is answered on a kept connection whose `metrics` view reads
a table of the run's rows (`kept_connections`); what is left of its time is DuckDB's
cost per statement more than the rows. This asks the same question of such a table
(one run's parts read with ``hive_partitioning``, copied into a TEMP table, a view over
it) in the ways the read path could, interleaved in rounds (``--rounds``; each way
asked ``--repeat`` times a round, the median kept; the median of the rounds printed, in
milliseconds):

- ``sql(text)``       ``con.sql(text).to_arrow_table()``: DuckDB parses the text, binds
                      the relation, then parses and binds it again to run it
- ``sql(parsed)``     the same given the statement DuckDB's parser gave once
                      (`readonly.parsed_statements`): no parse of the text at each ask
- ``execute arrow``   ``con.execute(parsed)`` then the connection's ``to_arrow_table()``:
                      bound once, but DuckDB 2.0 warns at each call (an extra copy), which
                      a caller running with warnings as errors gets as an error; its
                      warning is ignored here
- ``execute rows``    ``con.execute(text).fetchall()``: rows as Python tuples, as the
                      benchmarks' DuckDB readers take them (no Arrow answer)
- ``SELECT 1``        ``con.sql("SELECT 1").to_arrow_table()``: the floor of a statement
- ``parts``           ``con.execute(...).fetchall()`` of the same question over the run's
                      parts by ``read_parquet`` (the DuckDB side of ``read_cost.py``)

Usage (a store built by ``benchmarks/read_cost.py``)::

    python benchmarks/statement_cost.py --root /tmp/readcost-bench/runs-10000-steps-200/store
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from read_cost import middle_run


def ways(root: Path, run: str) -> dict[str, Callable[[], Any]]:
    import duckdb

    parts = f"read_parquet('{root}/metrics/project=*/run={run}/**/*.parquet', " \
            "hive_partitioning = true)"
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute(f"CREATE TEMP TABLE metrics_all AS SELECT * FROM {parts}")
    con.execute("CREATE TEMP VIEW metrics AS SELECT * FROM metrics_all")
    question = f"SELECT step, value FROM metrics WHERE run = '{run}' AND key = 'k5' " \
               "ORDER BY step"
    [parsed] = con.extract_statements(question)
    over_parts = question.replace("FROM metrics", f"FROM {parts}")

    def execute_arrow() -> Any:
        con.execute(parsed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return con.to_arrow_table()

    return {
        "sql(text)": lambda: con.sql(question).to_arrow_table(),
        "sql(parsed)": lambda: con.sql(parsed).to_arrow_table(),
        "execute arrow": execute_arrow,
        "execute rows": lambda: con.execute(question).fetchall(),
        "SELECT 1": lambda: con.sql("SELECT 1").to_arrow_table(),
        "parts": lambda: con.execute(over_parts).fetchall(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    run = middle_run(args.root)
    asked = ways(args.root, run)
    rounds: dict[str, list[float]] = {name: [] for name in asked}
    for _ in range(args.rounds):
        for name, ask in asked.items():
            ask()  # untimed: the first of a round
            took = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                ask()
                took.append(time.perf_counter() - started)
            rounds[name].append(statistics.median(took))
    print(f"one run's k5 ({run}) on {args.root}: median of {args.rounds} rounds, ms")
    for name, medians in rounds.items():
        print(f"  {name:<14} {statistics.median(medians) * 1000:7.3f}")


if __name__ == "__main__":
    main()
