"""Every batch of a damaged segment that still verifies, for fsck's repair.

A reader stops at the first batch that does not verify: what follows could be a batch
being written. Once the writer is gone, each batch after the damage still carries its
own checksum and seq range, so a batch that verifies is what its writer wrote. Two
kinds of damage leave such batches behind:

- a damaged batch in the middle: reading goes on at the next message whose batch
  verifies and whose seqs come after those read (where the damaged message's length
  says it ends, else at the next message marker);
- a damaged schema header, which has no checksum: the batches are read under the
  header a writer of the file's stream writes (the stream is known from its directory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tracklake._errors import FormatError
from tracklake._format import SCHEMAS, StreamId
from tracklake._format.files import open_regular
from tracklake._format.ipc_size import message_size
from tracklake._format.layout import parse_segment_name
from tracklake._format.segment import (
    CONTINUATION,
    MAX_MESSAGE_BYTES,
    SegmentContents,
    decode_bytes,
    header_bytes,
    stream_schema,
)

#: A segment read whole here is at most this large: one that rolled over
#: (`segment_bytes`, 64 MiB) with its largest batch after it. Larger ones are not tried.
MAX_SALVAGED_BYTES = (64 << 20) + MAX_MESSAGE_BYTES
#: Bytes at the start of a segment searched for where a damaged header ends.
_HEADER_SEARCH_BYTES = 64 << 10
#: Message markers tried as the end of a damaged header, or after a damaged batch whose
#: length fields lead nowhere (a run of 0xFF bytes is a marker at every byte).
_MARKERS_TRIED = 64
#: Damaged stretches read past, at most.
_GAPS_READ_PAST = 4096
#: After a damaged stretch, the batches that follow are decoded a window at a time (cut
#: where a message ends), from this many bytes, doubling up to `_WINDOW_BYTES`: each
#: decode copies what it reads, so the copying stays about the file's size however many
#: stretches there are (it was the rest of the file for each: 64 stretches of a 64 MiB
#: segment took 8.8 s).
_FIRST_WINDOW_BYTES = 64 << 10
_WINDOW_BYTES = 4 << 20
#: Bytes copied to try where the batches after a damaged stretch start, at most this many
#: times the file's size (a crafted file may offer a large candidate at every marker).
_TRIED_PER_BYTE = 8


@dataclass
class Salvaged:
    """The batches of a segment that verify, and the byte ranges left out between them."""

    contents: SegmentContents
    skipped: list[tuple[int, int]] = field(default_factory=list)

    def lost(self) -> str:
        """What a repair keeping only these batches leaves out, in words."""
        parts = [f"{end - start:,} bytes at byte {start}" for start, end in self.skipped]
        if self.contents.damaged or self.contents.torn_bytes:
            parts.append(f"{self.contents.torn_bytes:,} bytes at the end")
        return "; ".join(parts) if parts else "nothing once repaired"


def salvage(path: Path, stream: StreamId | None = None) -> Salvaged | None:
    """Every batch of segment `path` that verifies, read past damage; under the header a
    writer of `stream` writes if given (the file's own header being damaged). None if
    the file is larger than `MAX_SALVAGED_BYTES`, its header does not read (without
    `stream`), or, with `stream`, no batch verifies whose first seq is the one the
    file's name gives."""
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size > MAX_SALVAGED_BYTES:
            return None
        data = f.read(MAX_SALVAGED_BYTES + 1)
    if stream is None:
        end = 8 + int.from_bytes(data[4:8], "little")
        try:
            return _past_damage(path, data, data[:end], end) if 8 < end <= len(data) else None
        except FormatError:
            return None  # the header itself: `salvage(path, stream)` reads past it
    header = header_bytes(stream_schema(SCHEMAS[stream.kind], stream))
    named = parse_segment_name(path.name)
    for end in _header_ends(data, len(header)):
        try:
            found = _past_damage(path, data, header, end)
        except FormatError:
            continue
        batches = found.contents.batches
        if batches and (named is None or batches[0].column(0)[0].as_py() == named[1]):
            return found
    return None


def _past_damage(path: Path, data: bytes, header: bytes, start: int) -> Salvaged:
    """The batches of `data` from byte `start` read under `header`, going on after each
    damaged stretch at the next batch that verifies and comes after those read."""
    found = Salvaged(SegmentContents(path))
    out = found.contents
    budget = [_TRIED_PER_BYTE * len(data)]
    pos, end, window = start, len(data), _FIRST_WINDOW_BYTES
    while True:
        part = decode_bytes(path, header + data[pos:end], pos - len(header))
        out.schema_metadata = part.schema_metadata
        out.batches.extend(part.batches)
        out.ends.extend(part.ends)
        out.sealed, out.torn_bytes, out.damaged = part.sealed, part.torn_bytes, part.damaged
        if not part.damaged:
            if end == len(data):
                return found
            # a window's end: on from its last whole batch (all of the rest if it holds
            # none, one message being larger than the window)
            out.torn_bytes = 0
            window = min(2 * window, _WINDOW_BYTES)
            pos, end = (part.ends[-1], _window_end(data, part.ends[-1], window)) \
                if part.ends else (pos, len(data))
            continue
        bad = part.ends[-1] if part.ends else pos
        last_seq = int(out.batches[-1].column(0)[-1].as_py()) if out.batches else -1
        resume = None if len(found.skipped) >= _GAPS_READ_PAST else \
            _next_batch(path, data, header, bad, last_seq, budget)
        if resume is None:
            return found
        found.skipped.append((bad, resume))
        window = _FIRST_WINDOW_BYTES
        pos, end = resume, _window_end(data, resume, window)


def _window_end(data: bytes, pos: int, window: int) -> int:
    """Where the window of batches read from `pos` ends: after the last message that
    ends within `window` bytes of it, by their length fields (the file's end if those do
    not read: the decoder then says why)."""
    view = memoryview(data)
    at = pos
    while at < len(data):
        size = message_size(view[at:])
        if size is None:
            return len(data)
        if at + size - pos > window and at > pos:
            return at
        at += size
    return len(data)


def _next_batch(path: Path, data: bytes, header: bytes, bad: int, last_seq: int,
                budget: list[int]) -> int | None:
    """Where the first batch after the damaged message at `bad` starts: a message whose
    batch verifies on its own and holds seqs after `last_seq`. Tried along the length
    fields first (damaged batches in a row whose framing is whole), then at the next
    message markers. None if there is none, or once the tries have copied `budget[0]`
    bytes (which they lower)."""
    view = memoryview(data)
    at = bad
    while (size := message_size(view[at:])) is not None and size <= MAX_MESSAGE_BYTES:
        at += size
        found = _verifies(path, data, header, at, last_seq, budget)
        if found or budget[0] < 0:
            return at if found else None
    tried = 0
    at = data.find(CONTINUATION, bad + 1)
    while at != -1 and tried < _MARKERS_TRIED:
        tried += 1
        if _verifies(path, data, header, at, last_seq, budget):
            return at
        if budget[0] < 0:
            return None
        at = data.find(CONTINUATION, at + 1)
    return None


def _verifies(path: Path, data: bytes, header: bytes, at: int, last_seq: int,
              budget: list[int]) -> bool:
    """Whether the message at `at` is a batch that verifies on its own and holds seqs
    after `last_seq`; the bytes copied to try it are taken off `budget[0]`."""
    size = message_size(memoryview(data)[at:])
    if size is None or size > MAX_MESSAGE_BYTES or at + size > len(data):
        return False
    budget[0] -= size
    if budget[0] < 0:
        return False
    try:
        one = decode_bytes(path, header + data[at : at + size], at - len(header))
    except FormatError:
        return False
    return len(one.batches) == 1 and int(one.batches[0].column(0)[0].as_py()) > last_seq


def _header_ends(data: bytes, written: int) -> list[int]:
    """Where a damaged header may end: where its length field says, where the header a
    writer writes would, then at each message marker in the first bytes."""
    candidates = [8 + int.from_bytes(data[4:8], "little"), written]
    at = data.find(CONTINUATION, 8, _HEADER_SEARCH_BYTES)
    while at != -1 and len(candidates) < _MARKERS_TRIED:
        candidates.append(at)
        at = data.find(CONTINUATION, at + 1, _HEADER_SEARCH_BYTES)
    return [end for i, end in enumerate(candidates)
            if 8 <= end < len(data) and end not in candidates[:i]]
