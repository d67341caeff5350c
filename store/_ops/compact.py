"""Compaction: sealed segments become zstd Parquet parts, atomically, while writers run.

For each stream, the oldest segments that no writer will append to again are read,
de-duplicated by seq, sorted (metrics by key, step, seq) and written as one part under a
temporary name, fsynced and renamed into place; only then are the segments deleted. The
part's name gives the seq range it covers, so a reader never counts a record twice.

One compactor works on a stream at a time: it holds the stream's `.compacting` claim, which
names its host, boot, pid and start time, so a claim left by a killed compactor is known
stale at once on its host. Segments a part already holds (a kill between the rename and
the deletions) are deleted by the next compaction.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import (
    FORMAT_VERSION,
    SCHEMAS,
    StreamId,
    attempt_file,
    fsync_dir,
    part_name,
    stream_dir,
)
from tracklake._format.attempt import attempt_numbers, read_attempt
from tracklake._format.naming import resolve_root
from tracklake._format.part import write_part_file
from tracklake._format.segment import SegmentContents, read_segment
from tracklake._ops.claims import hold_claim
from tracklake._read.reader import Segment, after_seq, list_stream, list_streams

#: A writer whose heartbeat is older than this is taken to be dead (its last segment
#: becomes compactable). Writers heartbeat every 30 s while they live.
STALE_AFTER_SECONDS = 3600.0
#: Segment bytes gathered into one part at most.
MAX_PART_SOURCE_BYTES = 256 << 20

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
    records: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    torn: list[tuple[Path, int]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def _writer_done(root: Path, s: StreamId, now: float) -> bool:
    """True if no writer will append to this stream again."""
    rank_dir = attempt_file(root, s.project, s.run, s.rank, s.attempt).parent
    if any(n > s.attempt for n in attempt_numbers(rank_dir)):
        return True  # a later attempt of this rank started: this one's writer is gone
    try:
        record = read_attempt(attempt_file(root, s.project, s.run, s.rank, s.attempt))
    except FileNotFoundError:
        return False
    if record is None:
        return False
    if record.get("status") != "running":
        return True
    beat = _dt.datetime.fromisoformat(record["heartbeat_at"]).timestamp()
    return now - beat > STALE_AFTER_SECONDS


def _compactable(root: Path, s: StreamId, segments: list[Segment], now: float,
                 report: CompactionReport) -> list[Segment]:
    done = _writer_done(root, s, now)
    chosen: list[Segment] = []
    for i, seg in enumerate(segments):
        followed = i + 1 < len(segments)
        if not (done or followed or _sealed(seg)):
            break  # the segment a live writer appends to
        chosen.append(seg)
    return chosen


def _sealed(seg: Segment) -> bool:
    try:
        return read_segment(seg.path).sealed
    except NewerFormatError:
        raise
    except FormatError:
        return False  # a damaged header: found and reported when it is read for compaction


def _sorted_for_parquet(kind: str, table: pa.Table) -> pa.Table:
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
    """Write `table` (already de-duplicated) as a part, atomically; returns its path."""
    first, last = table.column("seq")[0].as_py(), table.column("seq")[-1].as_py()
    table = _sorted_for_parquet(s.kind, table)
    meta = {
        "tracklake.format": FORMAT_VERSION, "tracklake.kind": s.kind,
        "tracklake.project": s.project, "tracklake.run": s.run,
        "tracklake.rank": str(s.rank), "tracklake.attempt": str(s.attempt),
    }
    if s.kind == "metrics":
        meta["tracklake.summary"] = json.dumps(metric_summary(table), allow_nan=True)
    table = table.replace_schema_metadata(meta)
    final = directory / part_name(first, last, last_segment)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    try:
        write_part_file(tmp, table, s.kind)
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # the segments stay; nothing was removed
        raise
    fsync_dir(directory)
    return final


@contextlib.contextmanager
def _claim(directory: Path, report: CompactionReport) -> Iterator[Path | None]:
    """The stream's claim for this compactor, or None (noted in `report`) if another live
    compactor holds it."""
    with hold_claim(directory) as claim:
        if claim is None:
            report.skipped.append((directory, "another compaction is working on it (its "
                                   f"claim {directory / '.compacting'} names a live process)"))
        yield claim


def _compact_stream(root: Path, s: StreamId, now: float, dry_run: bool,
                    report: CompactionReport) -> None:
    if dry_run:
        _compact_claimed(root, s, now, dry_run, report)
        return
    with _claim(stream_dir(root, s), report) as claim:
        if claim is not None:
            _compact_claimed(root, s, now, dry_run, report, claim)


def _compact_claimed(root: Path, s: StreamId, now: float, dry_run: bool,
                     report: CompactionReport, claim: Path | None = None) -> None:
    files = list_stream(root, s)
    _remove_consumed(files.consumed, dry_run, report)
    last = max((p.last_seq for p in files.parts), default=-1)
    todo = _compactable(root, s, files.segments, now, report)
    while todo:
        group: list[Segment] = []
        size = 0
        while todo and (not group or size + todo[0].path.stat().st_size
                        <= MAX_PART_SOURCE_BYTES):
            seg = todo.pop(0)
            group.append(seg)
            size += seg.path.stat().st_size
        batches = []
        for seg in group:
            try:
                contents = read_segment(seg.path)
            except NewerFormatError:
                raise
            except FormatError as exc:
                contents = SegmentContents(seg.path, damaged=str(exc).removeprefix(
                    f"{seg.path}: "))
            if contents.damaged:
                # keep damaged data where it is for `fsck`; compact nothing past it
                report.skipped.append((seg.path, contents.damaged))
                group = group[: group.index(seg)]
                todo.clear()
                break
            if contents.torn_bytes:
                report.torn.append((seg.path, contents.torn_bytes))
            for batch in contents.batches:
                newer = after_seq(batch, last)
                if newer is not None:
                    batches.append(newer)
                    last = newer.column(0)[-1].as_py()
        if not group:
            return
        report.bytes_before += sum(seg.path.stat().st_size for seg in group)
        report.records += sum(b.num_rows for b in batches)
        if dry_run:
            report.segments_removed.extend(seg.path for seg in group)
            continue
        if claim is not None:
            os.utime(claim)  # still working: the claim's age stays small
        directory = group[0].path.parent
        if batches:
            table = pa.Table.from_batches(batches, schema=SCHEMAS[s.kind])
            part = write_part(directory, s, table, group[-1].number)
            report.parts_written.append(part)
            report.bytes_after += part.stat().st_size
        for seg in group:
            with contextlib.suppress(FileNotFoundError):
                seg.path.unlink()
            report.segments_removed.append(seg.path)
        fsync_dir(directory)


def _remove_consumed(consumed: list[Segment], dry_run: bool,
                     report: CompactionReport) -> None:
    """Delete segments a part already holds (left by a compactor killed between writing
    the part and deleting them); readers skip them anyway."""
    for seg in consumed:
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                seg.path.unlink()
        report.segments_removed.append(seg.path)
    if consumed and not dry_run:
        fsync_dir(consumed[0].path.parent)


def compact(*, root: str | os.PathLike[str] | None = None, project: str | None = None,
            run: str | None = None, kinds: Iterable[str] = tuple(SCHEMAS),
            dry_run: bool = False,
            progress: Callable[[int, int | None, str], None] | None = None
            ) -> CompactionReport:
    """Compact every sealed segment of the store (or of one project / run) into Parquet.

    `progress(done, total, note)` is called after each stream (done and total count
    streams; note names the stream)."""
    root_path = resolve_root(root)
    report = CompactionReport()
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    streams = list_streams(root_path, project, run, tuple(kinds))
    for done, s in enumerate(streams, 1):
        _compact_stream(root_path, s, now, dry_run, report)
        if progress is not None:
            progress(done, len(streams), f"{s.project}/{s.run} {s.key()}")
    return report
