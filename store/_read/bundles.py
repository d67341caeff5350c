"""Bundles: derived copies of many small settled runs' metric parts in one Parquet file,
so that a question over thousands of small runs opens a few files instead of one or more
per run.

``ROOT/.cache/bundles/bundle-<digest>.parquet`` holds the rows of the metric parts it
names, with the partition columns (project, run, rank, attempt) stored as columns, sorted
by `BUNDLE_ORDER`, written as parts are (page checksums, page index, footer CRC-32). Its
footer's ``tracklake.bundle`` metadata names its project and its source parts, each with
the modification time it had. A reader uses a bundle in place of those parts only while
the run catalog vouches for every one of them with that same mtime (the run is settled
and unchanged, docs/concepts.md): a run dropped, merged, resumed or written again under
its old name makes the bundle unused, and its runs are read from their own parts.

Like the catalog, bundles are never the only copy of anything: delete them at any time.
Training ranks never touch them; they are built by `tracklake compact` over a whole store,
by the deriver a finished run's compactor starts (`store/_ops/derive.py`), and by a
low-priority process a reader starts when it finds many settled runs not yet bundled
(`store/_ops/bundle.py`) or many runs the run catalog does not vouch for yet, one
builder at a time (a claim on the directory); `TRACKLAKE_BUNDLES=0` turns building off
(a builder a reader starts then brings the run catalog up to date alone). Retention
deletes the bundles holding a run it drops or thins. A bundle found damaged is deleted
and the question asked again without it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._errors import FormatError
from tracklake._format import SCHEMAS, bounded_json
from tracklake._format.files import read_state
from tracklake._format.part import open_part
from tracklake._format.schema import with_partition_columns
from tracklake._format.store_clock import store_now_ns
from tracklake._format.switches import switched_on
from tracklake._read.kept import Kept
from tracklake._read.location import through_no_link

#: Where bundles live, relative to the store root (a dot directory: globs over the kinds,
#: hive discovery and backups pass over it).
BUNDLE_DIR = Path(".cache") / "bundles"
#: Footer metadata key of a bundle's project and sources.
BUNDLE_KEY = "tracklake.bundle"
#: A bundle's sort order: a question for one key reads that key's row groups only.
BUNDLE_ORDER = ("key", "project", "run", "rank", "attempt", "step", "seq")
#: A reader starts a builder when at least this many settled runs are not bundled beyond
#: those the last builder left out (too large, or too few in their project), or this
#: many runs are not catalogued beyond those it left out (not settled)...
BUILD_MIN_RUNS = 64
#: ... and no builder looked at the store in the last this many seconds (the builder
#: writes `CHECKED` when it is done, whether it bundled anything or not, with the number
#: of settled runs it left out and of runs it did not catalog). Short: runs a builder
#: found too fresh to bundle (a sweep that just ended) are bundled by the next, and
#: until then every question over them opens each of their parts (1,000 runs: about 1 s
#: a dashboard chart, against 0.05 s).
BUILD_EVERY_SECONDS = 30.0
CHECKED = ".checked"
#: The module run as the builder.
BUILD_MODULE = "tracklake._ops.bundle"


@dataclass(frozen=True)
class Bundle:
    path: Path
    project: str
    sources: tuple[tuple[str, int], ...]  # part paths relative to the root, their mtimes

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(p for p, _ in self.sources)


def bundle_schema() -> pa.Schema:
    """A bundle's columns: a metric record's and its partition columns."""
    return with_partition_columns(SCHEMAS["metrics"])


def read_bundle(path: Path) -> Bundle:
    """The bundle at `path`, its footer and columns verified; `FormatError` if it is not
    one (a file of other columns would fail every question that read it)."""
    parquet = open_part(path)
    if not parquet.schema_arrow.remove_metadata().equals(bundle_schema()):
        raise FormatError(f"{path}: not a bundle: its columns are {parquet.schema_arrow}")
    raw = (parquet.metadata.metadata or {}).get(BUNDLE_KEY.encode())
    try:
        meta = bounded_json.loads(raw) if raw else None
        sources = tuple((str(p), int(m)) for p, m in meta["sources"])  # type: ignore[index]
        return Bundle(path, str(meta["project"]), sources)  # type: ignore[index]
    except (ValueError, TypeError, KeyError) as exc:
        raise FormatError(f"{path}: not a bundle ({exc})") from exc


#: Bundles this process read and verified: a builder writes a bundle to a temporary name
#: and renames it into place, and never changes one (10,000 runs: 8 footers, 15 ms a
#: question). Its pages are verified when a question reads them, as before.
_read_before: Kept[Bundle] = Kept(256)


def known_bundle(path: Path) -> Bundle:
    """`read_bundle(path)`, kept while the file is the one read then (`Kept`)."""
    st = os.stat(path)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    bundle = _read_before.get(str(path), identity)
    if bundle is None:
        bundle = read_bundle(path)
        _read_before.keep(path.parents[2], str(path), st, identity, bundle)
    return bundle


def bundle_paths(root: Path) -> list[Path]:
    """The bundle files of the store, in name order (none if there is no directory)."""
    if not through_no_link(root, BUNDLE_DIR.as_posix()):
        return []  # a directory planted as a link: what it leads to is not the store's
    try:
        names = sorted(os.listdir(root / BUNDLE_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [root / BUNDLE_DIR / n for n in names
            if n.startswith("bundle-") and n.endswith(".parquet")]


def bundles_found(root: Path) -> list[Bundle]:
    """The store's bundles that read as bundles (`known_bundle`), in name order."""
    found: list[Bundle] = []
    for path in bundle_paths(root):
        try:
            found.append(known_bundle(path))
        except (FormatError, OSError):
            continue  # damaged, or removed since the listing: the next builder replaces it
    return found


#: `usable`'s last answer, with what it was made of: the catalog's paths (the very
#: dict, which a process keeps while the catalog stays settled), the project and the
#: bundles (the very objects `known_bundle` keeps). 10,000 runs: 5 ms a question.
_usable_before: list[tuple[dict[str, int], str | None, list[Bundle],
                           tuple[list[Bundle], frozenset[str]]]] = []


def usable(root: Path, files: dict[str, int], project: str | None
           ) -> tuple[list[Bundle], frozenset[str]]:
    """The bundles (of `project`, if given) whose sources all have, in `files` (the run
    catalog's settled parts and their mtimes), the mtime they had when bundled, no two
    holding the same part; and the parts they hold. Callers change neither."""
    found = bundles_found(root)
    for before in _usable_before:
        if before[0] is files and before[1] == project and len(before[2]) == len(found) \
                and all(a is b for a, b in zip(before[2], found, strict=True)):
            return before[3]
    chosen: list[Bundle] = []
    covered: set[str] = set()
    for bundle in found:
        if project is not None and bundle.project != project:
            continue
        if all(files.get(p) == m for p, m in bundle.sources) and \
                covered.isdisjoint(bundle.paths):
            chosen.append(bundle)
            covered |= bundle.paths
    answer = (chosen, frozenset(covered))
    _usable_before[:] = [(files, project, found, answer)]
    return answer


@functools.lru_cache(maxsize=2)
def covered_runs(covered: frozenset[str]) -> frozenset[str]:
    """The run directories (``metrics/project=P/run=R``) of bundled parts."""
    return frozenset(p.rsplit("/", 3)[0] for p in covered)


def enabled() -> bool:
    """Whether bundles are built: the TRACKLAKE_BUNDLES variable (`0`, `false`, `no`,
    `off`: never; ValueError naming it for a value neither on nor off), else yes.
    Bundles already built are read either way."""
    return switched_on("TRACKLAKE_BUNDLES")


_builders: dict[str, Any] = {}


def checked_marker(root: Path) -> dict[str, Any]:
    """The last builder's `CHECKED` marker as it wrote it; {} if there is none, or none
    ours to read (a link, a FIFO, damaged, not an object)."""
    try:
        marker = bounded_json.loads(read_state(root, f"{BUNDLE_DIR.as_posix()}/{CHECKED}",
                                               4096))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def _count(marker: dict[str, Any], field: str) -> int:
    """A count the marker holds (0 if it holds none that is a count)."""
    value = marker.get(field)
    return value if isinstance(value, int) and value >= 0 else 0


def start_builder(root: Path, unbundled_runs: int = 0, uncatalogued_runs: int = 0) -> bool:
    """Start a detached, low-priority builder for the store at `root` if `unbundled_runs`
    settled runs (bundles on), or `uncatalogued_runs` runs the run catalog does not vouch
    for, are at least `BUILD_MIN_RUNS` more than the last builder left out (of the
    bundles; of the catalog), none of this process's builders for it is still running,
    and no builder finished looking less than `BUILD_EVERY_SECONDS` ago. Never waits for
    it; False if none was started."""
    key = str(root)
    unbundled_runs = unbundled_runs if enabled() else 0
    if max(unbundled_runs, uncatalogued_runs) < BUILD_MIN_RUNS or not sys.executable or \
            not os.access(root, os.W_OK):
        return False  # too few to pay, no Python to start, or a store it cannot write
    running = _builders.get(key)
    if running is not None and running.poll() is None:
        return False
    try:
        checked = os.stat(root / BUNDLE_DIR / CHECKED).st_mtime
    except FileNotFoundError:
        checked = 0.0
    except OSError:
        return False
    # by the store's clock: on a host behind the file server, `checked` is always ahead
    if store_now_ns(root) / 1e9 - checked < BUILD_EVERY_SECONDS:
        return False
    marker = checked_marker(root)
    if unbundled_runs - _count(marker, "left_out") < BUILD_MIN_RUNS and \
            uncatalogued_runs - _count(marker, "uncatalogued") < BUILD_MIN_RUNS:
        return False
    try:
        _builders[key] = subprocess.Popen(
            [sys.executable, "-m", BUILD_MODULE, key], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return False  # bundles only save time
    return True
