"""Segment files: framing, checksums and durability of one append-only stream file.

A segment is a plain Arrow IPC stream (``pyarrow.ipc.open_stream`` reads it). Its schema
carries the format version and the stream's identity; every record batch carries a
CRC-32 of its message body and the range of ``seq`` it holds in the batch's custom
metadata; a sealed segment ends with the IPC end-of-stream marker. See docs/format.md.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, StreamId, check_version

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def body_crc(batch: pa.RecordBatch) -> int:
    """CRC-32 of the IPC message body of `batch` (what the writer stores and the reader checks)."""
    return zlib.crc32(pa.ipc.read_message(batch.serialize()).body)


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


def _encode_stream(schema: pa.Schema, batch: pa.RecordBatch | None, md: dict[str, str]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        if batch is not None:
            writer.write_batch(batch, custom_metadata=md)
    return bytes(sink.getvalue())


class SegmentWriter:
    """Appends checksummed record batches to one new segment file, then seals it."""

    def __init__(self, path: Path, schema: pa.Schema, *, fsync: bool = True) -> None:
        self.path = path
        self.schema = schema
        self.fsync = fsync
        header = _encode_stream(schema, None, {})[: -len(EOS)]
        self._header_len = len(header)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.size = 0  # bytes known to be completely written
        self.opened_at = time.monotonic()
        self.batches = 0
        self._write(header)

    def _write(self, data: bytes) -> None:
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
            "crc32": str(body_crc(batch)),
            "seq_first": str(seqs[0].as_py()),
            "seq_last": str(seqs[-1].as_py()),
        }
        data = _encode_stream(self.schema, batch, md)[self._header_len : -len(EOS)]
        self._write(data)
        self.batches += 1

    def seal(self) -> None:
        """Write the end-of-stream marker and close: the segment is complete."""
        self._write(EOS)
        self.close()

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
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


@dataclass
class SegmentContents:
    """What a reader found in one segment file."""

    path: Path
    schema_metadata: dict[str, str] = field(default_factory=dict)
    batches: list[pa.RecordBatch] = field(default_factory=list)
    sealed: bool = False  # ends with the end-of-stream marker
    torn_bytes: int = 0  # bytes after the last complete batch that do not form one
    damaged: str | None = None  # why reading stopped early (checksum, undecodable bytes)


def _metadata(md: pa.KeyValueMetadata | None) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (md or {}).items()}


def read_segment(path: Path) -> SegmentContents:
    """Read every complete, verified batch of a segment, live or sealed.

    Never raises for a torn or damaged tail: it reports it. Raises `FormatError` only for
    a file that is not a tracklake segment at all, or `NewerFormatError`.
    """
    data = path.read_bytes()
    out = SegmentContents(path)
    src = pa.BufferReader(data)
    try:
        reader = pa.ipc.open_stream(src)
    except (pa.ArrowInvalid, OSError) as exc:
        if len(data) < 4096 and (not data or data[:4] == b"\xff\xff\xff\xff"):
            out.torn_bytes = len(data)  # header still being written, or torn at creation
            return out
        raise FormatError(f"{path}: not an Arrow IPC stream ({exc})") from exc
    meta = _metadata(reader.schema.metadata)
    check_version(meta.get("tracklake.format"), path)
    out.schema_metadata = meta
    while True:
        pos = src.tell()
        try:
            batch, md = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            out.sealed = data[pos:] == EOS
            if not out.sealed:
                out.torn_bytes = len(data) - pos
            return out
        except (pa.ArrowInvalid, OSError):
            # An incomplete message: a batch being written right now, or a torn tail.
            out.torn_bytes = len(data) - pos
            return out
        expected = _metadata(md).get("crc32")
        if expected is None or int(expected) != body_crc(batch):
            out.torn_bytes = len(data) - pos
            out.damaged = f"checksum mismatch in batch at byte {pos}"
            return out
        out.batches.append(batch)
