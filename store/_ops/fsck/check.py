"""`fsck`: find damage in a store, say what it costs, and repair what can be repaired.

Checks every segment (batch checksums, a torn tail behind a writer that is gone, a header
that does not match its stream), every Parquet part (read in full with page checksum
verification, schema and metadata against the stream, row groups' statistics and the
metric summary against the values), every blob's digest, that every blob a record names
is there, every attempt file and every exporter state. Repair never deletes: a damaged
file is moved to ``ROOT/quarantine/`` under its relative path, and the readable batches
of a damaged or torn segment are written back as a sealed segment of the same name.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError, NoAnswerError, StoreError
from tracklake._format import FORMAT_VERSION, SCHEMAS, StreamId, fsync_dir, fsync_file
from tracklake._format.attempt import read_attempt
from tracklake._format.bounded import bounded
from tracklake._format.files import store_dir
from tracklake._format.layout import parse_part_name
from tracklake._format.liveness import writer_known_gone
from tracklake._format.segment import SegmentWriter, read_segment, stream_schema
from tracklake._format.segment_salvage import Salvaged, salvage
from tracklake._format.temporaries import remove_files
from tracklake._ops.claims import REPAIRING, hold_claim, remove_leftovers, touch_claim
from tracklake._ops.compact import STALE_AFTER_SECONDS
from tracklake._ops.fsck.files import (
    check_attempts,
    check_backup_records,
    check_blobs,
    check_exports,
    check_referenced_blobs,
    check_special_files,
)
from tracklake._ops.fsck.parts import (
    REBUILD,
    Summaries,
    check_part,
    meta_mismatch,
    report_invalid,
)
from tracklake._ops.fsck.rebuild import rebuild_part, salvageable
from tracklake._ops.fsck.report import FsckReport, Problem
from tracklake._read.listing import stream_dirs, unknown_kinds
from tracklake._read.reader import list_stream


def _writer_gone(root: Path, s: StreamId, now: float) -> bool:
    """True if no writer will append to this stream again (as compaction judges)."""
    rank_dir = root / "runs" / f"project={s.project}" / f"run={s.run}" / f"rank={s.rank}"
    try:
        record = read_attempt(rank_dir / f"attempt={s.attempt}.json")
    except (FileNotFoundError, FormatError):
        return True  # no writer can be heard from
    if record is None:
        return False
    return writer_known_gone(record, now, STALE_AFTER_SECONDS, root)


def _check_segment(root: Path, s: StreamId, path: Path, last: bool, now: float,
                   report: FsckReport) -> None:
    if not report.count("segments", path):
        return  # compacted since it was listed
    try:
        contents = read_segment(path)
    except FileNotFoundError:
        return
    except NewerFormatError as exc:
        report.problems.append(Problem(path, f"unreadable segment ({exc})",
                                       "every record of the file", "quarantine it (--repair)"))
        return
    except FormatError as exc:
        _damaged_header(root, s, path, last, now, f"unreadable segment ({exc})", report)
        return
    batches = contents.batches
    if not contents.schema_metadata:
        if not last or _writer_gone(root, s, now):
            report.problems.append(Problem(
                path, "no complete header (the file was cut short or emptied)",
                "every record of the file", "quarantine it (--repair)"))
        return
    header = None
    if contents.schema_metadata or batches:
        header = meta_mismatch(contents.schema_metadata, s)
        if header is None and batches and not batches[0].schema.remove_metadata().equals(
                SCHEMAS[s.kind]):
            header = f"schema is not the {s.kind} schema"
    if header is not None:
        _damaged_header(root, s, path, last, now, f"damaged header: {header}", report)
        return
    if batches:
        report_invalid(s, path, pa.Table.from_batches(batches), report)
    if contents.damaged:
        if last and not _writer_gone(root, s, now):
            report.problems.append(_live(path, contents.damaged, (
                f"{contents.torn_bytes} bytes after batch {len(batches)} "
                f"(seq > {_last_seq(batches)}) until it is repaired")))
            return
        found = salvage(path)
        lost = found.lost() if found is not None else (
            f"{contents.torn_bytes} bytes after batch {len(batches)} "
            f"(seq > {_last_seq(batches)})")
        report.problems.append(Problem(path, contents.damaged, lost,
                                       "salvage the readable batches (--repair)"))
    elif contents.torn_bytes and (not last or _writer_gone(root, s, now)):
        report.problems.append(Problem(
            path, f"torn tail of {contents.torn_bytes} bytes (its writer died mid-batch)",
            "the batch being written when it died",
            "seal the readable batches (--repair)"))


#: What --repair does to a segment whose batches verify under a header rebuilt for it.
REHEAD = "rebuild its header from the stream it lies in (--repair)"


def _damaged_header(root: Path, s: StreamId, path: Path, last: bool, now: float,
                    what: str, report: FsckReport) -> None:
    """Report a segment whose schema header does not read or is not its stream's. The
    header has no checksum and its batches each have one: if they verify under the header
    a writer of the stream writes, repair rebuilds the header and nothing is lost."""
    if last and not _writer_gone(root, s, now):
        report.problems.append(_live(path, what, "every record of the file until it is "
                                     "repaired"))
        return
    found = salvage(path, s)
    if found is None:
        report.problems.append(Problem(path, what, "every record of the file",
                                       "quarantine it (--repair)"))
        return
    batches = found.contents.batches
    rows = sum(b.num_rows for b in batches)
    report.problems.append(Problem(
        path, f"{what}; its {len(batches)} batches ({rows} rows) verify under the "
        "stream's own header", found.lost(), REHEAD, stream=s))


def _live(path: Path, what: str, lost: str) -> Problem:
    """A damaged segment its writer still appends to: repair would replace the file
    under the writer, and a batch appended meanwhile would go to the replaced file."""
    return Problem(path, f"{what}; its writer still appends to it", lost,
                   "run `tracklake fsck --repair` once its writer has finished",
                   repairable=False)


def _last_seq(batches: list[pa.RecordBatch]) -> int:
    return int(batches[-1].column(0)[-1].as_py()) if batches else -1


def _check_stream(root: Path, s: StreamId, now: float, report: FsckReport,
                  summaries: Summaries) -> None:
    files = list_stream(root, s)
    for part in files.parts:
        check_part(s, part.path, part.first_seq, part.last_seq, report, summaries)
    for part in files.merged:  # kept a while for plain engines (docs/format.md), never read
        report.count("replaced parts", part.path)
    for i, seg in enumerate(files.segments):
        _check_segment(root, s, seg.path, i + 1 == len(files.segments), now, report)
    for path in files.foreign:
        if path.is_symlink() or not path.is_file():
            continue  # a link, FIFO or device: check_special_files reports it
        report.problems.append(Problem(path, "a file that is not a segment or part",
                                       "nothing (readers ignore it)",
                                       "move it out of the store (--repair)"))


T = TypeVar("T")


class _Bounded:
    """Runs fsck's checks each within the read timeout: a check whose file system gives
    no answer is reported as a problem naming what it could not read, and the next check
    runs; once the store's own directory gives no answer either, the rest is not
    checked (each check would wait as long again)."""

    def __init__(self, root: Path, report: FsckReport) -> None:
        self.root = root
        self.report = report
        self.stopped = False

    def run(self, check: Callable[[FsckReport], T], where: Path) -> T | None:
        """`check(part)`, what it found added to the report if it ended in time (an
        abandoned check never adds to it); None if it did not, or the store stopped
        answering before."""
        if self.stopped:
            return None
        part = FsckReport()
        try:
            result = bounded(lambda: check(part), where)
        except NoAnswerError as exc:
            self._no_answer(exc)
            return None
        self.report.add(part)
        return result

    def _no_answer(self, exc: NoAnswerError) -> None:
        problem = Problem(
            Path(exc.path), f"could not read it: no answer within {exc.seconds:g} s (a hung "
            "mount or a stuck file system?)", "not known: it was not checked",
            "check the file system (its mount, its server), then run fsck again",
            repairable=False)
        if problem not in self.report.problems:  # another check stopped there too
            self.report.problems.append(problem)
        try:
            bounded(lambda: os.listdir(self.root), self.root)
        except NoAnswerError:
            self.stopped = True
            self.report.problems.append(Problem(
                self.root, f"the store gives no answer within {exc.seconds:g} s: the rest "
                "of it was not checked, nothing was repaired", "not known",
                "check the file system (its mount, its server), then run fsck again",
                repairable=False))
        except OSError:
            return  # it answered (with an error the checks report on their own)


class RepairBusyError(StoreError):
    """Another `fsck --repair` is working on this store."""


@contextlib.contextmanager
def _one_repairer(root: Path, repair: bool) -> Iterator[Path | None]:
    """With `repair`, the quarantine's `.repairing` claim, held from the first check to
    the last repair: two repairs at once would each move or copy a file the other is
    replacing, and the quarantine could end up with a repaired copy in place of the
    original. Made and judged as a compactor's claim (`hold_claim`)."""
    if not repair:
        yield None
        return
    directory = store_dir(root, root / "quarantine")
    with hold_claim(directory, REPAIRING, remove_leftovers, root=root) as claim:
        if claim is None:
            raise RepairBusyError(
                f"another `tracklake fsck --repair` holds {directory / REPAIRING}; wait "
                "for it, or remove the file if that process is gone")
        yield claim
    with contextlib.suppress(OSError):
        directory.rmdir()  # made for the claim alone: a repair with nothing to move


def fsck(root: Path, *, repair: bool = False,
         progress: Callable[[int, int | None, str], None] | None = None) -> FsckReport:
    """Check the store at `root`; with `repair`, quarantine and salvage what is damaged.
    `progress(done, total, note)` is called after each stream checked (streams). One
    repair at a time: a second raises `RepairBusyError` before it reads anything.

    Each check gives up on a file system that gives no answer for `read_timeout()`
    seconds (a hung mount): what it could not read is a problem of the report, and
    fsck goes on with the next check."""
    with _one_repairer(root, repair) as claim:
        report, stopped = _check(root, progress, claim)
        if repair and not stopped:
            for problem in report.problems:
                if problem.repairable:
                    problem.repaired = _repair_unless_gone(root, problem)
                    if claim is not None:
                        touch_claim(claim)
    return report


def _check(root: Path, progress: Callable[[int, int | None, str], None] | None,
           claim: Path | None) -> tuple[FsckReport, bool]:
    """Every check's problems, and whether a check gave up on a hung file system."""
    report = FsckReport()
    checks = _Bounded(root, report)
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    summaries = Summaries()
    try:
        streams = checks.run(lambda _: stream_dirs(root), root) or {}
        for done, (s, rel) in enumerate(streams.items(), 1):
            checks.run(partial(_check_stream, root, s, now, summaries=summaries), root / rel)
            if claim is not None:
                touch_claim(claim)  # still at work, seen from another host too
            if progress is not None:
                progress(done, len(streams), f"{s.project}/{s.run} {s.key()}")
    finally:
        summaries.close()
    for check in (check_special_files, _check_kinds, check_blobs, check_referenced_blobs,
                  check_attempts, check_exports, check_backup_records):
        checks.run(partial(check, root), root)
    return report, checks.stopped


def _check_kinds(root: Path, report: FsckReport) -> None:
    for kind in unknown_kinds(root):
        report.problems.append(Problem(
            root / kind, f"records of kind {kind!r}, which this tracklake (store format "
            f"{FORMAT_VERSION}) does not know: a newer tracklake wrote them",
            "nothing: they stay as they are, but this version neither reads, exports, "
            "packs nor backs them up", "upgrade tracklake", repairable=False))


def _quarantine_path(root: Path, path: Path) -> Path:
    target = root / "quarantine" / path.relative_to(root)
    n = 1
    while os.path.lexists(target):
        target = target.with_name(f"{path.name}.{n}")
        n += 1
    store_dir(root, target.parent)
    return target


def _rebuild(root: Path, problem: Problem) -> str | None:
    """Rebuild a part whose records all read, keeping the original in quarantine; None
    if its records no longer all read (then it is quarantined like any damage)."""
    s, path = problem.stream, problem.path
    named = parse_part_name(path.name)
    if s is None or named is None:
        return None
    table = salvageable(s, path, named[0], named[1])
    if table is None:
        return None
    target = _quarantine_path(root, path)
    shutil.copy2(path, target)
    fsync_file(target)
    fsync_dir(target.parent)
    rebuild_part(s, path, table)
    return (f"rebuilt from its {table.num_rows} records (every page verified); the original "
            f"is in {target.relative_to(root)}")


def _readable(path: Path, problem: Problem) -> Salvaged | None:
    """The batches of segment `path` a repair keeps, read past damage (`salvage`): under
    a header rebuilt for its stream if that is the repair. None if none verify."""
    if problem.todo != REHEAD:
        found = salvage(path)
        if found is not None:
            return found
        return Salvaged(read_segment(path))  # too large to read whole: its first batches
    return None if problem.stream is None else salvage(path, problem.stream)


def _repair_unless_gone(root: Path, problem: Problem) -> str:
    """`_repair`, or what became of a file removed since it was checked (by retention,
    a compactor, or a user): there is nothing left to repair."""
    try:
        return _repair(root, problem)
    except FileNotFoundError:
        if os.path.lexists(problem.path):
            raise
        return "gone since it was checked (removed by another process): nothing to repair"


def _remove_killed_repairs(path: Path) -> None:
    """Delete the salvaged copies of segment `path` that killed repairs left beside it
    (`.NAME.PID.tmp`): only a repair writes one, and this one holds the store's repair
    claim, so none is being written."""
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.\d+\.tmp$")
    remove_files(path.parent, lambda left: pattern.match(left.name) is not None)


def _repair(root: Path, problem: Problem) -> str:
    path = problem.path
    if problem.todo == REBUILD:
        done = _rebuild(root, problem)
        if done is not None:
            return done
    salvaging = path.suffix == ".arrows" and (
        "salvage" in problem.todo or "seal" in problem.todo or problem.todo == REHEAD)
    found = _readable(path, problem) if salvaging else None
    target = _quarantine_path(root, path)
    if found is None:
        os.rename(path, target)
        fsync_dir(path.parent)
        return f"moved to {target.relative_to(root)}"
    shutil.copy2(path, target)  # the original stays readable until the salvage replaces it
    fsync_file(target)
    fsync_dir(target.parent)
    _remove_killed_repairs(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    contents = found.contents
    meta = contents.schema_metadata
    s = StreamId(meta["tracklake.project"], meta["tracklake.run"], int(meta["tracklake.rank"]),
                 int(meta["tracklake.attempt"]), meta["tracklake.kind"])
    writer = SegmentWriter(tmp, stream_schema(SCHEMAS[s.kind], s))
    try:
        for batch in contents.batches:
            writer.append(batch)
        writer.seal()
    finally:
        writer.close()
    os.replace(tmp, path)
    fsync_dir(path.parent)
    rows = sum(b.num_rows for b in contents.batches)
    done = "rebuilt its header and kept" if problem.todo == REHEAD else "kept"
    return (f"{done} {len(contents.batches)} readable batches ({rows} rows) in a sealed "
            f"segment; the original is in {target.relative_to(root)}")
