"""Where readers of this process left off in each live segment.

A follower (an exporter with ``--follow``, `tracklake watch`) reads the same live segment
on every poll while the writer appends to it for up to its roll age (ten minutes by
default, tens of millions of values). Reading it whole each time made a poll cost, in
time and in memory, the size of the segment instead of what was appended since. This
cache remembers, per segment file, the byte offset just past the last batch read and the
last seq stored before it; a reader that wants only records after that seq starts there.

It is a cache of this process only: derived from the files, bounded, never written
anywhere, and checked against the file's inode before use (a file rewritten in place by
`fsck --repair` is read whole again).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from tracklake._format.segment import SegmentContents, read_segment, read_segment_from

#: Segments remembered at most (the least recently read are forgotten first).
MAX_REMEMBERED = 4096
#: Bytes of a segment read (and so decompressed and held) at a time.
READ_BYTES = 1 << 20


class _Mark(NamedTuple):
    inode: int
    last_seq: int  # every record stored before `offset` has seq <= this
    offset: int


_marks: OrderedDict[str, _Mark] = OrderedDict()
_lock = threading.Lock()


def read_live_segment(path: Path, after: int) -> SegmentContents:
    """The segment's next batches (a bounded slice: `more` says if others follow),
    skipping without reading those stored before the mark left by an earlier read when
    every record wanted (seq > `after`) is past it."""
    if hasattr(path, "fs_path"):
        return read_segment(path)  # a store in an object store: no inode, read it whole
    key = str(path)
    with _lock:
        mark = _marks.get(key)
    floor = -1  # the largest seq stored before where this read starts
    if mark is not None and after >= mark.last_seq:
        contents = read_segment_from(path, mark.inode, mark.offset, READ_BYTES)
        if contents.inode == mark.inode:
            floor = mark.last_seq
    else:
        contents = read_segment_from(path, max_bytes=READ_BYTES)
    if contents.batches and contents.inode is not None:
        last = contents.batches[-1].column(0)
        new = _Mark(contents.inode, max(floor, int(last[len(last) - 1].as_py())),
                    contents.ends[-1])
        with _lock:
            _marks[key] = new
            _marks.move_to_end(key)
            while len(_marks) > MAX_REMEMBERED:
                _marks.popitem(last=False)
    return contents


def forget() -> None:
    """Drop every mark (the next read of each segment reads it whole)."""
    with _lock:
        _marks.clear()
