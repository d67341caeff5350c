"""A derived catalog of settled runs, so that listing runs or connecting costs a `stat`
per directory and file and one Arrow file, instead of a listing per directory and JSON
decoded per file.

The catalog holds one row per run whose files were all settled when it was written, in
files of a share of the runs each (`catalog_shards`): the directories its metric parts
and attempt files live in and those files, each with its modification time; its
compacted metric parts with their summaries; and its attempt records. An entry is used
only while every one of those paths still has that mtime: every change tracklake makes
to a run's files adds, removes or renames a name in one of those directories (parts,
merged parts and attempt files are written to a temporary name and renamed into place;
compaction, retention and fsck unlink or rename), which changes the directory's mtime; a
file edited in place changes its own.
Live segments are appended in place, which changes no directory, so a run with a live
segment (or a damaged file, or an attempt file claimed but not written) is never
catalogued; nor is a run with a path changed less than `RACY_SECONDS` before the reader
began (coarse mtimes, and NFS clients whose clocks differ from the server's).

Like `decoded`, the catalog is never the only copy of anything: delete it at any time and
the next reader rebuilds it from the files. Training ranks never read or write it;
readers (and the deriver a finished run's compactor starts, `_ops/derive.py`) replace
each of its files whole (`write_atomic`), so concurrent readers see one version or the
other and need no lock; a file not to be trusted is ignored and rebuilt
(`catalog_shards`, `catalog_checks`: it may have been planted). A store the reader
cannot write is read without it.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Container, Iterable, Set
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._format.columns import (
    combined,
    fixed,
    numpy_of,
    rows_table,
    scalar_of,
    strings,
    table_of,
)
from tracklake._format.files import no_link_on_the_way
from tracklake._format.part_summary import SUMMARY_SCHEMA
from tracklake._format.schema import empty_table
from tracklake._format.switches import switched_on
from tracklake._read import catalog_shards
from tracklake._read.attempt_rows import ATTEMPTS_SCHEMA
from tracklake._read.decoded import RACY_SECONDS
from tracklake._read.dir_watch import dir_watch_wanted, start_watching, watching
from tracklake._read.location import is_url, regular_file_at, subdirs_at
from tracklake._read.mtimes import ABSENT, mtimes_of

#: Set to 0 where the file system's modification times cannot be trusted (a change that
#: leaves a directory's or file's mtime as it was, or caches that never expire): readers
#: then answer from the run's files every time, never from the catalog or the bundles.
TRUST_MTIMES_ENV = "TRACKLAKE_TRUST_MTIMES"


def mtimes_trusted() -> bool:
    """Whether the catalog and bundles may be used (`TRUST_MTIMES_ENV`, on by default)."""
    return switched_on(TRUST_MTIMES_ENV)


SUMMARY_FIELDS = pa.struct(
    [("rank", pa.int32()), ("attempt", pa.int32()), *SUMMARY_SCHEMA])
_PART = pa.struct([("path", pa.string()), ("first_seq", pa.int64()),
                   ("last_seq", pa.int64()), ("last_segment", pa.int64())])
_DIR = pa.struct([("path", pa.string()), ("mtime_ns", pa.int64())])
_SCHEMA = pa.schema([("project", pa.string()), ("run", pa.string()),
                     ("watched", pa.list_(_DIR)), ("parts", pa.list_(_PART)),
                     ("attempts", pa.list_(pa.struct(list(ATTEMPTS_SCHEMA)))),
                     ("summaries", pa.list_(SUMMARY_FIELDS))])


@dataclass
class RunEntry:
    """What the catalog keeps of one run; paths relative to the store root."""

    project: str
    run: str
    watched: list[tuple[str, int]]  # paths and their mtimes
    parts: list[tuple[str, int, int, int]]  # path, first_seq, last_seq, last_segment
    attempts: list[dict[str, Any]]  # attempt rows (`attempt_row`), statuses as recorded
    summaries: list[pa.Table]  # tables with SUMMARY_FIELDS' columns (and maybe others)


def mtime_ns(root: Path, rel: str) -> int:
    """The mtime of `rel` in `root`, `ABSENT` if it does not exist."""
    try:
        return os.stat(f"{root}{os.sep}{rel}").st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT


class RunCatalog:
    """The catalogued runs of a store; a no-op for a store in an object store, and for a
    question about a set of runs (`runs`)."""

    def __init__(self, root: Path, trusted: bool = True, run: str | None = None,
                 runs: frozenset[tuple[str, str]] | None = None,
                 shard: int | None = None) -> None:
        """`trusted=False`: no entry is used, and the catalog is written anew from what
        this reader finds (after a catalogued file turned out to be missing, or where
        `mtimes_trusted()` says the file system's mtimes cannot be trusted). `run`: a
        question about that run alone, which needs only the file that holds it. `runs`:
        a question about those (project, run) alone (the few a listing shows), which
        reads them from their files and writes no catalog file: their entries are spread
        over up to every file, which at a million runs hold 16,000 runs each. `shard`:
        the runs of that catalog file alone (`runs` then names those the store holds),
        read without keeping it and written back (`_ops/catalog_pass.py`)."""
        trusted = trusted and mtimes_trusted()
        self.root = root
        self.enabled = not is_url(root) and (runs is None or shard is not None)
        if not self.enabled:
            self._loaded = catalog_shards.empty(_SCHEMA)
        elif shard is not None:
            self._loaded = catalog_shards.alone(root, _SCHEMA, shard)
        else:
            self._loaded = catalog_shards.load(root, _SCHEMA, run)
        self._table = self._loaded.table
        self._valid: list[int] = []
        self._rows: pa.Table | None = None
        # untrusted: every row of the files the question reads is written anew (of the
        # one that holds `run`, for a question about it, even if every file was read)
        self._stale: set[int] = set() if trusted else set(np.flatnonzero(
            self._loaded.shards == catalog_shards.shard_of(run) if run is not None
            else np.ones(self._table.num_rows, dtype=bool)).tolist())
        self._trusted = trusted
        self._fresh: list[RunEntry] = []
        self._saved: pa.Table | None = None  # the runs `save` left on disk (their names)
        self._written: pa.Table | None = None  # the fresh entries `save` wrote

    def settled(self, project: str | None, run: str | None, attempts_only: bool = False
                ) -> Set[tuple[str, str]]:
        """(project, run) of the catalogued runs (of `project` / `run` if given) whose
        watched paths all still have the mtimes recorded: their entries are what
        `parts`, `summaries` and `attempts` give. With `attempts_only` (a question on the
        `runs` view alone), only the paths under ``runs/`` are looked at of the runs
        whose paths are not all watched yet (`dir_watch`), and only what `attempts`
        gives is vouched for: the caller reads no part of the catalog's."""
        t = self._table
        if not t.num_rows or not self._trusted:
            return set()
        w = _watched_of(self.root, t)
        listed = _in_listed_projects(self.root, t, w)
        if not listed.all():  # a planted catalog's rows: written anew without them
            self._stale.update(np.flatnonzero(~listed).tolist())
        quiet, epochs = _quiet_rows(self.root, w)
        # the rows whose every path is looked at (None: every row): with `attempts_only`,
        # those whose watches are in place, so that found as recorded they become quiet
        # and the next question looks at none of their paths; the others, only at their
        # paths under runs/
        whole = None if not attempts_only else (
            np.zeros(t.num_rows, dtype=bool) if epochs is None else epochs >= 0)
        if run is not None:  # a question about one run: its rows by a kept index
            return self._settled_of(w, [
                i for i in _rows_by_run(w).get(run, ())
                if listed[i] and (project is None or w.projects[i] == project)],
                quiet, epochs, whole)
        chosen = listed.copy()
        if project is not None:
            chosen &= numpy_of(pc.equal(t.column("project"), scalar_of(project, pa.string())))
        look = chosen if quiet is None else chosen & ~quiet
        if look.all() and whole is None:
            looked = None
        else:
            picked = look[w.owner]
            if whole is not None:
                picked &= w.under_runs | whole[w.owner]
            looked = np.flatnonzero(picked)
        changed = np.bincount(_changed_owners(w, looked), minlength=t.num_rows) > 0
        if quiet is not None and epochs is not None:
            w.watch["quiet"].settle(np.flatnonzero(look & ~changed), epochs)
        if chosen.all() and not changed.any():  # every run as recorded: made once
            self._valid = list(range(t.num_rows))
            if "every run" not in w.derived:
                w.derived["every run"] = frozenset(zip(w.projects, w.runs, strict=True))
            return w.derived["every run"]  # type: ignore[no-any-return]
        return self._vouch(w, np.flatnonzero(chosen).tolist(),
                           set(np.flatnonzero(changed).tolist()))

    def _settled_of(self, w: _Watched, rows: list[int], quiet: np.ndarray | None,
                    epochs: np.ndarray | None, whole: np.ndarray | None
                    ) -> set[tuple[str, str]]:
        """`settled` for a few `rows` (one run's), in what they cost, not what the
        table holds: their paths only are looked at (by the watch, else `stat`)."""
        look = [i for i in rows if quiet is None or not quiet[i]]
        looked = np.array([j for i in look for j in range(w.starts[i], w.starts[i + 1])
                           if whole is None or whole[i] or w.under_runs[j]],
                          dtype=np.int64)
        changed = set(_changed_owners(w, looked).tolist())
        if quiet is not None and epochs is not None:
            w.watch["quiet"].settle(
                np.array([i for i in look if i not in changed], dtype=np.int64), epochs)
        return self._vouch(w, rows, changed)

    def _vouch(self, w: _Watched, rows: list[int], changed: set[int]
               ) -> set[tuple[str, str]]:
        """(project, run) of `rows` not `changed`, which the catalog vouches for; the
        changed ones are stale."""
        found = set()
        for i in rows:
            if i in changed:
                self._stale.add(i)
            else:
                self._valid.append(i)
                found.add((w.projects[i], w.runs[i]))
        return found

    def _settled_rows(self) -> pa.Table:
        if self._rows is None:
            valid = self._valid
            if len(valid) == self._table.num_rows:
                self._rows = self._table
            elif valid and valid[-1] - valid[0] + 1 == len(valid):
                # one run (a question about it), or a run of rows: a view, not a copy
                self._rows = self._table.slice(valid[0], len(valid))
            else:
                self._rows = self._table.take(fixed(valid, pa.int64()))
        return self._rows

    def _derived(self, name: str, make: Any) -> Any:
        """`make(rows)` of the settled rows; when they are the whole table, or one run's
        row of it, made once while the process keeps it (10,000 runs: 17 ms a question;
        one run: 0.15 ms), so shared by the questions: callers never change what it
        gives."""
        rows = self._settled_rows()
        if not rows.num_rows:
            return make(rows)  # no run as recorded, or no catalog (an object store's)
        if rows is self._table:
            key: Any = name
        elif len(self._valid) == 1:
            # one run's row (a question about it): its entry is the same while the table is
            key = (name, self._valid[0])
        else:
            return make(rows)  # some runs changed
        memo = _watched_of(self.root, self._table).derived
        if key not in memo:
            memo[key] = make(rows)
        return memo[key]

    def parts(self) -> list[tuple[str, int, int, int]]:
        """(path, first_seq, last_seq, last_segment) of the settled runs' metric parts."""
        return self._derived("parts", _parts_of)  # type: ignore[no-any-return]

    def check_reached(self, paths: Iterable[str]) -> None:
        """Raise FileNotFoundError naming the first of `paths` (the settled runs' parts,
        relative to the root, about to be read or copied) that is not a regular file
        reached through no link. A listing never follows a link nor takes a FIFO, so a
        catalog that names one was planted, or its run was changed since in a way its
        mtimes hide; a caller then reads the store without the catalog, which is
        rewritten. Paths found plain are remembered with the kept table while every run
        in it is as recorded (a part read at each question is checked once)."""
        whole = self._settled_rows() is self._table and self._table.num_rows
        known: set[str] = _watched_of(self.root, self._table).derived.setdefault(
            "reached", set()) if whole else set()
        for rel in paths:
            if rel in known:
                continue
            if not regular_file_at(self.root, rel):
                raise FileNotFoundError(
                    f"{self.root / rel}: the run catalog names it as a part, but it is a "
                    "link, is reached through one, or is not a regular file: the store "
                    "is read without the catalog")
            known.add(rel)

    def part_mtimes(self) -> dict[str, int]:
        """Path → mtime of the settled runs' metric part files, as checked by `settled`:
        what a bundle's sources are compared with (`bundles.usable`)."""
        return self._derived("part mtimes", _part_mtimes_of)  # type: ignore[no-any-return]

    def runs(self) -> list[tuple[str, str, list[str], int]]:
        """(project, run, paths of its metric parts, values in them) per settled run."""
        return self._derived("runs", _runs_of)  # type: ignore[no-any-return]

    def attempts(self) -> pa.Table:
        """The settled runs' attempts as `run_attempts` rows, statuses as recorded."""
        return self._derived("attempts", _attempts_of)

    def summaries(self, schema: pa.Schema) -> pa.Table:
        """The settled runs' metric summaries as a table of `schema` (project, run, then
        the fields of `SUMMARY_FIELDS`), built column by column."""
        return self._derived(f"summaries {schema}", lambda rows: _summaries_of(rows, schema))

    def keep(self, entry: RunEntry, since_ns: int) -> None:
        """Catalog `entry`, read by a snapshot that began at `since_ns`, unless one of its
        paths changed too shortly before (its mtime could hide a later change)."""
        if self.enabled and _consistent(entry) and all(
                m < since_ns - int(RACY_SECONDS * 1e9) for _, m in entry.watched):
            self._fresh.append(entry)

    def save(self) -> bool:
        """Write the catalog's files that change: the entries still valid, the fresh ones,
        and those of the runs `settled` did not look at; the entries it found stale go
        (the run changed since, or is gone). True if the files hold them now
        (`vouched`)."""
        if not self.enabled:
            return False
        if not self._fresh and not self._stale:
            self._saved = self._table
            return True
        keep = np.ones(self._table.num_rows, dtype=bool)
        keep[list(self._stale)] = False
        listed = _SCHEMA.remove(_SCHEMA.get_field_index("summaries"))
        fresh = rows_table(listed, [{
            "project": e.project, "run": e.run,
            "watched": [{"path": d, "mtime_ns": m} for d, m in e.watched],
            "parts": [dict(zip(_PART.names, p, strict=True)) for p in e.parts],
            "attempts": e.attempts} for e in self._fresh]).append_column(
                _SCHEMA.field("summaries"), _summaries_column(self._fresh))
        try:
            self._saved, self._written = catalog_shards.save(
                self.root, self._loaded, keep, fresh, self._remove_earlier)
        except OSError:
            return False  # a store this reader may not write: the catalog only saves time
        return True

    def settled_table(self) -> pa.Table:
        """The entries of the runs the catalog vouches for once `save` wrote it: those
        `settled` found as recorded and the fresh ones written, in the catalog's columns
        (only the found ones if the files could not be written)."""
        found = self._settled_rows().select(_SCHEMA.names)
        if self._written is None:
            return found
        return pa.concat_tables([found, self._written.select(_SCHEMA.names)])

    def _remove_earlier(self) -> None:
        for earlier in catalog_shards.EARLIER:
            if no_link_on_the_way(self.root, earlier.as_posix()):
                (self.root / earlier).unlink(missing_ok=True)

    def vouched(self) -> Container[str]:
        """The paths (relative to the root) of the runs the catalog `save` left on disk
        holds: what is decoded from their files is in it, while they stay as recorded (a
        file added to such a run since changed the run, whose entry is then made again)."""
        if self._saved is None or not self._saved.num_rows:
            return _RunsOfPaths(frozenset())
        if self._saved is not self._table:
            return _RunsOfPaths(_runs_in(self._saved))
        # the catalog as it was read: made once while the process keeps it (34,000 runs:
        # 62 ms a question); callers never change what it gives
        memo = _watched_of(self.root, self._table).derived
        if "vouched" not in memo:
            w = _watched_of(self.root, self._table)
            memo["vouched"] = _RunsOfPaths(frozenset(zip(w.projects, w.runs, strict=True)))
        return memo["vouched"]  # type: ignore[no-any-return]


class _RunsOfPaths:
    """The paths of a store's files that belong to some of its runs
    (``KIND/project=P/run=R/…``), by the runs' (project, run) alone: at 34,000 runs a set
    of every watched path held 30 MB, the runs' names 3 MB."""

    def __init__(self, runs: frozenset[tuple[str, str]]) -> None:
        self.runs = runs

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        parts = path.split("/", 3)
        return (len(parts) == 4 and parts[1].startswith("project=")
                and parts[2].startswith("run=")
                and (parts[1][8:], parts[2][4:]) in self.runs)


def _runs_in(t: pa.Table) -> frozenset[tuple[str, str]]:
    return frozenset(zip(t.column("project").to_pylist(), t.column("run").to_pylist(),
                         strict=True))


@dataclass(frozen=True)
class _Watched:
    """A catalog table's watched paths laid out for `settled`, made once per table."""

    paths: list[str]  # absolute, as `mtimes_of` takes them
    recorded: np.ndarray  # their mtimes in the catalog
    owner: np.ndarray  # the row (run) of each path
    holds: np.ndarray  # whether that run has files of the path's kind (parts, attempts)
    projects: list[str]
    runs: list[str]
    starts: list[int]  # where each row's paths begin, and (last) where they end
    under_runs: np.ndarray  # whether each path is under runs/ (the attempts')
    derived: dict[Any, Any] = field(default_factory=dict)  # RunCatalog._derived's
    watch: dict[str, Any] = field(default_factory=dict)  # `_quiet_rows`'


#: `_Watched` of the tables last validated, by `id` (the table kept, so the id stays its).
_watched_before: dict[int, tuple[pa.Table, _Watched]] = {}
_watched_lock = threading.Lock()
#: Tables whose `_Watched` is kept (the whole catalog of a store or two, a shard).
_WATCHED_TABLES = 2


def _watched_of(root: Path, t: pa.Table) -> _Watched:
    """`t`'s `_Watched`, made once while the process keeps `t` (`catalog_shards`): a
    10,000-run catalog's 70,000 paths are not built again for each question."""
    with _watched_lock:
        known = _watched_before.get(id(t))
    if known is not None and known[0] is t:
        return known[1]
    watched = combined(t.column("watched"))
    offsets = numpy_of(watched.offsets)
    owner = np.repeat(np.arange(t.num_rows), np.diff(offsets))
    paths = watched.flatten().field("path")
    holds = np.where(
        numpy_of(pc.starts_with(paths, "metrics/")),
        numpy_of(pc.list_value_length(t.column("parts")))[owner] > 0,
        numpy_of(pc.list_value_length(t.column("attempts")))[owner] > 0)
    prefix = f"{os.path.abspath(root)}{os.sep}"
    made = _Watched([prefix + p for p in paths.to_pylist()],
                    numpy_of(watched.flatten().field("mtime_ns")), owner, holds,
                    t.column("project").to_pylist(), t.column("run").to_pylist(),
                    (offsets - offsets[0]).tolist(),
                    numpy_of(pc.starts_with(paths, "runs/")))
    with _watched_lock:
        while len(_watched_before) >= _WATCHED_TABLES:
            _watched_before.pop(next(iter(_watched_before)))
        _watched_before[id(t)] = (t, made)
    return made


def _changed_owners(w: _Watched, looked: np.ndarray | None) -> np.ndarray:
    """The row of each of `w`'s paths (those at `looked`, else all) whose mtime is not
    the one recorded (a row once per such path)."""
    if looked is None:
        paths, recorded, owner, holds = w.paths, w.recorded, w.owner, w.holds
    else:
        paths = [w.paths[i] for i in looked.tolist()]
        recorded, owner, holds = w.recorded[looked], w.owner[looked], w.holds[looked]
    # a path recorded absent is only as it was if the run holds nothing of its kind
    same = (mtimes_of(paths) == recorded) & ~((recorded == ABSENT) & holds)
    return owner[~same]  # type: ignore[no-any-return]


def _rows_by_run(w: _Watched) -> dict[str, list[int]]:
    """The rows of each run name, made once with `w` (a run's rows were found by
    comparing every row's name: 0.1 ms a question at 1,000 runs)."""
    index: dict[str, list[int]] | None = w.derived.get("rows by run")
    if index is None:
        index = {}
        for i, name in enumerate(w.runs):
            index.setdefault(name, []).append(i)
        w.derived["rows by run"] = index
    return index


def _in_listed_projects(root: Path, t: pa.Table, w: _Watched) -> np.ndarray:
    """The rows of `t` whose project a listing finds: a real directory under `runs/` and,
    for a run with parts, under `metrics/` too. A project directory that is a link
    (which a listing never follows) leads out of the store: a catalog naming runs under
    one was planted, and `stat` would find their paths' mtimes through the link. Kept
    with `w` while the two listings are the same."""
    listed = []
    for kind in ("runs", "metrics"):
        try:
            listed.append(subdirs_at(root, kind))
        except (FileNotFoundError, NotADirectoryError):
            listed.append([])
    known = w.derived.get("listed projects")
    if known is not None and known[0] == listed:
        return known[1]  # type: ignore[no-any-return]

    def among(names: list[str]) -> np.ndarray:
        projects = strings([n[len("project="):] for n in names if n.startswith("project=")])
        return numpy_of(pc.is_in(t.column("project"), value_set=projects))

    has_parts = numpy_of(pc.list_value_length(t.column("parts"))) > 0
    inside = among(listed[0]) & (among(listed[1]) | ~has_parts)
    inside.flags.writeable = False  # shared by the questions while the listings stay
    w.derived["listed projects"] = (listed, inside)
    return inside


def _quiet_rows(root: Path, w: _Watched) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The rows of `w`'s table known unchanged since their last look, without a `stat`
    (`dir_watch`), and their epochs for `QuietRows.settle`; (None, None) until the
    watches are being added. The second question on a store starts them, in the
    background, the rows usable as their watches are in place; a table read later (the
    catalog rewritten after a run changed) is watched at once, keeping what was known of
    the runs it records as before."""
    state = w.watch
    rows = state.get("quiet")
    if rows is None and not state and dir_watch_wanted() and \
            (watch := watching(root)) is not None:
        rows = state["quiet"] = watch.rows_for(*_to_watch(root, w))
    if rows is not None:
        seen: tuple[np.ndarray, np.ndarray] | None = rows.look()
        if seen is not None:
            return seen
        state.clear()  # a forked child's: it watches anew
    state["asked"] = asked = state.get("asked", 0) + 1
    if asked == 2 and dir_watch_wanted():
        start_watching(root, partial(_to_watch, root, w), state)
    return None, None


def _to_watch(root: Path, w: _Watched) -> tuple[list[str], np.ndarray, np.ndarray,
                                                 list[tuple[str, str]], list[object],
                                                 list[str]]:
    """`w`'s paths, which of them are directories, the row of each, each row's run, what
    the table records of each row's paths, and the directories above the runs' (the
    store, its kinds, their projects) (`DirWatch.rows_for`)."""
    is_dir = np.array([not path.endswith(_WATCHED_FILES) for path in w.paths], dtype=bool)
    bounds = np.searchsorted(w.owner, np.arange(len(w.runs) + 1)).tolist()
    recorded: list[object] = [
        ("\0".join(w.paths[a:b]), w.recorded[a:b].tobytes())
        for a, b in itertools.pairwise(bounds)]
    top = os.path.abspath(root)
    anchors = [top, *(f"{top}{os.sep}{kind}" for kind in ("metrics", "runs")),
               *(f"{top}{os.sep}{kind}{os.sep}project={p}" for p in sorted(set(w.projects))
                 for kind in ("metrics", "runs"))]
    return (w.paths, is_dir, w.owner, list(zip(w.projects, w.runs, strict=True)), recorded,
            anchors)


#: The files among a run's watched paths (its parts, its attempt files); the rest are
#: the directories that hold them (watched for names made, removed or renamed).
_WATCHED_FILES = (".parquet", ".json")


def _parts_of(rows: pa.Table) -> list[tuple[str, int, int, int]]:
    parts = combined(rows.column("parts")).flatten()
    return list(zip(*(parts.field(n).to_pylist() for n in _PART.names), strict=True))


def _part_mtimes_of(rows: pa.Table) -> dict[str, int]:
    # (the parts alone: a dict of every watched path, 7 a run, took 51 ms at 10,000 runs)
    watched = combined(rows.column("watched")).flatten()
    paths = watched.field("path")
    parts = watched.filter(pc.and_(pc.starts_with(paths, "metrics/"),
                                   pc.ends_with(paths, ".parquet")))
    return dict(zip(parts.field("path").to_pylist(), parts.field("mtime_ns").to_pylist(),
                    strict=True))


def _runs_of(rows: pa.Table) -> list[tuple[str, str, list[str], int]]:
    parts = rows.column("parts").to_pylist()
    counts = rows.column("summaries").to_pylist()
    return [(p, r, [x["path"] for x in ps], sum(x["count"] for x in cs))
            for p, r, ps, cs in zip(rows.column("project").to_pylist(),
                                    rows.column("run").to_pylist(), parts, counts,
                                    strict=True)]


def _attempts_of(rows: pa.Table) -> pa.Table:
    flat = combined(rows.column("attempts")).flatten()
    return pa.Table.from_struct_array(flat) if len(flat) else empty_table(ATTEMPTS_SCHEMA)


def _summaries_of(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    column = combined(rows.column("summaries"))
    flat = column.flatten()
    parents = pc.list_parent_indices(column)
    columns = {"project": rows.column("project").take(parents),
               "run": rows.column("run").take(parents)}
    columns |= {name: flat.field(name) for name in SUMMARY_FIELDS.names}
    return table_of(columns, schema)


def _summaries_column(entries: list[RunEntry]) -> pa.Array:
    """The `summaries` list column of `entries`, built from their tables column by
    column (a run of 100,000 keys made 100,000 objects to convert)."""
    tables = [t.select(SUMMARY_FIELDS.names).cast(pa.schema(list(SUMMARY_FIELDS)))
              for e in entries for t in e.summaries]
    flat = pa.concat_tables(tables).combine_chunks() if tables else \
        empty_table(pa.schema(list(SUMMARY_FIELDS)))
    lengths = [sum(t.num_rows for t in e.summaries) for e in entries]
    offsets = fixed(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), pa.int32())
    values = pa.StructArray.from_arrays(
        [combined(flat.column(name)) for name in SUMMARY_FIELDS.names],
        fields=list(SUMMARY_FIELDS))
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(SUMMARY_FIELDS))


def _consistent(entry: RunEntry) -> bool:
    """False if a directory whose files the entry holds was gone when its mtimes were
    taken (the run was dropped between the listing and the stat): recorded as `ABSENT`,
    the entry would pass as valid for as long as the directory stays gone (`settled`
    refuses such entries too, in catalogs written before this check)."""
    for path, mtime in entry.watched:
        if mtime == ABSENT and ((path.startswith("metrics/") and entry.parts)
                                or (path.startswith("runs/") and entry.attempts)):
            return False
    return True


def watched_paths(root: Path, project: str, run: str) -> list[tuple[str, int]]:
    """Every directory of a run that a change to its metric parts or attempt files
    touches (the run's, its ranks', its metric streams'), and those files themselves
    (changed in place, by someone or by damage that touches the mtime, they are read and
    checked again), each with its mtime (`ABSENT` for a run directory that does not
    exist)."""
    from tracklake._read.listing import names_in

    found = []
    for base in ("metrics", "runs"):
        level = [f"{base}/project={project}/run={run}"]
        for prefixes in (("rank=",), ("attempt=",), ("",)):
            found.extend(level)
            level = [f"{d}/{n}" for d in level for n in names_in(root, d)
                     if n.startswith(prefixes) and not n.startswith(".")]
        found.extend(level)
    return [(d, mtime_ns(root, d)) for d in found]
