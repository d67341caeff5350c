"""Building bundles (store/_read/bundles.py): the metric parts of many small settled runs
copied into one Parquet file per group of runs, so that questions over thousands of
small runs open a few files. ``python -m tracklake._ops.bundle ROOT`` is the builder a
reader starts; `tracklake compact` over a whole store builds them too.

The builder holds a claim on the bundle directory (one builder at a time, a dead one's
claim broken as a compactor's is), brings the run catalog up to date a file at a time
(`catalog_pass`: what it holds of the store is a few columns a run), deletes the
bundles the catalog no longer vouches for, and bundles the settled runs of at most
`RUN_MAX_VALUES` values that no bundle holds, per project, at most `BUNDLE_MAX_VALUES`
values and `BUNDLE_MAX_PARTS` parts per bundle (the builder sorts one bundle in memory)
and only groups of at least `BUNDLE_MIN_RUNS` runs (fewer would save little for the
bytes a bundle adds). Killed at any point, it leaves at most a temporary file, which the
next builder removes. A group whose parts change or go while it is copied (retention, a
resumed run) is not kept.
`TRACKLAKE_BUNDLES=0` (`false`, `no`, `off`) builds none (the builder a reader starts then
only brings the run catalog up to date); retention deletes the bundles
that hold a run it drops or thins (`forget_run`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, SCHEMAS
from tracklake._format.columns import booleans, combined, numpy_of, strings
from tracklake._format.files import (
    NotRegularFileError,
    fsync_dir,
    scratch,
    store_dir,
    write_atomic,
)
from tracklake._format.layout import parse_part_name, stream_of_file
from tracklake._format.part import read_part_table, write_part_stream
from tracklake._format.temporaries import remove_files
from tracklake._ops.catalog_pass import settled_runs
from tracklake._ops.claims import hold_claim, remove_leftovers, touch_claim
from tracklake._read.bundles import (
    BUNDLE_DIR,
    BUNDLE_KEY,
    BUNDLE_ORDER,
    CHECKED,
    Bundle,
    bundle_paths,
    bundle_schema,
    bundles_found,
    checked_marker,
    enabled,
    read_bundle,
)
from tracklake._read.catalog import mtime_ns
from tracklake._read.location import regular_file_at
from tracklake._read.snapshot import with_partitions

#: A run is bundled if its metric parts hold at most this many values.
RUN_MAX_VALUES = 1 << 16
#: A bundle holds at most this many values (sorted in memory: ≈ 50 bytes each).
BUNDLE_MAX_VALUES = 4_000_000
#: ... and at most this many parts, each read as a table of its own (about 12 KB each
#: held: a bundle of 50,000 tiny runs held 0.6 GB, one of a million would have 12 GB).
BUNDLE_MAX_PARTS = 8192
#: A group of fewer runs is not bundled (yet).
BUNDLE_MIN_RUNS = 32
#: The project a bundle names when it holds the runs of several projects: those too few
#: in their own project to make a group (no project has this name: it is empty). A
#: question about one project reads its own parts, never such a bundle.
POOLED = ""


@dataclass
class BundleReport:
    """What one `build_bundles` call did."""

    written: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)  # no longer vouched for
    runs: int = 0  # runs bundled by this call
    values: int = 0
    bytes: int = 0  # of the bundles written
    busy: bool = False  # another builder held the claim
    changed: int = 0  # groups not kept: a source changed or went while it was copied
    damaged: list[str] = field(default_factory=list)  # parts that failed to read: not bundled
    disabled: bool = False  # TRACKLAKE_BUNDLES is off
    refused: str | None = None  # why the bundle directory was not used (a link there)


def build_bundles(root: Path, touch: Callable[[], None] | None = None,
                  catalog_if_off: bool = False) -> BundleReport:
    """Bundle the store's small settled runs that no bundle holds (see the module); with
    bundles off, nothing, or (`catalog_if_off`: a builder a reader started for runs not
    catalogued) bring the run catalog up to date alone. Its claim, and whatever `touch`
    refreshes, are touched as each step ends: another host takes a claim it watched
    stand still for `CLAIM_STALE_SECONDS` for a dead holder's, and a build of many runs
    can last longer."""
    report = BundleReport()
    report.disabled = not enabled()
    if report.disabled and not catalog_if_off:
        return report
    directory = root / BUNDLE_DIR
    try:
        store_dir(root, directory)
    except NotRegularFileError as exc:  # bundles only save time: compaction is done
        report.refused = exc.strerror
        return report
    with hold_claim(directory, leftovers=_leftovers, root=root) as claim:
        if claim is None:
            report.busy = True
            return report

        held = claim

        def progress() -> None:
            touch_claim(held)
            if touch is not None:
                touch()

        started = time.time()
        settled, named = settled_runs(root, progress)
        if report.disabled:
            _checked(root, started, left_out=0, uncatalogued=named - settled.num_rows)
            return report
        kept, covered = _usable(bundles_found(root), settled)
        for path in set(bundle_paths(root)) - {b.path for b in kept}:
            try:
                path.unlink(missing_ok=True)
            except PermissionError:  # another user's, in a shared store: stays unused
                continue
            report.removed.append(path)
        runs, files = _candidates(settled, covered)
        for project, group in _groups(runs):
            written = None
            while len(group) >= BUNDLE_MIN_RUNS:
                sources = sorted((p, files[p]) for _, parts, _ in group for p in parts)
                try:
                    written = _write_bundle(root, project, sources)
                    break
                except _Damaged as exc:  # a damaged part: its run stays out (fsck's job)
                    report.damaged.append(exc.path)
                    group = [g for g in group if exc.path not in g[1]]
            if written is None:
                if len(group) >= BUNDLE_MIN_RUNS:  # else too few left once damage is out
                    report.changed += 1
                continue
            progress()
            report.written.append(written)
            report.bytes += written.stat().st_size
            report.runs += len(group)
            report.values += sum(values for *_, values in group)
        _checked(root, started, left_out=settled.num_rows - _runs_of_parts(covered)
                 - report.runs, uncatalogued=named - settled.num_rows)
    return report


def _checked(root: Path, started: float, left_out: int, uncatalogued: int) -> None:
    """Mark a builder's pass done: what a reader compares its counts of settled runs not
    in a bundle (`left_out`) and of runs not catalogued (`uncatalogued`) with."""
    write_atomic(root / BUNDLE_DIR / CHECKED, json.dumps({
        "left_out": left_out, "uncatalogued": uncatalogued, "started": started,
        "ended": time.time()}).encode(), root=root)


def last_build(root: Path) -> tuple[float, float]:
    """(began, ended) of the last builder to finish, as epoch seconds; (0, 0) if none did
    (or its marker is not ours to read)."""
    marker = checked_marker(root)
    began, ended = marker.get("started", 0.0), marker.get("ended", 0.0)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in (began, ended)):
        return 0.0, 0.0
    return float(began), float(ended)


_Candidate = tuple[str, list[str], int]  # run, its parts, values in them


def _usable(found: list[Bundle], settled: pa.Table) -> tuple[list[Bundle], pa.Array]:
    """The bundles a reader uses (`usable`, decided here in columns: the catalog's
    paths of a store of 420,561 runs as a dict held 250 MB): those whose every source
    part is settled with the mtime it had when bundled, but one holding a part a bundle
    before it holds; and the parts they hold."""
    if not found:
        return [], strings([])
    lengths = [len(b.sources) for b in found]
    paths = strings([p for b in found for p, _ in b.sources])
    recorded = np.fromiter((m for b in found for _, m in b.sources), np.int64, sum(lengths))
    at = pc.index_in(paths, value_set=combined(settled.column("parts")).flatten())
    now = combined(settled.column("mtimes")).flatten().take(at)
    same = numpy_of(pc.is_valid(now)) & (numpy_of(now, null=0) == recorded)
    owner = np.repeat(np.arange(len(found)), lengths)
    whole = np.bincount(owner[~same], minlength=len(found)) == 0
    if len(pc.unique(paths.filter(booleans(whole[owner])))) < int(
            np.sum(np.asarray(lengths)[whole])):  # a part in two bundles: the first keeps it
        held: set[str] = set()
        for i, bundle in enumerate(found):
            whole[i] = whole[i] and held.isdisjoint(bundle.paths)
            held |= bundle.paths if whole[i] else frozenset()
    return [b for b, kept in zip(found, whole, strict=True) if kept], \
        paths.filter(booleans(whole[owner]))


def _runs_of_parts(parts: pa.Array) -> int:
    """How many runs the metric part paths `parts` are of (`covered_runs`)."""
    runs = pc.replace_substring_regex(parts, pattern="/[^/]*/[^/]*/[^/]*$", replacement="")
    return len(pc.unique(runs))


def _candidates(settled: pa.Table, covered: pa.Array
                ) -> tuple[list[tuple[str, str, list[str], int]], dict[str, int]]:
    """The settled runs that may be bundled: some parts, at most `RUN_MAX_VALUES`
    values, none of them in a bundle (`covered`), each part's mtime known; as (project,
    run, parts, values), with their parts' mtimes."""
    parts = combined(settled.column("parts"))
    flat = parts.flatten()
    owner = numpy_of(pc.list_parent_indices(parts))
    bundled = numpy_of(pc.is_in(flat, value_set=covered))
    mtimes = combined(settled.column("mtimes"))
    unknown = ~numpy_of(pc.is_valid(mtimes.flatten()))
    n = settled.num_rows
    chosen = (numpy_of(pc.list_value_length(parts)) > 0) \
        & (numpy_of(settled.column("values")) <= RUN_MAX_VALUES) \
        & (np.bincount(owner[bundled | unknown], minlength=n) == 0)
    rows = settled.filter(booleans(chosen))
    runs = list(zip(*(rows.column(c).to_pylist() for c in ("project", "run", "parts",
                                                            "values")), strict=True))
    files = dict(zip(combined(rows.column("parts")).flatten().to_pylist(),
                     combined(rows.column("mtimes")).flatten().to_pylist(), strict=True))
    return runs, files


def _groups(runs: list[tuple[str, str, list[str], int]]
            ) -> list[tuple[str, list[_Candidate]]]:
    """Per project, the runs (`_candidates`) in groups of at most `BUNDLE_MAX_VALUES`
    values and `BUNDLE_MAX_PARTS` parts and at least `BUNDLE_MIN_RUNS` runs; then the
    runs left over (a project of too few runs, the last runs of a larger one), pooled
    across projects in groups made alike, named `POOLED`: a store of many small projects
    would otherwise have no bundle at all."""
    by_project: dict[str, list[_Candidate]] = {}
    for project, run, parts, values in sorted(runs):
        by_project.setdefault(project, []).append((run, parts, values))
    groups: list[tuple[str, list[_Candidate]]] = []
    left: list[_Candidate] = []
    for project, candidates in by_project.items():
        made, rest = _grouped(candidates)
        groups.extend((project, g) for g in made)
        left.extend(rest)
    groups.extend((POOLED, g) for g in _grouped(left)[0])
    return groups


def _grouped(candidates: list[_Candidate]
             ) -> tuple[list[list[_Candidate]], list[_Candidate]]:
    """`candidates` in groups of at most `BUNDLE_MAX_VALUES` values and
    `BUNDLE_MAX_PARTS` parts, in order, and the last group instead if it is of fewer
    than `BUNDLE_MIN_RUNS` runs."""
    groups: list[list[_Candidate]] = []
    group: list[_Candidate] = []
    total = parts = 0
    for candidate in candidates:
        if group and (total + candidate[2] > BUNDLE_MAX_VALUES
                      or parts + len(candidate[1]) > BUNDLE_MAX_PARTS):
            groups.append(group)
            group, total, parts = [], 0, 0
        group.append(candidate)
        total += candidate[2]
        parts += len(candidate[1])
    if len(group) >= BUNDLE_MIN_RUNS:
        return [*groups, group], []
    return groups, group


class _Damaged(Exception):
    """A source part failed to read (its pages or footer do not verify)."""

    def __init__(self, path: str, cause: FormatError) -> None:
        super().__init__(f"{path}: {cause}")
        self.path = path


def _unchanged(root: Path, sources: list[tuple[str, int]]) -> bool:
    return all(mtime_ns(root, path) == mtime for path, mtime in sources)


def _write_bundle(root: Path, project: str, sources: list[tuple[str, int]]) -> Path | None:
    """Copy the metric parts `sources` (relative paths, mtimes) into one bundle, written
    to a temporary name and renamed into place; returns its path, or None if a source
    changed or went meanwhile (checked again once the bundle is in place, so that one
    that raced retention's `forget_run` is deleted by the one or the other)."""
    tables = []
    for path, mtime in sources:
        # exactly metrics/project=P/run=R/rank=N/attempt=N/part-….parquet: no listing
        # gives another shape (one through "..", say, under directories named right)
        names = path.split("/")
        stream = stream_of_file(root / path, "metrics") if len(names) == 6 and \
            names[0] == "metrics" and (names[1] == f"project={project}" or (
                project == POOLED and names[1].startswith("project="))) and \
            parse_part_name(names[5]) is not None else None
        if stream is None:
            raise _Damaged(path, FormatError(f"{path}: not where a part of {project} lies"))
        if not regular_file_at(root, path):  # a catalog planted, naming a link or a FIFO
            raise _Damaged(path, FormatError(
                f"{path}: a link, reached through one, or not a regular file"))
        try:
            table = read_part_table(root / path)
        except FileNotFoundError:
            return None
        except FormatError as exc:
            raise _Damaged(path, exc) from exc
        if mtime_ns(root, path) != mtime:
            return None
        tables.append((table.select(SCHEMAS["metrics"].names).cast(SCHEMAS["metrics"]),
                       stream))
    table = with_partitions(tables, "metrics").cast(bundle_schema())
    table = table.sort_by([(c, "ascending") for c in BUNDLE_ORDER])
    manifest = json.dumps({"project": project, "sources": sources}, separators=(",", ":"))
    digest = hashlib.sha256(manifest.encode()).hexdigest()[:24]
    table = table.replace_schema_metadata({
        "tracklake.format": FORMAT_VERSION, "tracklake.kind": "metrics",
        BUNDLE_KEY: manifest})
    directory = root / BUNDLE_DIR
    final = directory / f"bundle-{digest}.parquet"
    tmp = scratch(final, ".part-")
    try:
        write_part_stream(tmp, table.schema, [table], "metrics", order=BUNDLE_ORDER,
                          few_pages=True)
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(directory)
    if not _unchanged(root, sources):
        with contextlib.suppress(FileNotFoundError):
            final.unlink()
        return None
    return final


#: A bundle written aside (`scratch(final, ".part-")`) before it is renamed into place.
_BUNDLE_TMP = re.compile(r"^\.part-bundle-[0-9a-f]+\.parquet\.[0-9a-f]{12}\.\d+\.tmp$")


def _leftovers(directory: Path, now: float) -> None:
    """`remove_leftovers`, and every bundle written aside: only the holder of the bundle
    directory's claim writes one, so one found by the next holder was left by a builder
    that died, however recently and on whichever host (a part's temporary elsewhere is
    left for `CLAIM_STALE_SECONDS`, as unpack writes those without a claim)."""
    remove_leftovers(directory, now)
    remove_files(directory, lambda path: _BUNDLE_TMP.match(path.name) is not None)


def forget_run(root: Path, project: str, run: str) -> list[Path]:
    """Delete the bundles holding a part of run `run` of `project` (retention dropped or
    thinned it: no copy may keep what the store no longer has); returns them. A bundle
    whose footer cannot be read is deleted too: it is a derived copy."""
    prefix = f"metrics/project={project}/run={run}/"
    removed = []
    for path in bundle_paths(root):
        try:
            holds = any(p.startswith(prefix) for p in read_bundle(path).paths)
        except FileNotFoundError:
            continue
        except (FormatError, OSError):
            holds = True
        if holds:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path)
    if removed:
        fsync_dir(root / BUNDLE_DIR)
    return removed


def background_main(argv: list[str], module: str, work: Callable[[Path], object],
                    what: str) -> int:
    """The entry point of a low-priority process `python -m MODULE ROOT` that does `work`
    on the store at ROOT: exit status 0, 1 if `work` failed (said on stderr as the failure
    of `what` under ROOT, which only costs readers time), 2 on a wrong command line."""
    if len(argv) != 1:
        print(f"usage: python -m {module} ROOT", file=sys.stderr)
        return 2
    with contextlib.suppress(OSError):
        os.nice(19)
    try:
        work(Path(argv[0]))
    except Exception as exc:  # derived files only save time: the parts answer without them
        print(f"tracklake: {what} under {argv[0]} failed: {exc.__class__.__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """Entry point: ROOT (`background_main`)."""
    return background_main(argv, "tracklake._ops.bundle",
                           partial(build_bundles, catalog_if_off=True),
                           "bundling small runs")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
