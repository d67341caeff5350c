"""Ship mode: ranks write their segments to a node-local folder, and a shipper moves
their records into the store's root (a shared file system), exactly once
(docs/many-nodes.md, "Write locally, ship segments").

The node-local folder of a store (`local_base`) has the store's stream layout. A
shipper reads each local segment's verified batches as they are written and appends
them, re-encoded with their checksums, to a segment of its own in the root's stream
directory; a local segment shipped whole (sealed, or followed by a later one, or left by
a writer that is gone) ends its segment in the root, and is deleted.

Exactly once, whatever is killed when: a stream's records carry increasing sequence
numbers, and a shipper starts from the highest one the root holds (its segments'
complete batches and its parts' names), so a batch is never shipped twice, and a batch
torn by a kill is shipped again into a new segment (readers and compaction leave a torn
tail out). A shipper never appends to a segment it did not open, and one stream has one
shipper at a time: its `.shipping` claim in the local stream directory (the writer's own
shipper holds it for the writer's life, so a stream whose claim can be taken belongs to
a writer that is gone).

A local segment found damaged (a checksum that does not match, bytes that do not decode,
a torn or zero-filled tail, a file that is no segment at all) has its whole batches
before the damage shipped and nothing after; once the shipper is done with it, it is
renamed `<name>.damaged` (kept as evidence, never read again) and the report says so.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import (
    SCHEMAS,
    StreamId,
    parse_part_name,
    parse_segment_name,
    segment_name,
    stream_dir,
)
from tracklake._format.files import store_dir
from tracklake._format.segment import (
    SegmentContents,
    SegmentWriter,
    read_segment,
    read_segment_from,
    stream_schema,
)
from tracklake._ops.claims import SHIPPING, hold_claim, remove_leftovers
from tracklake._read.listing import list_streams

CLAIM = SHIPPING
#: Appended to the name of a local segment found damaged (or torn) once the shipper is
#: done with it: kept as evidence, never read or shipped again.
DAMAGED = ".damaged"
#: Bytes of a local segment read per step (a live segment grows for minutes).
READ_BYTES = 8 << 20
#: Seconds between two refreshes of a held claim (its modification time set anew): a
#: shipper that cannot probe the holder (another PID namespace: a container) takes a
#: claim only once it has watched it stand still for `claims.CLAIM_STALE_SECONDS`.
REFRESH_SECONDS = 60.0


@dataclass
class ShipReport:
    """What shipping did: records and batches moved, local segments finished (shipped
    whole and deleted), streams another shipper holds, and problems found."""

    records: int = 0
    batches: int = 0
    segments_done: int = 0
    busy: list[StreamId] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, other: ShipReport) -> None:
        self.records += other.records
        self.batches += other.batches
        self.segments_done += other.segments_done
        self.busy += other.busy
        self.problems += other.problems


def _seq_last(batch: pa.RecordBatch) -> int:
    seqs = batch.column(0)
    return int(seqs[len(seqs) - 1].as_py())


def _stream_text(ident: StreamId) -> str:
    return (f"{ident.project}/{ident.run} rank {ident.rank} attempt {ident.attempt} "
            f"{ident.kind}")


def _files(directory: Path) -> list[str]:
    """The names of the regular files in `directory` (none if it is missing): a link,
    FIFO or device planted under a segment's name is never opened."""
    try:
        with os.scandir(directory) as entries:
            return [e.name for e in entries if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _segments(directory: Path) -> list[Path]:
    """The segment files of a local stream directory, in their order."""
    numbered = [(seg[0], name) for name in _files(directory)
                if (seg := parse_segment_name(name)) is not None]
    return [directory / name for _, name in sorted(numbered)]


def shipped_seq(directory: Path) -> int:
    """The highest sequence number a stream directory of the root holds (-1: none): its
    parts' names and its segments' complete batches."""
    highest = -1
    segments: list[tuple[int, Path]] = []
    for name in _files(directory):
        part = parse_part_name(name)
        if part is not None:
            highest = max(highest, part[1])
        seg = parse_segment_name(name)
        if seg is not None:
            segments.append((seg[0], directory / name))
    for _, path in sorted(segments, reverse=True):  # a stream's seqs grow with its segments
        batches = read_segment(path).batches
        if batches:
            return max(highest, _seq_last(batches[-1]))
    return highest


def _next_number(directory: Path) -> int:
    """A segment number above every segment and part of a root's stream directory."""
    numbers = [-1]
    for name in os.listdir(directory):
        seg = parse_segment_name(name)
        part = parse_part_name(name)
        numbers.append(seg[0] if seg else part[2] if part else -1)
    return max(numbers) + 1


class _Stream:
    """One local stream being shipped, under its claim."""

    def __init__(self, ident: StreamId, local: Path, shared: Path,
                 claim: contextlib.ExitStack, claim_path: Path) -> None:
        self.ident = ident
        self.local = local
        self.shared = shared
        self.claim = claim
        self.claim_path = claim_path
        self.refreshed = time.monotonic()
        self.shipped: int | None = None  # the root's highest seq, read once
        self.reading: tuple[Path, int | None, int] | None = None  # file, inode, offset
        self.out: SegmentWriter | None = None  # this shipper's segment in the root

    def refresh(self) -> None:
        """Tell shippers that cannot probe this process that it still holds the claim."""
        if time.monotonic() - self.refreshed >= REFRESH_SECONDS:
            self.refreshed = time.monotonic()
            os.utime(self.claim_path)

    def end_output(self) -> None:
        if self.out is not None:
            out, self.out = self.out, None
            out.seal()


class Shipper:
    """Moves the records of the local streams under `local` into the store at `root`.

    `own` are the streams of a writer in this process (claimed now, for the shipper's
    life; their last segment is shipped as it grows). Any other stream found is a
    leftover of a writer that is gone, once its claim can be taken: shipped whole."""

    def __init__(self, local: Path, root: Path, *, own: Iterable[StreamId] = (),
                 fsync: bool = True) -> None:
        self.local = local
        self.root = root
        self.fsync = fsync
        self._streams: dict[StreamId, _Stream] = {}
        self._own = frozenset(own)
        self._own_streams: tuple[_Stream, ...] = ()
        for ident in self._own:
            if self._claim(ident) is None:
                self.close()
                raise RuntimeError(f"{stream_dir(local, ident)}: another process ships this "
                                   "stream (its .shipping claim names a live process)")
        self._own_streams = tuple(self._streams.values())

    def _claim(self, ident: StreamId) -> _Stream | None:
        directory = store_dir(self.local, stream_dir(self.local, ident))
        stack = contextlib.ExitStack()
        claim = stack.enter_context(hold_claim(directory, CLAIM, remove_leftovers,
                                                   root=self.local))
        if claim is None:
            stack.close()
            return None
        stream = self._streams[ident] = _Stream(ident, directory,
                                                stream_dir(self.root, ident), stack, claim)
        return stream

    def refresh_own(self) -> None:
        """Refresh the claims of the own streams (`REFRESH_SECONDS`); safe to call from
        another thread than `ship`'s (the writer's, which never waits on the root)."""
        for stream in self._own_streams:
            stream.refresh()

    def ship(self, *, leftovers: bool = False) -> ShipReport:
        """Ship what the own streams hold now (and, with `leftovers`, every other local
        stream whose writer is gone). OSError from the root (full, failing) propagates:
        what was shipped before it stays shipped, and the next call goes on from there."""
        report = ShipReport()
        if leftovers:
            for ident in list_streams(self.local):
                if ident in self._streams or not _segments(stream_dir(self.local, ident)):
                    continue  # no segment yet: maybe a writer's, about to take its claim
                if self._claim(ident) is None:
                    report.busy.append(ident)
        for stream in list(self._streams.values()):
            try:
                self._ship_stream(stream, report)
            finally:
                if stream.out is not None:
                    stream.out.suspend()  # no file of the root held open between rounds
        return report

    def close(self) -> None:
        """End this shipper's segments in the root and give the claims back, all of them
        even where the root fails (the first OSError is raised after: a segment left
        unsealed reads as one whose writer was killed); a stream whose local files are all
        shipped leaves no local directory."""
        failed: OSError | None = None
        for stream in self._streams.values():
            try:
                stream.end_output()
            except OSError as exc:
                failed = failed or exc
            finally:
                stream.claim.close()
            with contextlib.suppress(OSError):
                for directory in (stream.local, *stream.local.parents):
                    if directory == self.local:
                        break
                    directory.rmdir()  # only if empty
        self._streams.clear()
        self._own_streams = ()
        if failed is not None:
            raise failed

    def _ship_stream(self, stream: _Stream, report: ShipReport) -> None:
        if stream.shipped is None:
            try:
                stream.shipped = shipped_seq(stream.shared)
            except FormatError as exc:  # what the root holds is unknown: ship nothing
                report.problems.append(f"{exc}; {_stream_text(stream.ident)} was not "
                                       "shipped")
                return
        segments = _segments(stream.local)
        for i, path in enumerate(segments):
            try:
                end = self._ship_segment(stream, path, report)
            except NewerFormatError as exc:  # a newer tracklake's file: left for it
                report.problems.append(f"{exc}; it and the rest of its stream were not "
                                       "shipped")
                return
            except FormatError as exc:  # not a segment at all, or its header is damaged
                end = SegmentContents(path, damaged=str(exc).removeprefix(f"{path}: "))
            done = end.sealed or i + 1 < len(segments) or stream.ident not in self._own
            if not done:  # the segment its writer appends to: the rest comes next time
                if end.damaged:
                    report.problems.append(f"{path}: {end.damaged}; the records after it "
                                           "are not shipped")
                return
            stream.end_output()
            stream.reading = None
            report.segments_done += 1
            why = end.damaged or (end.torn_bytes and f"its last {end.torn_bytes:,} bytes "
                                  "are not a whole batch (cut by a kill or a power loss)")
            if not why:
                path.unlink()
                continue
            kept = path.with_name(path.name + DAMAGED)
            os.rename(path, kept)  # evidence: never deleted, never read again
            report.problems.append(f"{path}: {why}; every whole batch before it was "
                                   f"shipped, nothing from there on; the file is kept as "
                                   f"{kept}")

    def _ship_segment(self, stream: _Stream, path: Path,
                      report: ShipReport) -> SegmentContents:
        """Ship the batches of one local segment that the root does not hold yet; what
        the last read found at its end (sealed, torn, damaged)."""
        if stream.reading is None or stream.reading[0] != path:
            stream.end_output()  # a new local segment: a new segment in the root
            stream.reading = (path, None, 0)
        assert stream.shipped is not None
        while True:
            stream.refresh()  # a long backlog takes longer than a claim may stand still
            _, inode, offset = stream.reading
            contents = read_segment_from(path, inode, offset, READ_BYTES)
            for batch in contents.batches:
                last = _seq_last(batch)
                if last <= stream.shipped:
                    continue  # shipped before (a shipper killed after shipping it)
                out = self._output(stream, batch)
                try:
                    out.append(batch)
                except OSError:  # the root is full or failing: never append after a tear
                    stream.out = None
                    out.abandon()
                    raise
                stream.shipped = last
                report.records += batch.num_rows
                report.batches += 1
            if contents.ends:
                offset = contents.ends[-1]
            stream.reading = (path, contents.inode, offset)
            if not contents.more:
                return contents

    def _output(self, stream: _Stream, batch: pa.RecordBatch) -> SegmentWriter:
        if stream.out is None:
            store_dir(self.root, stream.shared)
            number = _next_number(stream.shared)
            path = stream.shared / segment_name(number, int(batch.column(0)[0].as_py()))
            schema = stream_schema(SCHEMAS[stream.ident.kind], stream.ident)
            stream.out = SegmentWriter(path, schema, fsync=self.fsync)
        return stream.out
