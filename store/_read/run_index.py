"""How many runs a store holds and which are the newest, holding a few bytes a run rather
than every run's catalog entry: what `tracklake runs` needs before it reads the runs it
shows (`Scope.runs`).

The run catalog's files are read one at a time, only the columns the runs view needs
(each run's attempts and watched paths); an entry counts while its paths under ``runs/``
have the mtimes recorded (what the runs view alone checks, `RunCatalog.settled`), in a
project a listing finds; the runs the catalog does not vouch for are read from their
attempt files. Of each attempt only its project, run and start are kept, and DuckDB
counts the runs and orders them by their first start as the `runs` view does, so the
count and the runs shown are those of ``SELECT ... FROM runs ORDER BY started_at DESC``.

Where the catalog vouches for no more runs than are shown, or leaves more than
`FRESH_AT_MOST` to read (a store whose catalog is not written yet, many runs live at
once), or cannot be used (mtimes not trusted, a store in an object store): None, and the
caller reads every run, which catalogs the settled ones for the next question.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format.attempt import read_attempt
from tracklake._format.columns import (
    booleans,
    combined,
    fixed,
    numpy_of,
    rows_table,
    scalar_of,
    strings,
)
from tracklake._read import catalog_shards
from tracklake._read.catalog import _SCHEMA, mtimes_trusted
from tracklake._read.decoded import DecodedCache
from tracklake._read.listing import names_in
from tracklake._read.location import is_url, subdirs_at
from tracklake._read.mtimes import ABSENT, mtimes_of
from tracklake._read.reader import runs_from
from tracklake._read.readonly import question_connection

#: Runs read from their attempt files at most; a store with more that its catalog does
#: not vouch for is read whole (`None`), which catalogs those that settled.
FRESH_AT_MOST = 256
#: The catalog's columns read: a run's attempts, and the paths that vouch for them.
_COLUMNS = ["project", "run", "watched", "attempts"]
_STARTS = pa.schema([("project", pa.string()), ("run", pa.string()),
                     ("started_at", pa.string())])


@dataclass(frozen=True)
class NewestRuns:
    """The runs of a store (of one project) with at least one attempt: how many, and the
    newest ones (project, run), newest first."""

    total: int
    newest: list[tuple[str, str]]


def newest_runs(root: Path, project: str | None, limit: int) -> NewestRuns | None:
    """The count of `root`'s runs (of `project`) and the newest `limit` of them, in the
    order of the runs view's first start (then project and run, descending); None where
    the catalog cannot answer for all but a few runs (see the module)."""
    if is_url(root) or not mtimes_trusted():
        return None
    projects = _listed(root, "runs")
    if project is not None:
        projects &= {project}
    starts: list[pa.Table] = []
    vouched: dict[str, list[pa.Array]] = {}
    for table in catalog_shards.each_shard(root, _SCHEMA, _COLUMNS):
        good = _vouched(root, table, projects)
        if not good.any():
            continue
        rows = table.filter(booleans(good))
        for name in pc.unique(rows.column("project")).to_pylist():
            vouched.setdefault(name, []).append(combined(rows.column("run")).filter(
                pc.equal(combined(rows.column("project")), scalar_of(name, pa.string()))))
        flat = combined(rows.column("attempts")).flatten()
        if len(flat):
            starts.append(pa.Table.from_struct_array(flat).select(_STARTS.names))
    if sum(len(a) for runs in vouched.values() for a in runs) <= limit:
        return None  # nothing to leave out: every run is read (and the settled catalogued)
    fresh = _fresh(root, projects, vouched)
    if fresh is None:
        return None
    cache = DecodedCache(root)
    read_runs = runs_from(root, None, None, lambda path: cache.get(path, read_attempt),
                          runs=fresh) if fresh else []
    cache.save(complete=False)
    starts.append(rows_table(_STARTS, [
        {"project": a["project"], "run": a["run"], "started_at": a.get("started_at")}
        for r in read_runs for a in r.attempts]))
    return _counted(pa.concat_tables(starts), project, limit)


def _listed(root: Path, kind: str) -> set[str]:
    """The projects with a real directory under `kind`."""
    try:
        names = subdirs_at(root, kind)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    return {n[len("project="):] for n in names if n.startswith("project=")}


def _vouched(root: Path, table: pa.Table, projects: set[str]) -> np.ndarray:
    """The rows of `table` (a catalog file's) of `projects` whose paths under ``runs/``
    all have the mtime recorded (one recorded absent only if the run has no attempt)."""
    inside = numpy_of(pc.is_in(table.column("project"), value_set=strings(sorted(projects))),
                      null=False)
    watched = combined(table.column("watched"))
    owner = numpy_of(pc.list_parent_indices(watched))
    paths = pc.list_flatten(watched).field("path")
    recorded = numpy_of(pc.list_flatten(watched).field("mtime_ns"))
    looked = np.flatnonzero(numpy_of(pc.starts_with(paths, "runs/")) & inside[owner])
    prefix = f"{os.path.abspath(root)}{os.sep}"
    found = mtimes_of([prefix + p for p in paths.take(fixed(looked, pa.int64())).to_pylist()])
    holds = numpy_of(pc.list_value_length(combined(table.column("attempts")))) > 0
    rec, own = recorded[looked], owner[looked]
    same = (found == rec) & ~((rec == ABSENT) & holds[own])
    good = inside.copy()
    good[own[~same]] = False
    return good


def _fresh(root: Path, projects: set[str], vouched: dict[str, list[pa.Array]]
           ) -> frozenset[tuple[str, str]] | None:
    """(project, run) of the names under ``runs/`` the catalog does not vouch for; None
    if there are more than `FRESH_AT_MOST`."""
    fresh: list[tuple[str, str]] = []
    for project in sorted(projects):
        # names alone (a run's directory is looked up when it is read: a link or a file
        # by a run's name is passed over there), which lists a million in C
        names = [n[len("run="):] for n in names_in(root, f"runs/project={project}")
                 if n.startswith("run=")]
        known = pa.concat_arrays(vouched[project]) if project in vouched else \
            strings([])
        left = ~numpy_of(pc.is_in(strings(names), value_set=known), null=False)
        fresh.extend((project, names[i]) for i in np.flatnonzero(left).tolist())
        if len(fresh) > FRESH_AT_MOST:
            return None
    return frozenset(fresh)


def _counted(starts: pa.Table, project: str | None, limit: int) -> NewestRuns:
    """The runs of `starts` (one row per attempt) counted and ordered as the runs view
    does, by DuckDB itself: the first start of each, cast to a timestamp as there."""
    con = question_connection()  # a cursor on the process's database, not one more
    try:
        con.register("_starts", starts)
        where = "WHERE project = $project" if project is not None else ""
        params: dict[str, Any] = {"project": project} if project is not None else {}
        con.execute(f"""CREATE TEMP TABLE _runs AS
            SELECT project, run, min(CAST(started_at AS TIMESTAMPTZ)) AS started_at
            FROM _starts {where} GROUP BY project, run""", params)
        total = con.execute("SELECT count(*) FROM _runs").fetchone()
        newest = con.execute(f"""SELECT project, run FROM _runs
            ORDER BY started_at DESC, project DESC, run DESC LIMIT {int(limit)}""").fetchall()
    finally:
        con.close()
    return NewestRuns(int(total[0]) if total else 0, [(p, r) for p, r in newest])
