"""The run catalog brought up to date one file at a time, for a bundle builder
(`bundle.build_bundles`), and what bundling needs of every settled run, as columns.

A builder's pass over a store of 420,561 tiny runs held 4.1 GB with nothing new to
catalog (the whole catalog, every run's watched paths and parts as Python objects) and
19 KB a run not catalogued yet. Here it lists the store's run names once (as Arrow
strings, 15 B a run), then for each of the catalog's `SHARDS` files reads that file
alone, `stat`s its runs' paths, reads the runs of that shard it does not vouch for from
their files and writes the file back (`Snapshot` with `Scope.shard`): it holds one
shard's runs at a time (1/64 of a backlog), and of the settled runs only `SETTLED`'s
columns (a run's name, its part paths and their mtimes, and how many values they hold).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format.columns import booleans, combined, fixed, numpy_of, strings
from tracklake._format.schema import empty_table
from tracklake._read.catalog_shards import SHARDS, shard_file, shard_of
from tracklake._read.location import is_url, names_at_by, subdirs_at
from tracklake._read.scope import Scope
from tracklake._read.snapshot import Snapshot

#: What `settled_runs` gives of each settled run.
SETTLED = pa.schema([("project", pa.string()), ("run", pa.string()),
                     ("parts", pa.list_(pa.string())), ("mtimes", pa.list_(pa.int64())),
                     ("values", pa.int64())])
#: Run names listed at a time.
_LISTED_AT = 1 << 16
#: The kinds whose directories name a store's runs.
_RUN_DIRS = ("runs", "metrics")


def settled_runs(root: Path, progress: Callable[[], None]) -> tuple[pa.Table, int]:
    """Catalog the store's settled runs not catalogued yet, a catalog file at a time
    (dropping the entries of runs changed or gone); `SETTLED` rows of every run the
    catalog then vouches for, and how many runs the store's directories name.
    `progress()` is called after each file."""
    if is_url(root):
        return empty_table(SETTLED), 0
    projects, runs = _store_runs(root)
    shards = np.fromiter(map(shard_of, runs.to_pylist()), dtype=np.int16, count=len(runs))
    found = []
    for shard in range(SHARDS):
        mine = booleans(shards == shard)
        names = frozenset(zip(projects.filter(mine).to_pylist(),
                              runs.filter(mine).to_pylist(), strict=True))
        if not names and not os.path.lexists(root / shard_file(shard)):
            continue  # no run and no entry (a small store: most of the files)
        snapshot = Snapshot(root, scope=Scope(frozenset({"metrics"}), attempts=False,
                                              metric_values=False, runs=names, shard=shard))
        if snapshot.catalog is not None:
            found.append(_settled_columns(snapshot.catalog.settled_table()))
        progress()
    return pa.concat_tables(found) if found else empty_table(SETTLED), len(runs)


def _store_runs(root: Path) -> tuple[pa.Array, pa.Array]:
    """(projects, runs): every run a directory under ``runs/`` or ``metrics/`` names,
    once, as Arrow strings."""
    by_project: dict[str, list[pa.Array]] = {}
    for kind in _RUN_DIRS:
        try:
            listed = subdirs_at(root, kind)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in listed:
            if not name.startswith("project="):
                continue
            held = by_project.setdefault(name[len("project="):], [])
            try:
                held.extend(pc.utf8_slice_codeunits(strings(batch), 4) for batch in
                            names_at_by(root, f"{kind}/{name}", "run=", _LISTED_AT))
            except (FileNotFoundError, NotADirectoryError):
                continue
    runs = [pc.unique(pa.concat_arrays(held)) for held in by_project.values() if held]
    projects = [strings([p] * len(r)) for p, r in zip(
        (p for p, held in by_project.items() if held), runs, strict=True)]
    if not runs:
        return strings([]), strings([])
    return pa.concat_arrays(projects), pa.concat_arrays(runs)


def _settled_columns(rows: pa.Table) -> pa.Table:
    """`SETTLED` of catalog entries: each part's mtime is the one its entry watched."""
    parts = combined(rows.column("parts"))
    offsets = numpy_of(parts.offsets)
    offsets = offsets - offsets[0]
    paths = parts.flatten().field("path")
    watched = combined(rows.column("watched")).flatten()
    mtimes = watched.field("mtime_ns").take(
        pc.index_in(paths, value_set=watched.field("path")))
    summaries = combined(rows.column("summaries"))
    counts = np.concatenate([[0], np.cumsum(numpy_of(
        summaries.flatten().field("count"), null=0).astype(np.int64))])
    bounds = numpy_of(summaries.offsets)
    bounds = bounds - bounds[0]
    as_offsets = fixed(offsets, pa.int32())
    return pa.Table.from_arrays([
        combined(rows.column("project")), combined(rows.column("run")),
        pa.ListArray.from_arrays(as_offsets, paths),
        pa.ListArray.from_arrays(as_offsets, mtimes),
        fixed(counts[bounds[1:]] - counts[bounds[:-1]], pa.int64())], schema=SETTLED)
