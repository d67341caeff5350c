"""Segment files: framing, checksums and durability of one append-only stream file.

A segment is a plain Arrow IPC stream (``pyarrow.ipc.open_stream`` reads it). Its schema
carries the format version and the stream's identity; every record batch carries, in its
custom metadata, a CRC-32 of the whole message as stored on disk (metadata and body,
computed with the CRC's own digits as ``##########``) and the range of ``seq`` it holds;
a sealed segment ends with the IPC end-of-stream marker. See docs/format.md.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, SCHEMAS, StreamId, check_version
from tracklake._format.bounded import touch
from tracklake._format.files import open_regular
from tracklake._format.ipc_size import (
    declares_other_than_little_endian,
    decoded_size,
    message_size,
)

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
CONTINUATION = b"\xff\xff\xff\xff"
#: Written into the batch metadata first, then overwritten in place by the 10-digit CRC, so
#: that each batch is serialised once.
_CRC_PLACEHOLDER = b"##########"


def _body_offset(message: bytes | bytearray | memoryview) -> int:
    """Offset of the body within one encapsulated IPC message (continuation, length, meta)."""
    return 8 + int.from_bytes(message[4:8], "little")


def _message_crc_matches(message: memoryview, expected: str) -> bool:
    """True if `message` (one stored batch message) has the CRC `expected`."""
    if len(expected) != len(_CRC_PLACEHOLDER) or not expected.isdigit():
        return False
    digits = expected.encode()
    copy = bytearray(message)
    meta_end = min(_body_offset(copy), len(copy))
    at = copy.find(digits, 8, meta_end)
    while at != -1:
        copy[at : at + len(digits)] = _CRC_PLACEHOLDER
        if zlib.crc32(copy) == int(expected):
            return True
        copy[at : at + len(digits)] = digits
        at = copy.find(digits, at + 1, meta_end)
    return False


def stream_schema(schema: pa.Schema, stream: StreamId) -> pa.Schema:
    """The kind's schema with the format version and stream identity attached."""
    return schema.with_metadata(
        {
            "tracklake.format": FORMAT_VERSION,
            "tracklake.kind": stream.kind,
            "tracklake.project": stream.project,
            "tracklake.run": stream.run,
            "tracklake.rank": str(stream.rank),
            "tracklake.attempt": str(stream.attempt),
        }
    )


def header_bytes(schema: pa.Schema) -> bytes:
    """The schema message a writer of `schema` (`stream_schema`) starts a segment with."""
    return _encode_stream(schema, None, {})[: -len(EOS)]


def _encode_stream(schema: pa.Schema, batch: pa.RecordBatch | None, md: dict[str, str],
                   options: pa.ipc.IpcWriteOptions | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        if batch is not None:
            writer.write_batch(batch, custom_metadata=md)
    return bytes(sink.getvalue())


class SegmentWriter:
    """Appends checksummed record batches to one new segment file, then seals it."""

    def __init__(self, path: Path, schema: pa.Schema, *, fsync: bool = True,
                 compression: str | None = "zstd") -> None:
        self.path = path
        self.schema = schema
        self.fsync = fsync
        self._options = pa.ipc.IpcWriteOptions(compression=compression)
        header = header_bytes(schema)
        self._header_len = len(header)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._inode = os.fstat(self._fd).st_ino
        self._suspended = False  # closed between appends (`suspend`), reopened by the next
        self.size = 0  # bytes known to be completely written
        self.opened_at = time.monotonic()
        self.batches = 0
        try:
            self._write(header)
        except OSError:
            self.close()
            with contextlib.suppress(OSError):  # the file holds no batch: nothing is lost
                path.unlink()
            raise

    def _write(self, data: bytes | bytearray) -> None:
        if self._suspended:
            self._reopen()
        assert self._fd is not None, "segment already closed"
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self._fd)
        self.size += len(data)

    def append(self, batch: pa.RecordBatch) -> None:
        """Write one batch; on return it is complete in the file (and fsynced if asked)."""
        seqs = batch.column(0)
        md = {
            "crc32": _CRC_PLACEHOLDER.decode(),
            "seq_first": str(seqs[0].as_py()),
            "seq_last": str(seqs[len(seqs) - 1].as_py()),
        }
        encoded = _encode_stream(self.schema, batch, md, self._options)
        data = bytearray(memoryview(encoded)[self._header_len : -len(EOS)])
        at = data.find(_CRC_PLACEHOLDER, 8, _body_offset(data))
        data[at : at + len(_CRC_PLACEHOLDER)] = b"%010d" % zlib.crc32(data)
        self._write(data)
        self.batches += 1

    def seal(self) -> None:
        """Write the end-of-stream marker and close: the segment is complete."""
        self._write(EOS)
        self.close()

    def suspend(self) -> None:
        """Close the file until the next append or `seal`, which reopen it: a process
        that holds no file open on a mount that hangs can still exit (closing a file of a
        FUSE mount at exit waits for the mount)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._suspended = True
            os.close(fd)

    def _reopen(self) -> None:
        """Open the suspended file again, if it is still the one written and holds just
        what was written; else raise OSError (removed, replaced or changed meanwhile)."""
        fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_size) != (self._inode, self.size):
                raise OSError(errno.ESTALE, f"{self.path} was replaced or changed while "
                              "it was closed between appends", str(self.path))
            os.lseek(fd, self.size, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._suspended = fd, False

    def abandon(self) -> None:
        """After a failed write: cut any partial batch off if possible, and close.

        The reader detects a torn tail anyway; truncating keeps the file tidy when the
        file system still lets us.
        """
        if self._fd is None:
            return
        # If even truncating fails, the torn tail stays: readers stop at the last
        # complete batch and the writer continues in a new segment.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self.size)
        self.close()

    def close(self) -> None:
        self._suspended = False
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def taken(self) -> bool:
        """True if the file this writer appends to is no longer the segment at its path:
        unlinked (another process compacted or deleted it) or replaced, so that what is
        written from now on reaches no reader."""
        if self._fd is None:
            return False
        try:
            opened = os.fstat(self._fd)
            if opened.st_nlink == 0:
                return True
            current = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError:
            return False  # the disk fails: the write itself says so
        return (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino)


@dataclass
class SegmentContents:
    """What a reader found in one segment file."""

    path: Path
    schema_metadata: dict[str, str] = field(default_factory=dict)
    batches: list[pa.RecordBatch] = field(default_factory=list)
    sealed: bool = False  # ends with the end-of-stream marker
    torn_bytes: int = 0  # bytes after the last complete batch that do not form one
    damaged: str | None = None  # why reading stopped early (checksum, undecodable bytes)
    ends: list[int] = field(default_factory=list)  # file offset just past each batch read
    inode: int | None = None  # of the file read (set by `read_segment_from`)
    more: bool = False  # `read_segment_from` stopped at its byte limit: batches follow


def _metadata(md: pa.KeyValueMetadata | None) -> dict[str, str]:
    return {k.decode(errors="replace"): v.decode(errors="replace")
            for k, v in (md or {}).items()}


#: The most one batch of a segment may decode to (docs/format.md, "Limits"): writers cut
#: their batches at a quarter of it, so only a crafted or foreign file holds a larger one,
#: and a reader never allocates more for one batch than this.
MAX_BATCH_BYTES = 256 << 20
#: The most one batch may take as stored (its body holds at most what it decodes to, a
#: length prefix and padding per buffer), so that a length field crafted or damaged to
#: claim gigabytes never makes a reader read them.
MAX_MESSAGE_BYTES = MAX_BATCH_BYTES + (4 << 20)

#: Bytes of a local segment `scan_segment` reads (and holds) at a time.
SCAN_BYTES = 16 << 20

#: What pyarrow raises for bytes that do not decode (torn or damaged messages).
_DECODE_ERRORS = (pa.ArrowException, OSError, ValueError)


def _header_incomplete(data: bytes) -> bool:
    """True if `data` is a prefix of a schema message still being (or torn while) written."""
    if len(data) < 8:
        return data == CONTINUATION[: len(data)] or data[:4] == CONTINUATION
    return data[:4] == CONTINUATION and _body_offset(data) > len(data)


def _check_schema(schema: pa.Schema, meta: dict[str, str], path: Path) -> None:
    """Refuse a schema header that is not its kind's: batches carry checksums, the header
    does not, and a damaged field name or type would read every batch as other values.
    A later minor version may add fields after the known ones."""
    kind = meta.get("tracklake.kind", "")
    expected = SCHEMAS.get(kind)
    fields = list(schema.remove_metadata())
    if expected is None or fields[: len(expected)] != list(expected):
        raise FormatError(f"{path}: its schema header is damaged or not a tracklake "
                          f"{kind or 'record'} schema; move the file out of the store "
                          "(`tracklake fsck` reports what it held)")


def read_segment(path: Path) -> SegmentContents:
    """Read every complete, verified batch of a segment, live or sealed.

    Never raises for a torn or damaged tail: it reports it. Raises `FormatError` only for
    a file that is not a tracklake segment at all, or `NewerFormatError`.
    """
    out = SegmentContents(path)
    out.batches.extend(scan_segment(path, out))
    return out


def scan_segment(path: Path, out: SegmentContents) -> Iterator[pa.RecordBatch]:
    """`read_segment` a batch at a time, so that a consumer holds one decoded batch, not
    the segment's: `out` gets the header's metadata, and once the batches are exhausted,
    how the segment ends (sealed, torn, damaged).

    A local segment is read `SCAN_BYTES` at a time (`read_segment_from`), never whole: a
    file planted or damaged to be huge or sparse costs the memory of its largest batch
    (at most `MAX_MESSAGE_BYTES`), not of its size."""
    touch(path)
    if hasattr(path, "fs_path"):  # a store in an object store: no inode, read it whole
        yield from _scan(path, path.read_bytes(), 0, out)
        return
    inode, offset = None, 0
    while True:
        part = read_segment_from(path, inode, offset, SCAN_BYTES)
        if offset and (part.inode != inode or (part.ends and part.ends[0] <= offset)):
            out.damaged = (f"the file changed while it was read (replaced or truncated "
                           f"before byte {offset})")
            return
        out.schema_metadata = part.schema_metadata
        out.ends.extend(part.ends)
        out.sealed, out.torn_bytes, out.damaged = part.sealed, part.torn_bytes, part.damaged
        out.inode = part.inode
        yield from part.batches
        if not part.more:
            return
        inode, offset = part.inode, part.ends[-1]


def read_segment_from(path: Path, inode: int | None = None, offset: int = 0,
                      max_bytes: int | None = None) -> SegmentContents:
    """Like `read_segment`, but only the batches stored from byte `offset` on, when the
    file is still the one (`inode`) whose batches before `offset` the caller has read,
    and only the complete batches within about `max_bytes` (`more` says if it stopped
    there; at least one batch is read, however large).

    A follower polls a live segment that grows for minutes: reading (and decompressing)
    it whole on every poll costs time and memory in proportion to the segment, not to
    what was appended. The schema header is read again and put in front of the tail,
    which makes a valid IPC stream of its own. Any other file (replaced, or shorter
    than `offset`) is read from its start.
    """
    touch(path)
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        head = f.read(8)
        header_len = _body_offset(head) if len(head) == 8 else -1
        resume = (offset > 0 and st.st_ino == inode and head[:4] == CONTINUATION
                  and 0 < header_len <= offset <= st.st_size)
        start = offset if resume else 0
        limit = st.st_size - start if max_bytes is None else max_bytes
        whole = max_bytes is None
        while True:
            f.seek(start)
            tail = f.read(limit)
            cut = start + len(tail) < st.st_size
            if resume:
                f.seek(0)
                out = decode_bytes(path, f.read(header_len) + tail, start - header_len)
            else:
                out = decode_bytes(path, tail, 0)
            if out.batches or not cut or out.damaged or whole:
                break
            # one batch larger than the limit: read it whole, as far as a batch may go
            whole = True
            at = start if resume else header_len  # where that batch starts in the file
            size = _stored_size(f, at)
            if size is None or size > MAX_MESSAGE_BYTES:
                claims = ("a size that cannot be read" if size is None else
                          f"{size:,} bytes, more than the {MAX_MESSAGE_BYTES:,} a stored "
                          "batch may take")
                out.damaged = (f"the batch at byte {at} claims {claims} (a damaged or "
                               "crafted length field)")
                out.torn_bytes = st.st_size - at
                break
            limit = at - start + size
    if cut and not out.batches and not out.damaged:  # that batch, whole, does not decode
        out.damaged = f"undecodable batch at byte {start if resume else header_len}"
        out.torn_bytes = st.st_size - (start if resume else header_len)
    if cut and not out.damaged:
        out.more, out.torn_bytes, out.sealed = True, 0, False  # the rest is read next
    out.inode = st.st_ino
    return out


def _stored_size(f: BinaryIO, at: int) -> int | None:
    """The bytes the message at offset `at` of `f` takes as stored, read from its length
    prefix and header (never more than MAX_MESSAGE_BYTES of them); None if unreadable."""
    f.seek(at)
    prefix = f.read(8)
    if len(prefix) < 8 or prefix[:4] != CONTINUATION:
        return None
    meta_len = int.from_bytes(prefix[4:], "little")
    if meta_len == 0:
        return len(EOS)
    if meta_len > MAX_MESSAGE_BYTES:
        return 8 + meta_len
    return message_size(memoryview(prefix + f.read(meta_len)))


def decode_bytes(path: Path, data: bytes, shift: int) -> SegmentContents:
    """The batches of `data`, a whole segment or its header followed by a tail that
    starts `shift` bytes later in the file (offsets reported are the file's)."""
    out = SegmentContents(path)
    out.batches.extend(_scan(path, data, shift, out))
    return out


def _scan(path: Path, data: bytes, shift: int, out: SegmentContents
          ) -> Iterator[pa.RecordBatch]:
    """The verified batches of `data` (see `decode_bytes`), one at a time; `out` gets the
    header's metadata, each batch's end offset, and how the data ends."""
    src = pa.BufferReader(data)
    if _header_incomplete(data):
        out.torn_bytes = len(data)  # the header is being written, or was torn at creation
        return
    try:
        reader = pa.ipc.open_stream(src)
        meta = _metadata(reader.schema.metadata)
    except _DECODE_ERRORS as exc:
        raise FormatError(f"{path}: not an Arrow IPC stream ({exc}); it is not a tracklake "
                          "segment or its header is damaged: move it out of the store") from exc
    check_version(meta.get("tracklake.format"), path)
    _check_schema(reader.schema, meta, path)
    if declares_other_than_little_endian(memoryview(data)):
        raise FormatError(f"{path}: its schema header declares big-endian data, which "
                          "tracklake never writes (a damaged header would read every value "
                          "as another); move the file out of the store")
    out.schema_metadata = meta
    while True:
        pos = src.tell()
        claimed = data[pos + 4 : pos + 8] if data[pos : pos + 4] == CONTINUATION else b""
        if len(claimed) == 4 and int.from_bytes(claimed, "little") > MAX_MESSAGE_BYTES:
            out.torn_bytes = len(data) - pos
            out.damaged = (f"the batch at byte {pos + shift} claims a header of "
                           f"{int.from_bytes(claimed, 'little'):,} bytes (a damaged or "
                           "crafted length field)")
            return
        size = decoded_size(memoryview(data)[pos:])
        if size is not None and size > MAX_BATCH_BYTES:
            out.torn_bytes = len(data) - pos
            out.damaged = (f"the batch at byte {pos + shift} would decode to {size:,} bytes, "
                           f"more than the {MAX_BATCH_BYTES:,} a batch may hold (a crafted "
                           "or foreign file: tracklake never writes one)")
            return
        try:
            batch, md = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            out.sealed = data[pos:] == EOS
            if not out.sealed:
                out.torn_bytes = len(data) - pos
            return
        except _DECODE_ERRORS as exc:
            out.torn_bytes = len(data) - pos
            if src.tell() < len(data):
                # a message that is complete but does not decode: damage, not a torn tail
                out.damaged = f"undecodable batch at byte {pos + shift}: {exc}"
            # else an incomplete message: a batch being written right now, or a torn tail
            return
        expected = _metadata(md).get("crc32", "")
        if not _message_crc_matches(memoryview(data)[pos : src.tell()], expected):
            out.torn_bytes = len(data) - pos
            out.damaged = f"checksum mismatch in batch at byte {pos + shift}"
            return
        try:
            batch.validate(full=True)  # a crafted batch's checksum is right too
        except pa.ArrowInvalid as exc:
            out.torn_bytes = len(data) - pos
            out.damaged = f"invalid batch at byte {pos + shift}: {exc}"
            return
        out.ends.append(src.tell() + shift)
        yield batch

