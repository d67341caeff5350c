#!/usr/bin/env python
"""Where the milliseconds of one warm `tracklake.query` go.

In one process, after ``--warmup`` untimed questions (the first pays the imports:
duckdb, pyarrow.dataset and, with pyarrow 25, pandas), ``--repeat`` questions are timed
with ``time.perf_counter`` spans around the phases of the read path, each span the
median over the questions, in milliseconds:

- ``query``            the whole `tracklake.query(sql, root=ROOT)` call
- ``snapshot``         listing what the question's scope reaches (`Snapshot`), of which:
  ``catalog load`` (reading the run catalog file), ``catalog settled`` (one `stat` per
  watched path: the catalog's validation), ``catalog rows`` (parts, summaries, attempts
  out of it), ``stream listing`` (runs not catalogued), ``bundles usable`` (bundle
  footers read and checked against the catalog), ``attempt files`` (runs not
  catalogued), ``caches saved``
- ``connect rest``     the DuckDB side of connecting: `duckdb.connect`, registering the
                       tables and datasets, creating the views, locking the connection
- ``execute``          running the statement and building its Arrow answer
- ``close``            closing the connection (frees the datasets)

Spans wrap the functions by name (module attributes), so they cost a few microseconds
each; the sum is checked against ``query``. With ``--cprofile``, the same questions run
again under cProfile inside the read worker's thread and the top functions by
cumulative time are printed.

Usage (from the repository root; a store built by ``benchmarks/read_cost.py``)::

    python benchmarks/read_profile.py --root /tmp/tracklake-read-cost/runs-1000-steps-200/store
    python benchmarks/read_profile.py --root STORE --question "one run's k5" --cprofile
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from read_cost import QUESTIONS, middle_run, sql_of

_spans: dict[str, float] = defaultdict(float)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _spans[name] += time.perf_counter() - started
    return wrapper


def _wrap(owner: Any, attr: str, name: str) -> None:
    setattr(owner, attr, _timed(name, getattr(owner, attr)))


def instrument() -> None:
    """Spans around the read path's phases (see the module docstring)."""
    import duckdb

    from tracklake._read import catalog, catalog_shards, decoded, query, snapshot

    _wrap(query, "_connect", "connect")
    _wrap(query, "Snapshot", "snapshot")
    _wrap(query, "_execute", "execute")
    _wrap(catalog_shards, "load", "catalog load")
    _wrap(catalog.RunCatalog, "settled", "catalog settled")
    for method in ("parts", "part_mtimes", "summaries", "attempts"):
        _wrap(catalog.RunCatalog, method, "catalog rows")
    _wrap(catalog.RunCatalog, "save", "caches saved")
    _wrap(decoded.DecodedCache, "save", "caches saved")
    _wrap(snapshot, "stream_dirs", "stream listing")
    _wrap(snapshot, "usable", "bundles usable")
    _wrap(snapshot, "runs_from", "attempt files")
    _wrap(duckdb, "connect", "duckdb.connect")

    closing = query._with_connection

    def with_close(root_path: Path, problems: Any, work: Any, scope: Any) -> Any:
        # `close` is the time between the answer and the return (the `finally` closing
        # the connection)
        def timed_work(con: Any) -> Any:
            result = work(con)
            _spans["_answered"] = time.perf_counter()
            return result
        result = closing(root_path, problems, timed_work, scope)
        _spans["close"] += time.perf_counter() - _spans.pop("_answered")
        return result
    query._with_connection = with_close  # type: ignore[assignment]


_ROWS = (("query", 0), ("connect", 1), ("snapshot", 2), ("catalog load", 3),
         ("catalog settled", 3), ("catalog rows", 3), ("stream listing", 3),
         ("bundles usable", 3), ("attempt files", 3), ("caches saved", 3),
         ("snapshot rest", 3), ("connect rest", 2), ("duckdb.connect", 3),
         ("execute", 1), ("close", 1), ("query rest", 1))


def profile(root: Path, sql: str, warmup: int, repeat: int) -> dict[str, float]:
    import tracklake

    instrument()
    for _ in range(warmup):
        tracklake.query(sql, root=root)
    per: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        _spans.clear()
        started = time.perf_counter()
        tracklake.query(sql, root=root)
        _spans["query"] = time.perf_counter() - started
        spans = dict(_spans)
        inner = ("catalog load", "catalog settled", "catalog rows", "stream listing",
                 "bundles usable", "attempt files", "caches saved")
        spans["snapshot rest"] = spans["snapshot"] - sum(spans.get(n, 0.0) for n in inner)
        spans["connect rest"] = spans["connect"] - spans["snapshot"]
        spans["query rest"] = spans["query"] - spans["connect"] - spans["execute"] - \
            spans["close"]
        for name, _ in _ROWS:
            per[name].append(spans.get(name, 0.0))
    return {name: statistics.median(values) * 1000 for name, values in per.items()}


def cprofile(root: Path, sql: str, warmup: int, repeat: int, top: int) -> None:
    """The questions under cProfile, enabled inside the read worker's thread, after
    `warmup` unprofiled ones."""
    import cProfile
    import pstats

    import tracklake
    from tracklake._read import query

    for _ in range(warmup):
        tracklake.query(sql, root=root)

    profiler = cProfile.Profile()
    inner = query._connect

    def profiled(*args: Any, **kwargs: Any) -> Any:
        # the connection and the statement both run in the worker thread
        profiler.enable()
        return inner(*args, **kwargs)
    query._connect = profiled  # type: ignore[assignment]
    executing = query._execute

    def execute(*args: Any, **kwargs: Any) -> Any:
        try:
            return executing(*args, **kwargs)
        finally:
            profiler.disable()
    query._execute = execute  # type: ignore[assignment]
    for _ in range(repeat):
        tracklake.query(sql, root=root)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--question", choices=QUESTIONS[:3], default=QUESTIONS[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--sql", help="Profile this statement instead of --question.")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    sql = args.sql or sql_of(args.root, "tracklake", args.question, middle_run(args.root))
    if args.cprofile:
        cprofile(args.root, sql, args.warmup, args.repeat, args.top)
        return
    spans = profile(args.root, sql, args.warmup, args.repeat)
    print(f"{args.sql or args.question} on {args.root}: median of {args.repeat} warm "
          "questions, ms")
    for name, depth in _ROWS:
        print(f"  {'  ' * depth}{name:<{22 - 2 * depth}} {spans[name]:8.2f}")


if __name__ == "__main__":
    main()
