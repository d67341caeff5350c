"""What the runs view needs of every run, holding a few bytes a run rather than every
run's catalog entry: how many runs a store holds and which are the newest (what
`tracklake runs` needs before it reads the runs it shows, `Scope.runs`), and the
attempts of every run (a process's first question on the runs view alone).

The run catalog's files are read a few at a time, only the columns the runs view needs
(each run's attempts and watched paths); an entry counts while its paths under ``runs/``
have the mtimes recorded (what the runs view alone checks, `RunCatalog.settled`), in a
project a listing finds; the runs the catalog does not vouch for are read from their
attempt files. For the newest runs, only each attempt's project, run and start are
kept, and DuckDB counts the runs and orders them by their first start as the `runs`
view does, so the count and the runs shown are those of ``SELECT ... FROM runs ORDER BY
started_at DESC``.

The runs the catalog does not vouch for are read from their attempt files however many
they are (a store whose catalog is not written yet, many runs live at once), `_READ_AT`
runs at a time, and never catalogued here: reading every file of 10,000 runs to catalog
them took 22 s and 385 MiB, their attempt files 2.4 s and 147 MiB. Where more than
`BUILD_MIN_RUNS` are left to read, a builder is started in the background to catalog
the settled ones (`bundles.start_builder`), so the next question finds them catalogued.
Where the store holds no more runs than are shown, or the catalog cannot be used (mtimes
not trusted, a store in an object store): None, and the caller reads every run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
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
    gathered,
    numpy_of,
    scalar_of,
    strings,
)
from tracklake._format.schema import empty_table
from tracklake._read import catalog_shards
from tracklake._read.attempt_rows import attempts_table
from tracklake._read.bundles import start_builder
from tracklake._read.catalog import _SCHEMA, mtimes_trusted
from tracklake._read.decoded import DecodedCache
from tracklake._read.location import count_names_at, is_url, names_at_by, subdirs_at
from tracklake._read.mtimes import ABSENT, mtimes_of
from tracklake._read.reader import runs_from
from tracklake._read.readonly import question_connection

#: Runs the catalog does not vouch for read through the decoded cache at most; more are
#: read without it (the cache would hold them all, and a builder catalogs them).
FRESH_AT_MOST = 256
#: Runs read from their attempt files at a time.
_READ_AT = 4096
#: Catalogued runs checked and vouched for together, read from as many catalog files as
#: hold them: a file holds too few (150 runs at 10,000) for the paths' `stat`s to be
#: shared by two threads (`mtimes_of`), or for the checks' fixed cost to be worth paying
#: per file (`catalog_shards.each_shard`).
_VOUCHED_AT = 1024
#: The catalog's columns read: a run's attempts, and the paths that vouch for them.
_COLUMNS = ["project", "run", "watched", "attempts"]
#: Stores whose runs view this process answered by `runs_view_attempts` once.
_streamed: set[str] = set()
#: Stores this process listed the newest runs of (`first_listing`).
_listed_once: set[str] = set()
_streamed_lock = threading.Lock()
#: Attempts' starts held before the newest are picked from them (`_Newest.pick`).
_PICK_AT = 1 << 16
#: Names of a project's runs held at once while those the catalog lacks are looked for.
_LISTED_AT = 1 << 16
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
    projects = _projects(root, project)
    newest = _Newest(project, limit)
    vouched: dict[str, list[pa.Array]] = {}
    for group in gathered(_starts(_catalogued(root, projects, vouched)), _PICK_AT):
        newest.pick(group)
    fresh = _fresh(root, projects, vouched)
    if sum(len(a) for runs in vouched.values() for a in runs) + len(fresh) <= limit:
        return None  # nothing to leave out: every run is read (and the settled catalogued)
    for group in gathered(_starts(_fresh_attempts(root, fresh)), _PICK_AT):
        newest.pick(group)
    return newest.counted()


def first_listing(root: Path) -> bool:
    """Whether this is the process's first listing of `root`'s newest runs (noted as
    asked). A process that lists again (a notebook, a script's loop) had better keep
    the catalog whole, as the runs view's second question does, and be told of changes
    by the directory watch than `stat` three paths a run at each listing (`catalog`)."""
    key = str(root)
    with _streamed_lock:
        if key in _listed_once:
            return False
        _listed_once.add(key)
        return True


def _starts(attempts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    return (rows.select(_STARTS.names) for rows in attempts)


def runs_view_attempts(root: Path, project: str | None) -> Iterator[pa.Table] | None:
    """Every attempt of `root`'s runs (of `project`), as `run_attempts` rows with their
    statuses as recorded, a group of runs at a time (every attempt of a run in one): those
    the catalog vouches for from its files read a few at a time (a question on the runs
    view holds its rows, not every run's catalog entry), then the others, read from
    their attempt files, as many as they are (a question on the runs view alone never
    catalogs them). None where the catalog cannot be used."""
    if is_url(root) or not mtimes_trusted():
        return None
    return _each_group(root, _projects(root, project))


def _each_group(root: Path, projects: set[str]) -> Iterator[pa.Table]:
    vouched: dict[str, list[pa.Array]] = {}
    yield from _catalogued(root, projects, vouched)
    yield from _fresh_attempts(root, _fresh(root, projects, vouched))


def runs_view_streamed(root: Path) -> bool:
    """Whether a question on the runs view alone is answered by `runs_view_attempts`:
    the first of a process on `root` that keeps no catalog of it (a command that asks
    once holds a few hundred bytes a run instead of every run's entry); the next loads
    the catalog whole and keeps it, as a process asking again wants (`catalog_shards`)."""
    key = str(root)
    with _streamed_lock:
        if key in _streamed or catalog_shards.keeps_whole(root):
            return False
        _streamed.add(key)
        return True


def _projects(root: Path, project: str | None) -> set[str]:
    """The projects a question reaches: with a real directory under ``runs/``."""
    projects = _listed(root, "runs")
    return projects & {project} if project is not None else projects


def _catalogued(root: Path, projects: set[str], vouched: dict[str, list[pa.Array]]
                ) -> Iterator[pa.Table]:
    """The attempts (`ATTEMPTS_SCHEMA` rows: a run's are all in its file) of the runs of
    `projects` the catalog vouches for, its files read, checked and vouched for
    `_VOUCHED_AT` runs at a time; their names, by project, added to `vouched` as they
    come."""
    for table in catalog_shards.each_shard(root, _SCHEMA, _COLUMNS, _VOUCHED_AT):
        good = _vouched(root, table, projects)
        if not good.any():
            continue
        # (a table of lists of structs filtered costs 1 ms a catalog file at 10,000 runs)
        rows = table.select(["project", "run", "attempts"])
        if not good.all():
            rows = rows.filter(booleans(good))
        for name in pc.unique(rows.column("project")).to_pylist():
            vouched.setdefault(name, []).append(combined(rows.column("run")).filter(
                pc.equal(combined(rows.column("project")), scalar_of(name, pa.string()))))
        flat = combined(rows.column("attempts")).flatten()
        if len(flat):
            yield pa.Table.from_struct_array(flat)


def _fresh_attempts(root: Path, fresh: list[tuple[str, str]]) -> Iterator[pa.Table]:
    """The attempts of the runs `fresh`, read from their files `_READ_AT` runs
    at a time (every attempt of a run in one table), through the decoded cache if they
    are at most `FRESH_AT_MOST`; with more than `BUILD_MIN_RUNS`, a builder is started to
    catalog them."""
    start_builder(root, uncatalogued_runs=len(fresh))
    cache = DecodedCache(root, kept=len(fresh) <= FRESH_AT_MOST)
    for at in range(0, len(fresh), _READ_AT):
        runs = frozenset(fresh[at:at + _READ_AT])
        read = runs_from(root, None, None, lambda path: cache.get(path, read_attempt),
                         runs=runs)
        # (each of its own run: a record from a planted decoded cache naming another run
        # would have that run counted twice)
        yield attempts_table(a for r in read for a in r.attempts
                             if (a["project"], a["run"]) in runs)
    cache.save(complete=False)


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
           ) -> list[tuple[str, str]]:
    """(project, run) of the names under ``runs/`` the catalog does not vouch for. A
    project with as many names as the catalog vouches for has none (a run vouched for
    has its directory there, so the names are those runs'), and its names are counted,
    not held; else they are held as Arrow strings,
    listed `_LISTED_AT` at a time (15 bytes a run, not 70 as Python strings), and
    looked up among the vouched all at once (pyarrow hashes the vouched names at each
    lookup: 0.34 s for a million)."""
    fresh: list[tuple[str, str]] = []
    for project in sorted(projects):
        rel = f"runs/project={project}"
        known = pa.concat_arrays(vouched[project]) if project in vouched else \
            strings([])
        try:
            if count_names_at(root, rel, "run=") == len(known):
                continue
            listed = pa.concat_arrays([strings(names) for names in names_at_by(
                root, rel, "run=", _LISTED_AT)] or [strings([])])
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone since it was listed
        names = pc.utf8_slice_codeunits(listed, len("run="))
        left = np.flatnonzero(~numpy_of(pc.is_in(names, value_set=known), null=False))
        fresh.extend((project, name) for name in names.take(fixed(left, pa.int64())).to_pylist())
    return fresh


class _Newest:
    """The runs of attempts' starts given a few catalog files' at a time (every attempt
    of a run comes at once), counted and ordered as the runs view does, by DuckDB itself
    (the first start of each, cast to a timestamp as there), holding the newest `limit`
    of those picked so far: with `_PICK_AT` attempts given at a time, at most that many
    rows more than `limit`, however many runs the store holds."""

    def __init__(self, project: str | None, limit: int) -> None:
        self.project, self.limit = project, limit
        self.total = 0
        self.kept = empty_table(_STARTS)  # the newest so far, each run's first start

    def counted(self) -> NewestRuns:
        return NewestRuns(self.total, [(p, r) for p, r in zip(
            self.kept.column("project").to_pylist(), self.kept.column("run").to_pylist(),
            strict=True)])

    def pick(self, since: list[pa.Table]) -> None:
        """Counts the runs of `since` (attempts of runs not given before) and keeps the
        newest `limit` of them and of those kept."""
        con = question_connection()  # a cursor on the process's database, not one more
        try:
            con.register("_since", pa.concat_tables([empty_table(_STARTS), *since]))
            con.register("_kept", self.kept)
            where = "WHERE project = $project" if self.project is not None else ""
            params: dict[str, Any] = {"project": self.project} \
                if self.project is not None else {}
            con.execute(f"""CREATE TEMP TABLE _runs AS
                SELECT project, run, min(CAST(started_at AS TIMESTAMPTZ)) AS first,
                       arg_min(started_at, CAST(started_at AS TIMESTAMPTZ)) AS started_at
                FROM _since {where} GROUP BY project, run""", params)
            [(found,)] = con.execute("SELECT count(*) FROM _runs").fetchall()
            self.total += int(found)
            self.kept = con.sql(f"""SELECT project, run, started_at FROM (
                    SELECT project, run, first, started_at FROM _runs UNION ALL
                    SELECT project, run, CAST(started_at AS TIMESTAMPTZ), started_at
                    FROM _kept)
                ORDER BY first DESC, project DESC, run DESC LIMIT {int(self.limit)}
                """).to_arrow_table().cast(_STARTS)
        finally:
            con.close()
