"""What one new part is made of: a stream's small parts merged again, then its segments
in number order, read lazily (a segment a batch at a time) and de-duplicated by seq.

`compact.py` decides which parts and segments go together; `sorted_part.py` writes what
`PartSources.batches()` yields. Afterwards `used` says which segments were read whole
(only those may be deleted) and `stopped` whether a damaged segment ended the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError
from tracklake._format import StreamId
from tracklake._format.segment import SegmentContents, scan_segment
from tracklake._ops.sorted_part import part_batches
from tracklake._read.reader import Part, Segment, after_seq

if TYPE_CHECKING:
    from tracklake._ops.compact import CompactionReport


class PartSources:
    """The records one part is made of: small parts merged again, then segments."""

    def __init__(self, s: StreamId, parts: list[Part], segments: list[Segment], last: int,
                 report: CompactionReport) -> None:
        self.stream = s
        self.parts = parts
        self.segments = segments
        self.last = last  # records at or below this seq are held by parts already
        self.used: list[Segment] = []  # segments read whole, in order
        self.stopped = False  # a damaged segment ended the group
        self.records = 0  # records taken from segments
        self._report = report

    def without_parts(self) -> PartSources:
        return PartSources(self.stream, [], self.segments, self.last, self._report)

    def last_segment(self) -> int:
        return max([p.last_segment for p in self.parts] + [g.number for g in self.used],
                   default=-1)

    def batches(self) -> Iterator[pa.RecordBatch]:
        for part in self.parts:
            yield from part_batches(part.path)
        for seg in self.segments:
            contents = SegmentContents(seg.path)
            try:
                for batch in scan_segment(seg.path, contents):
                    newer = after_seq(batch, self.last)
                    if newer is not None:
                        self.records += newer.num_rows
                        self.last = newer.column(0)[-1].as_py()
                        yield newer
            except NewerFormatError:
                raise
            except FormatError as exc:
                contents.damaged = str(exc).removeprefix(f"{seg.path}: ")
            if contents.damaged:
                # keep the segment for `fsck` (its good batches before the damage are in
                # the part too; readers take each seq once); compact nothing past it
                self._report.skipped.append((seg.path, contents.damaged))
                self.stopped = True
                return
            if contents.torn_bytes:
                self._report.torn.append((seg.path, contents.torn_bytes))
            self.used.append(seg)
