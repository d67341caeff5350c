"""The store's files at one moment, for the SQL views: compacted parts per kind (their
footers checked), the live tail as tables, metric summaries and the runs' attempts."""

from __future__ import annotations

import datetime as _dt
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError, StoreError
from tracklake._format import KINDS, PARTITION_SCHEMA, SCHEMAS, StreamId
from tracklake._format.attempt import read_attempt
from tracklake._format.columns import column, fixed, strings
from tracklake._format.part import open_part, part_summary_columns
from tracklake._format.schema import empty_table, with_partition_columns
from tracklake._format.store_clock import store_now_ns
from tracklake._read.attempt_rows import ATTEMPTS_SCHEMA, attempts_table
from tracklake._read.bundles import (
    Bundle,
    bundle_paths,
    bundle_schema,
    covered_runs,
    start_builder,
    usable,
)
from tracklake._read.catalog import SUMMARY_FIELDS, RunCatalog
from tracklake._read.decoded import DecodedCache
from tracklake._read.fresh import FreshRuns as _FreshRuns
from tracklake._read.fresh import resumed_in as _resumed_in
from tracklake._read.listing import stream_dirs
from tracklake._read.reader import (
    Part,
    ReadProblems,
    StreamFiles,
    add_once,
    list_stream,
    list_streams,
    read_stream,
    runs_from,
)
from tracklake._read.run_index import runs_view_attempts, runs_view_streamed
from tracklake._read.runs_rows import runs_rows
from tracklake._read.scope import EVERYTHING, Scope

#: Listings of a stream whose parts change under the reader before giving up.
_RELISTS = 5
#: Kinds whose records have a step, hidden from the default views once a later attempt
#: logged that step again.
STEP_KINDS = frozenset({"metrics", "texts", "generations", "histograms", "media"})

_SUMMARY_SCHEMA = pa.schema(
    [("project", pa.string()), ("run", pa.string()), *SUMMARY_FIELDS])


def with_partitions(tables: list[tuple[pa.Table, StreamId]], kind: str) -> pa.Table:
    """The live tables of many streams as one, with their partition columns: `project` and
    `run` as dictionaries (one string per stream, not per row), `rank` and `attempt`
    repeated by NumPy, so building them costs per stream, not per value in Python."""
    if not tables:
        return _empty(kind)
    lengths = np.array([t.num_rows for t, _ in tables], dtype=np.int64)
    index = fixed(np.repeat(np.arange(len(tables), dtype=np.int32), lengths), pa.int32())
    table = pa.concat_tables([t for t, _ in tables])
    for name in ("project", "run"):
        names = strings([getattr(s, name) for _, s in tables])
        table = table.append_column(name, pa.DictionaryArray.from_arrays(index, names))
    for name in ("rank", "attempt"):
        values = np.array([getattr(s, name) for _, s in tables], dtype=np.int32)
        table = table.append_column(PARTITION_SCHEMA.field(name),
                                    fixed(np.repeat(values, lengths), pa.int32()))
    return table


def _resumed(streams: Iterable[StreamId]) -> list[tuple[str, str]]:
    """(project, run) of the runs with metrics from more than one attempt."""
    attempts: dict[tuple[str, str], set[int]] = {}
    for s in streams:
        if s.kind == "metrics":
            attempts.setdefault((s.project, s.run), set()).add(s.attempt)
    return sorted(run for run, seen in attempts.items() if len(seen) > 1)


class Snapshot:
    """The files of the store at one moment, as far as `scope` reaches: parts per kind
    (their footers checked), live tail tables, metric summaries, attempts. Damaged files
    are left out and noted in `problems`."""

    def __init__(self, root: Path, problems: ReadProblems | None = None,
                 skip: frozenset[Path] = frozenset(), scope: Scope = EVERYTHING,
                 trust_catalog: bool = True) -> None:
        problems = ReadProblems() if problems is None else problems
        since = store_now_ns(root)
        self.parts: dict[str, list[Part]] = {k: [] for k in KINDS}
        #: copies of many small runs' catalogued parts, read in their place
        self.bundles: list[Bundle] = []
        self.summaries = empty_table(_SUMMARY_SCHEMA)
        #: the runs whose metrics have more than one attempt (only those have cutoffs)
        self.resumed: list[tuple[str, str]] = []
        #: every attempt of the runs in scope, as `run_attempts` rows (statuses as recorded)
        self.attempts = empty_table(ATTEMPTS_SCHEMA)
        #: the runs view's rows, where made without `attempts` (`runs_rows`)
        self.runs: pa.Table | None = None
        #: the run catalog as this snapshot left it (None: not looked at)
        self.catalog: RunCatalog | None = None
        if not scope.kinds and scope.attempts and scope.run is None and scope.runs is None \
                and trust_catalog and not skip and runs_view_streamed(root):
            # the runs view alone, a process's first question on it: the catalog's files
            # read one at a time, not kept
            streamed = runs_view_attempts(root, scope.project)
            if streamed is not None:
                self.kinds: tuple[str, ...] = ()
                self.live = {k: _empty(k) for k in KINDS}
                if scope.attempt_rows:
                    self.attempts = pa.concat_tables([self.attempts, *streamed])
                else:  # a row a run, grouped a catalog file at a time
                    self.runs = runs_rows(streamed, _dt.datetime.now(
                        _dt.timezone.utc).timestamp())
                return
        live: dict[str, list[tuple[pa.Table, StreamId]]] = {k: [] for k in KINDS}
        summaries: list[pa.Table] = []
        # runs whose metric parts and attempt files are as the catalog has them are not
        # listed again (with parts to skip, a rare retry after damage, all are)
        catalog = self.catalog = RunCatalog(root, trust_catalog, scope.run, scope.runs,
                                            scope.shard)
        # the runs view alone: the catalog vouches for the runs' attempts only
        attempts_only = not scope.kinds
        settled = frozenset(catalog.settled(scope.project, scope.run, attempts_only)) if \
            ("metrics" in scope.kinds or scope.attempts) and not skip else frozenset()
        streams = {**stream_dirs(root, scope.project, scope.run,
                                 tuple(k for k in KINDS if k in scope.kinds - {"metrics"}),
                                 runs=scope.runs),
                   **stream_dirs(root, scope.project, scope.run,
                                 ("metrics",) if "metrics" in scope.kinds else (), settled,
                                 scope.runs)}
        if scope.kinds & STEP_KINDS and "metrics" not in scope.kinds and _resumed(
                list_streams(root, scope.project, scope.run, ("metrics",), scope.runs)):
            # a resumed run: the steps its later attempts logged again hide the earlier
            # attempts' (docs/format.md), and those cutoffs come from the metrics
            streams = stream_dirs(root, scope.project, scope.run,
                                  tuple(k for k in KINDS if k in scope.kinds | {"metrics"}),
                                  runs=scope.runs)
        #: the kinds read, in KINDS order (those of `scope`, and metrics for cutoffs)
        self.kinds = tuple(k for k in KINDS if k in {s.kind for s in streams} | scope.kinds)
        cache = DecodedCache(root, kept=scope.shard is None)
        fresh = _FreshRuns()
        for s, directory in streams.items():
            before = (len(summaries), len(problems.damaged))
            files = self._add_parts(root, s, root / directory, skip, problems, cache,
                                    summaries)
            if s.kind == "metrics":
                fresh.add(s, files, summaries[before[0]:],
                          settled=len(problems.damaged) == before[1] and not files.segments
                          and not skip)
            after = max((p.last_seq for p in files.parts), default=-1)
            if files.segments:
                batches = list(read_stream(root, s, after, problems))
                if batches:
                    live[s.kind].append((pa.Table.from_batches(batches, SCHEMAS[s.kind]), s))
        self.live = {k: with_partitions(v, k) for k, v in live.items()}
        if not attempts_only:  # else no view but the runs': nothing of the metrics is made
            catalogued_parts = self._catalogued_metrics(root, catalog, scope, settled,
                                                        streams, summaries)
            catalog.check_reached(path for path, *_ in catalogued_parts)
            self.parts["metrics"].extend(Part(first, last, segment, root / path)
                                         for path, first, last, segment in catalogued_parts)
        if scope.attempts or "metrics" in scope.kinds:
            # the attempt files of the runs not catalogued: for the runs view, and so that
            # those runs can be catalogued
            runs = runs_from(root, scope.project, scope.run,
                             lambda path: fresh.attempt(path, cache.get(path, read_attempt)),
                             settled, scope.runs)
            # (their paths' mtimes taken only for a catalog that keeps entries)
            for entry in fresh.entries(root, "metrics" in scope.kinds and catalog.enabled):
                catalog.keep(entry, since)
            if scope.attempts:
                self.attempts = pa.concat_tables([
                    catalog.attempts(),
                    attempts_table(a for run in runs for a in run.attempts)])
        # the catalog first: what it holds, the decoded cache need not
        vouched = catalog.save()
        cache.save(complete=scope.everything, vouched=catalog.vouched if vouched else None)

    def _catalogued_metrics(self, root: Path, catalog: RunCatalog, scope: Scope,
                            settled: frozenset[tuple[str, str]],
                            streams: dict[StreamId, str], summaries: list[pa.Table]
                            ) -> list[tuple[str, int, int, int]]:
        """Set the summaries, resumed runs and bundles; the catalogued parts to read."""
        catalogued = catalog.summaries(_SUMMARY_SCHEMA)
        self.summaries = pa.concat_tables([catalogued, *summaries])
        self.resumed = sorted({*_resumed(streams), *_resumed_in(catalogued)})
        catalogued_parts = catalog.parts()
        if not scope.metric_values:
            # a question on the metric summaries alone reads the values of resumed runs
            # only (their summaries are computed from what a later attempt did not log
            # again): the other parts are not even given a path
            prefixes = tuple(f"metrics/project={p}/run={r}/" for p, r in self.resumed)
            catalogued_parts = [c for c in catalogued_parts if c[0].startswith(prefixes)]
            dirs = {root / "metrics" / f"project={p}" / f"run={r}" for p, r in self.resumed}
            self.parts["metrics"] = [p for p in self.parts["metrics"]
                                     if p.path.parents[2] in dirs]
        if scope.metric_values and scope.run is None and scope.runs is None and settled:
            if bundle_paths(root):
                self.bundles, covered = usable(root, catalog.part_mtimes(), scope.project)
                catalogued_parts = [c for c in catalogued_parts if c[0] not in covered]
                settled_left = len(settled) - len(covered_runs(covered))
            else:
                settled_left = len(settled)
            start_builder(root, settled_left)
        return catalogued_parts

    def _add_parts(self, root: Path, s: StreamId, directory: Path, skip: frozenset[Path],
                   problems: ReadProblems, cache: DecodedCache,
                   summaries: list[pa.Table]) -> StreamFiles:
        """The parts of stream `s` whose footers verify (and their metric summaries); the
        stream is listed again if a part went (merged or pruned) after it was listed."""
        for _ in range(_RELISTS):
            files = list_stream(root, s, directory)
            found: list[Part] = []
            rows: list[pa.Table] = []
            try:
                for p in files.parts:
                    if p.path in skip:
                        continue
                    try:
                        rows.append(_part_summary(p.path, cache, s))
                    except NewerFormatError:
                        raise
                    except FormatError as exc:
                        add_once(problems.damaged, (p.path, part_lost(exc, p)))
                        continue
                    found.append(p)
            except FileNotFoundError:
                continue
            self.parts[s.kind].extend(found)
            if s.kind == "metrics":
                summaries.extend(rows)
            return files
        raise StoreError(f"{directory}: its parts kept changing while being read "
                         f"({_RELISTS} listings); try again")


def part_lost(exc: Exception, part: Part) -> str:
    """Why a part is left out, and what that loses."""
    return (f"{str(exc).removeprefix(f'{part.path}: ')}; its records (seq "
            f"{part.first_seq}..{part.last_seq} of this stream) are left out")


@functools.cache
def _empty(kind: str) -> pa.Table:
    """The kind's view with no rows: made once (each question has a live table per kind,
    most of them empty), shared, as an Arrow table never changes."""
    return empty_table(partitioned_schema(kind))


@functools.cache
def partitioned_schema(kind: str) -> pa.Schema:
    """The kind's schema with its partition columns, as its views have them."""
    return with_partition_columns(SCHEMAS[kind])


def _verified_summary(path: Path) -> dict[str, list[Any]]:
    """The metric summary a part carries as columns (none for other kinds), its footer
    verified."""
    return part_summary_columns(open_part(path), path)


def _part_summary(path: Path, cache: DecodedCache, s: StreamId) -> pa.Table:
    """The metric summary of part `path` of stream `s`, as `_SUMMARY_SCHEMA` rows: from
    the decoded cache, or from the part if the cache's entry does not convert (a cache
    file is outside input too: it may have been planted)."""
    try:
        return _summary_table(cache.get(path, _verified_summary), s)
    except (pa.ArrowException, OverflowError, TypeError, ValueError, KeyError,
            AttributeError):
        return _summary_table(_verified_summary(path), s)


def _summary_table(columns: dict[str, list[Any]], s: StreamId) -> pa.Table:
    rows = len(columns["key"])
    same = {"project": s.project, "run": s.run, "rank": s.rank, "attempt": s.attempt}
    return pa.Table.from_arrays(
        [column([same[f.name]] * rows, f.type) if f.name in same
         else column(columns[f.name], f.type) for f in _SUMMARY_SCHEMA],
        schema=_SUMMARY_SCHEMA)


def _verified_format(dictionaries: tuple[str, ...] = ()) -> Any:
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat(
        read_options=ds.ParquetReadOptions(dictionary_columns=list(dictionaries)),
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(
            page_checksum_verification=True))


#: Columns a bundle's dataset reads as dictionaries: a few distinct values over millions
#: of rows (10,000 runs: counting points per run 1.14 s as text, 0.16 s as a dictionary).
#: DuckDB pushes no filter into a dictionary column with pyarrow < 26, which costs little
#: here: a bundle is sorted by key first, so its row groups span many runs anyway, and a
#: question about one run reads that run's parts, not a bundle.
_BUNDLE_DICTIONARIES = ("project", "run")


def bundles_dataset(bundles: list[Bundle]) -> Any:
    """Bundles as a pyarrow dataset (their partition columns stored), verifying page
    checksums."""
    import pyarrow.dataset as ds

    schema = bundle_schema()
    for name in _BUNDLE_DICTIONARIES:
        schema = schema.set(schema.get_field_index(name),
                            pa.field(name, pa.dictionary(pa.int32(), pa.string())))
    return ds.dataset([str(b.path) for b in bundles], schema=schema,
                      format=_verified_format(_BUNDLE_DICTIONARIES))


def parts_dataset(root: Path, kind: str, parts: list[Part]) -> Any:
    """The parts of one kind as a pyarrow dataset that verifies page checksums: DuckDB
    reads the files only through it, so the connection needs no file access at all."""
    import pyarrow.dataset as ds

    schema = SCHEMAS[kind]
    # every column as its plain type: DuckDB pushes a filter down to the dataset (and so to
    # the parts' row-group statistics) only on plain columns. Read as a dictionary, `key`
    # made questions over every key faster (no string per row) but a question for one key
    # read every row of every part (1 billion values: 9.5 s, against 0.3 s for DuckDB's
    # own reader, which prunes by the statistics).
    fmt = _verified_format()
    schema = with_partition_columns(schema)
    base = root / kind
    # a store in an object store: its paths and file system (a local one: plain paths)
    return ds.dataset([getattr(p.path, "fs_path", str(p.path)) for p in parts],
                      schema=schema, format=fmt,
                      filesystem=getattr(base, "filesystem", None),
                      partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
                      partition_base_dir=getattr(base, "fs_path", str(base)))


