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
import errno
import json
import os
import platform
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
from tracklake._format.part import footer_placeholder, stamp_footer_crc
from tracklake._format.segment import SegmentContents, read_segment
from tracklake._read.reader import Segment, after_seq, list_stream, list_streams

#: A writer whose heartbeat is older than this is taken to be dead (its last segment
#: becomes compactable). Writers heartbeat every 30 s while they live.
STALE_AFTER_SECONDS = 3600.0
#: A claim from another host (or unreadable) that was not refreshed for this long was left
#: by a compactor that died; on its own host a claim is checked exactly (pid, start time,
#: boot id).
CLAIM_STALE_SECONDS = 600.0
#: Rows per Parquet row group: small enough that a query for one key of a part sorted by
#: key skips most of it by the row groups' statistics (benchmarks/sql_scale.py).
ROW_GROUP_ROWS = 1 << 17
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
    meta.update(footer_placeholder())
    table = table.replace_schema_metadata(meta)
    final = directory / part_name(first, last, last_segment)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    encodings = {"seq": "DELTA_BINARY_PACKED", "time": "DELTA_BINARY_PACKED"}
    if "step" in table.column_names:
        encodings["step"] = "DELTA_BINARY_PACKED"
    if s.kind == "metrics":
        encodings["value"] = "BYTE_STREAM_SPLIT"
    dictionary = [c for c in table.column_names if c not in encodings and c != "end_time"]
    try:
        pq.write_table(table, tmp, compression="zstd", compression_level=3,
                       use_dictionary=dictionary, column_encoding=encodings,
                       row_group_size=ROW_GROUP_ROWS, write_statistics=True,
                       write_page_checksum=True)
        stamp_footer_crc(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # the segments stay; nothing was removed
        raise
    fsync_dir(directory)
    return final


def _boot_id() -> str | None:
    """This machine's boot id (Linux), to tell a claim made before a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux); None if unknown, gone,
    or a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X") or not fields[19].isdigit():
        return None
    return int(fields[19])


def _claim_record() -> dict[str, object]:
    pid = os.getpid()
    return {"pid": pid, "host": platform.node(), "boot_id": _boot_id(),
            "start_ticks": _start_ticks(pid),
            "claimed_at": _dt.datetime.now(_dt.timezone.utc).isoformat()}


def _read_claim(path: Path) -> dict[str, Any] | None:
    """The claim's record if it is one this version writes, else None (empty, foreign)."""
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    types: dict[str, type | tuple[type, ...]] = {
        "pid": int, "host": str, "boot_id": (str, type(None)),
        "start_ticks": (int, type(None))}
    if any(not isinstance(record.get(k), t) for k, t in types.items()):
        return None
    return record


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def claim_is_stale(record: dict[str, Any] | None, age: float) -> bool:
    """True if the compactor that made this claim is certainly gone.

    On the claim's own host this is exact: the machine rebooted since (boot id), or no
    process with its pid and start time runs. A claim from another host (a shared file
    system) or one that cannot be read is stale once its age (the claimant refreshes it
    after each part) passes CLAIM_STALE_SECONDS.
    """
    if record is None or record["host"] != platform.node():
        return age > CLAIM_STALE_SECONDS
    boot = _boot_id()
    if record["boot_id"] is not None and boot is not None and record["boot_id"] != boot:
        return True
    if not _process_alive(record["pid"]):
        return True
    started: int | None = record["start_ticks"]
    if started is None:
        return False  # no start time recorded: a live pid is taken to be the claimant
    return _start_ticks(record["pid"]) != started  # pid reused, or the claimant a zombie


def _take_claim(claim: Path) -> bool:
    """Create the claim exclusively, whole (written aside, then hard-linked into place:
    `link` fails if the name exists, on NFS and Lustre too, where locks may not work)."""
    data = json.dumps(_claim_record()).encode()
    tmp = claim.with_name(f"{claim.name}.{platform.node()}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)  # a full disk raises here, leaving nothing behind
        try:
            os.link(tmp, claim)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    # no hard links on this file system: create the claim exclusively and fill it
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
    except OSError:
        claim.unlink()
        raise
    finally:
        os.close(fd)
    return True


def _break_stale_claim(claim: Path) -> None:
    """Remove a claim judged stale, unless another compactor replaced it meanwhile."""
    try:
        before = claim.read_bytes()
        st = claim.stat()
    except FileNotFoundError:
        return
    if not claim_is_stale(_read_claim(claim), time.time() - st.st_mtime):
        return
    aside = claim.with_name(f"{claim.name}-stale.{platform.node()}.{os.getpid()}.tmp")
    try:
        os.rename(claim, aside)
    except FileNotFoundError:
        return  # another compactor broke it first
    if aside.read_bytes() != before or aside.stat().st_ino != st.st_ino:
        # a live claim made after our look: put it back (fails only if yet another exists)
        with contextlib.suppress(FileExistsError):
            os.link(aside, claim)
    aside.unlink()


#: Temporaries of a claim, and of a part (`.part-...-NNNNNN.parquet.PID.tmp`).
_CLAIM_TMP = re.compile(r"^\.compacting(?:-stale)?\.(.+)\.(\d+)\.tmp$")
_PART_TMP = re.compile(r"^\.part-.*\.parquet\.(\d+)\.tmp$")


def _remove_leftovers(directory: Path) -> None:
    """Delete temporaries left by a process killed on this host (their pid is gone): a
    claim's, or a part's older than CLAIM_STALE_SECONDS (unpack writes parts without a
    claim, maybe from another host sharing the file system)."""
    host = platform.node()
    for name in os.listdir(directory):
        if (m := _CLAIM_TMP.match(name)) is not None:
            gone = m.group(1) == host and not _process_alive(int(m.group(2)))
        elif (m := _PART_TMP.match(name)) is not None:
            try:
                age = time.time() - (directory / name).stat().st_mtime
            except FileNotFoundError:
                continue
            gone = age > CLAIM_STALE_SECONDS and not _process_alive(int(m.group(1)))
        else:
            continue
        if gone:
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()


@contextlib.contextmanager
def _claim(directory: Path, report: CompactionReport) -> Iterator[Path | None]:
    """Exclusively claim a stream for one compactor; yields the claim (None if another
    live compactor holds it). A claim left by a compactor that died is broken."""
    claim = directory / ".compacting"
    for _ in range(3):
        if _take_claim(claim):
            try:
                _remove_leftovers(directory)
                yield claim
            finally:
                with contextlib.suppress(FileNotFoundError):
                    claim.unlink()
            return
        _break_stale_claim(claim)
    report.skipped.append((directory, "another compaction is working on it (its claim "
                                      f"{claim} names a live process)"))
    yield None


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
            dry_run: bool = False) -> CompactionReport:
    """Compact every sealed segment of the store (or of one project / run) into Parquet."""
    root_path = resolve_root(root)
    report = CompactionReport()
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    for s in list_streams(root_path, project, run, tuple(kinds)):
        _compact_stream(root_path, s, now, dry_run, report)
    return report
