"""Compaction: sealed segments become zstd Parquet parts, atomically, while writers run.

For each stream, the oldest segments that no writer will append to again are read with
the stream's small trailing parts (the merge rule, `SMALL_PART_BYTES`), de-duplicated by
seq, sorted (metrics by key, step, seq) in bounded memory and written as one part under
a temporary name, fsynced and renamed into place; only then are the merged parts and the
segments deleted (the merged parts stay readable for a grace period, `replaced.py`). The
part's name gives the seq range it covers, so a reader never counts a record twice (a part
within another's range is skipped).

One compactor works on a stream at a time: it holds the stream's `.compacting` claim, which
names its host, boot, pid and start time, so a claim left by a killed compactor is known
stale at once on its host. Segments a part already holds (a kill between the rename and
the deletions) are deleted by the next compaction, and so are replaced parts once their
grace period is over. Runs start compaction by
themselves (`_ops/auto.py`); `compact()` is the same for a whole store, by hand.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError
from tracklake._format import (
    FORMAT_VERSION,
    SCHEMAS,
    StreamId,
    attempt_file,
    fsync_dir,
    part_name,
    stream_dir,
)
from tracklake._format.attempt import read_attempt
from tracklake._format.files import NotRegularFileError, scratch
from tracklake._format.liveness import writer_known_gone
from tracklake._format.part import SUMMARY_KEY, summary_json, write_part_file
from tracklake._format.segment import EOS
from tracklake._ops.claims import COMPACTING, hold_claim, remove_leftovers
from tracklake._ops.part_sources import PartSources
from tracklake._ops.replaced import Replaced, grace_seconds, replaced_parts
from tracklake._ops.sorted_part import write_sorted_part
from tracklake._read.location import existing_root
from tracklake._read.reader import Part, Segment, list_stream, list_streams

if TYPE_CHECKING:
    from tracklake._ops.bundle import BundleReport

#: A writer whose heartbeat is older than this is taken to be dead (its last segment
#: becomes compactable). Writers heartbeat every 30 s while they live.
STALE_AFTER_SECONDS = 3600.0
#: Segment bytes gathered into one part at most (memory does not depend on it: parts are
#: written in chunks, see sorted_part.py).
MAX_PART_SOURCE_BYTES = 1 << 30
#: Parts smaller than this are merged again with the records compacted after them (or,
#: when there are none, with each other): a finished stream ends with parts of at least
#: this size, and at most one smaller one.
SMALL_PART_BYTES = 32 << 20

SUMMARY_SQL = """
SELECT key, count(*) AS count, min(value) AS min, max(value) AS max,
       min(step) AS first_step, max(step) AS last_step,
       arg_max(value, (step, seq)) AS last_value, max(seq) AS last_seq,
       epoch_us(arg_max(time, (step, seq))) AS last_time_us
FROM batch GROUP BY key ORDER BY key
"""


@dataclass
class CompactionReport:
    """What one `compact()` call did (or, with dry_run, would do)."""

    parts_written: list[Path] = field(default_factory=list)
    segments_removed: list[Path] = field(default_factory=list)
    parts_merged: list[Path] = field(default_factory=list)  # merged into a new part
    parts_removed: list[Path] = field(default_factory=list)  # replaced, grace period over
    #: replaced parts kept readable for plain engines, each with when it may go (epoch s)
    parts_kept: list[tuple[Path, float]] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)  # streams another compactor was working on
    records: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    torn: list[tuple[Path, int]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    bundles: BundleReport | None = None  # small runs bundled (a whole store's compaction)


def writer_done(root: Path, s: StreamId, now: float) -> bool:
    """True if no writer will append to this stream again (`writer_known_gone`)."""
    try:
        record = read_attempt(attempt_file(root, s.project, s.run, s.rank, s.attempt))
    except FileNotFoundError:
        return False
    if record is None:
        return False
    return writer_known_gone(record, now, STALE_AFTER_SECONDS, root)


def _compactable(root: Path, s: StreamId, segments: list[Segment], now: float,
                 report: CompactionReport) -> list[Segment]:
    done = writer_done(root, s, now)
    chosen: list[Segment] = []
    for i, seg in enumerate(segments):
        followed = i + 1 < len(segments)
        if not (done or followed or _sealed(seg)):
            break  # the segment a live writer appends to
        chosen.append(seg)
    return chosen


def _sealed(seg: Segment) -> bool:
    """True if the segment ends with the end-of-stream marker after whole messages.

    Only the framing is walked (each message's length, its body skipped, nothing
    decoded or checksummed): compaction decodes and verifies every batch when it reads
    the segment, and a segment being appended to never ends with the marker."""
    try:
        with seg.path.open("rb") as f:
            f.seek(-len(EOS), os.SEEK_END)
            if f.read() != EOS:
                return False  # the common case: a live writer's segment
            size = f.tell()
            f.seek(0)
            end = 0  # where the last whole message ends
            for _ in pa.ipc.MessageReader.open_stream(pa.PythonFile(f, mode="r")):
                end = f.tell()
            return end == size - len(EOS)  # not the tail of a batch that reads like it
    except (OSError, ValueError, pa.ArrowException):
        return False  # torn or damaged: found and reported when it is read for compaction


def _sorted_for_parquet(kind: str, table: pa.Table) -> pa.Table:
    """`table` in the part's row order (a copy only if it is not in that order yet)."""
    if kind != "metrics":
        seq = table.column("seq").to_numpy()
        if bool(np.all(seq[1:] >= seq[:-1])):
            return table
    keys = [("key", "ascending"), ("step", "ascending"), ("seq", "ascending")] \
        if kind == "metrics" else [("seq", "ascending")]
    return table.take(pc.sort_indices(table, sort_keys=keys))


def metric_summary(table: pa.Table) -> list[dict[str, object]]:
    """Per-key count, min, max, first/last step and last value of a metrics table."""
    import duckdb  # imported on use: `import tracklake` stays light for training processes

    con = duckdb.connect()
    try:
        con.register("batch", table)
        rows = con.execute(SUMMARY_SQL).fetchall()
        names = [d[0] for d in con.description]
    finally:
        con.close()
    return [dict(zip(names, r, strict=True)) for r in rows]


def write_part(directory: Path, s: StreamId, table: pa.Table, last_segment: int) -> Path:
    """Write `table` (already de-duplicated, in any order) as a part, atomically; returns
    its path."""
    seqs = table.column("seq")
    first, last = pc.min(seqs).as_py(), pc.max(seqs).as_py()
    table = _sorted_for_parquet(s.kind, table)
    meta = {
        "tracklake.format": FORMAT_VERSION, "tracklake.kind": s.kind,
        "tracklake.project": s.project, "tracklake.run": s.run,
        "tracklake.rank": str(s.rank), "tracklake.attempt": str(s.attempt),
    }
    if s.kind == "metrics":
        meta[SUMMARY_KEY] = summary_json(metric_summary(table))
    table = table.replace_schema_metadata(meta)
    final = directory / part_name(first, last, last_segment)
    tmp = scratch(final)
    try:
        write_part_file(tmp, table, s.kind)
        os.replace(tmp, final)
    except BaseException:  # a full disk, or Ctrl-C in `tracklake compact`
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # the segments stay; nothing was removed
        raise
    fsync_dir(directory)
    return final


@contextlib.contextmanager
def _claim(root: Path, directory: Path, report: CompactionReport
           ) -> Iterator[Path | None]:
    """The stream's claim for this compactor, or None (noted in `report`) if another live
    compactor holds it."""
    with contextlib.ExitStack() as stack:
        try:
            claim = stack.enter_context(
                hold_claim(directory, leftovers=remove_leftovers, root=root))
        except NotRegularFileError as exc:  # a directory planted as its claim
            report.skipped.append((directory, str(exc.strerror)))
            claim = None
        else:
            if claim is None:
                report.busy.append(directory)
                report.skipped.append((directory, "another compaction is working on it (its "
                                       f"claim {directory / COMPACTING} names a live "
                                       "process)"))
        yield claim


def _compact_stream(root: Path, s: StreamId, now: float, dry_run: bool,
                    report: CompactionReport) -> None:
    if dry_run:
        _compact_claimed(root, s, now, dry_run, report)
        return
    if _idle(root, s, now, report):
        return  # not even claimed: a claim changes the directory's mtime (docs/concepts.md)
    with _claim(root, stream_dir(root, s), report) as claim:
        if claim is not None:
            _compact_claimed(root, s, now, dry_run, report, claim)


def _idle(root: Path, s: StreamId, now: float, report: CompactionReport) -> bool:
    """True if the stream has nothing to compact, merge or clean up: no segment, no
    segment consumed or replaced part past its grace period not yet removed, at most one
    small part at its end, and no temporary or claim (a dot name) left in its directory.
    Replaced parts still in their grace period are noted in `report`."""
    try:
        files = list_stream(root, s)
        names = os.listdir(stream_dir(root, s))
        replaced = replaced_parts(files, grace_seconds())
        busy = (files.segments or files.consumed or any(r.until <= now for r in replaced)
                or len(small_tail(files.parts)) > 1 or any(n.startswith(".") for n in names))
    except FileNotFoundError:
        return False  # changed under the listing: the claimed pass sees what is there
    if not busy:
        report.parts_kept.extend((r.part.path, r.until) for r in replaced)
    return not busy


def _compact_claimed(root: Path, s: StreamId, now: float, dry_run: bool,
                     report: CompactionReport, claim: Path | None = None) -> None:
    files = list_stream(root, s)
    grace = grace_seconds()
    _remove_consumed(files.consumed, replaced_parts(files, grace), now, dry_run, report)
    todo = _compactable(root, s, files.segments, now, report)
    tail = small_tail(files.parts)
    last = max((p.last_seq for p in files.parts), default=-1)
    while todo or len(tail) > 1:
        group: list[Segment] = []
        size = 0
        while todo and (not group or size + todo[0].path.stat().st_size
                        <= MAX_PART_SOURCE_BYTES):
            group.append(todo.pop(0))
            size += group[-1].path.stat().st_size
        merging, tail = tail, []
        sources = PartSources(s, merging, group, last, report)
        try:
            part = _write(root, s, sources, dry_run, claim)
        except FormatError as exc:
            if not merging:
                raise
            # a merged part does not verify: keep it for `fsck`, compact the segments alone
            report.skipped.append((merging[0].path.parent, f"not merged: {exc}"))
            sources = sources.without_parts()
            part = _write(root, s, sources, dry_run, claim)
        last = max(last, sources.last)
        _account(sources, part, dry_run, report)
        if not dry_run:
            _remove_sources(stream_dir(root, s), sources, part, grace, report)
        if sources.stopped:
            return  # a damaged segment: compact nothing past it


def _write(root: Path, s: StreamId, sources: PartSources, dry_run: bool,
           claim: Path | None) -> Path | None:
    """The part made of `sources` (None if they hold no record, or in a dry run)."""
    if dry_run:
        for _ in sources.batches():
            pass
        return None

    def touch() -> None:
        """Still working: the claim's age stays small."""
        if claim is not None:
            os.utime(claim)

    touch()
    return write_sorted_part(stream_dir(root, s), s, sources.batches(),
                             sources.last_segment, touch)


def _account(sources: PartSources, part: Path | None, dry_run: bool,
             report: CompactionReport) -> None:
    if dry_run or part is not None:  # else only a damaged first segment's records were read
        report.records += sources.records
    report.bytes_before += sum(g.path.stat().st_size for g in sources.used)
    report.bytes_before += sum(p.path.stat().st_size for p in sources.parts)
    report.segments_removed.extend(g.path for g in sources.used)
    report.parts_merged.extend(p.path for p in sources.parts if p.path != part)
    if part is not None:
        report.parts_written.append(part)
        report.bytes_after += part.stat().st_size


def _remove_sources(directory: Path, sources: PartSources, part: Path | None,
                    grace: float, report: CompactionReport) -> None:
    """Delete the segments the new part holds (it is renamed into place and its directory
    fsynced already). The parts merged into it stay for their grace period, a plain engine
    may have listed them before the rename (`replaced.py`); with none, they go too."""
    if part is None:
        merged, until = [], 0.0  # nothing was written: nothing is replaced
    else:
        merged, until = [p.path for p in sources.parts if p.path != part], \
            part.stat().st_mtime + grace
    gone = merged if grace <= 0 else []
    report.parts_kept.extend((path, until) for path in merged if path not in gone)
    report.parts_removed.extend(gone)
    for old in gone + [g.path for g in sources.used]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    if sources.used or gone:
        fsync_dir(directory)


def _remove_consumed(consumed: list[Segment], replaced: list[Replaced], now: float,
                     dry_run: bool, report: CompactionReport) -> None:
    """Delete the segments a part already holds (left by a compactor killed between
    writing the part and deleting them) and the replaced parts whose grace period is
    over; readers skip both anyway. Replaced parts still in theirs are noted."""
    gone = [r.part for r in replaced if r.until <= now]
    report.parts_kept.extend((r.part.path, r.until) for r in replaced if r.until > now)
    for seg in consumed:
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                seg.path.unlink()
        report.segments_removed.append(seg.path)
    for part in gone:
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                part.path.unlink()
        report.parts_removed.append(part.path)
    if (consumed or gone) and not dry_run:
        fsync_dir((consumed[0].path if consumed else gone[0].path).parent)


def small_tail(parts: list[Part]) -> list[Part]:
    """The stream's last parts (in seq order) that are each under SMALL_PART_BYTES: merged
    with the next records compacted, or with each other, so few files remain."""
    tail: list[Part] = []
    for part in reversed(parts):
        if part.path.stat().st_size >= SMALL_PART_BYTES:
            break
        tail.insert(0, part)
    return tail


def compact(*, root: str | os.PathLike[str] | None = None, project: str | None = None,
            run: str | None = None, kinds: Iterable[str] = tuple(SCHEMAS),
            dry_run: bool = False,
            progress: Callable[[int, int | None, str], None] | None = None
            ) -> CompactionReport:
    """Compact every sealed segment of the store (or of one project / run) into Parquet.

    `progress(done, total, note)` is called after each stream (done and total count
    streams; note names the stream). Over a whole store it then bundles the small settled
    runs (store/_ops/bundle.py), unless another builder is at it."""
    root_path = existing_root(root)  # never writes .cache/ into a directory that is no store
    streams = list_streams(root_path, project, run, tuple(kinds))
    report = compact_streams(root_path, streams, dry_run=dry_run, progress=progress)
    if project is None and run is None and not dry_run and "metrics" in kinds:
        from tracklake._ops.bundle import build_bundles

        report.bundles = build_bundles(root_path)
    return report


def compact_streams(root: Path, streams: Iterable[StreamId], *, dry_run: bool = False,
                    progress: Callable[[int, int | None, str], None] | None = None
                    ) -> CompactionReport:
    """Compact the sealed segments of `streams` (and merge their small parts);
    `progress` as in `compact`."""
    report = CompactionReport()
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    streams = list(streams)
    for done, s in enumerate(streams, 1):
        try:
            _compact_stream(root, s, now, dry_run, report)
        except FileNotFoundError:
            directory = stream_dir(root, s)
            if directory.is_dir():
                raise
            # retention (or a user) removed the run while it was listed or compacted: its
            # segments were never deleted by us before their part was in place
            report.skipped.append((directory, "removed while compaction ran"))
        if progress is not None:
            progress(done, len(streams), f"{s.project}/{s.run} {s.key()}")
    return report
