"""One run's TensorBoard event file on disk: its generations' names, TFRecord framing,
buffered appends, and reopening it cut back to the last commit."""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]

# TensorBoard ships no type information; everything from it is Any.
from tensorboard.compat.proto import event_pb2  # type: ignore[import-untyped, unused-ignore]
from tensorboard.plugins.hparams import (  # type: ignore[import-untyped, unused-ignore]
    metadata as hparams_metadata,
)
from tensorboard.summary.writer.record_writer import (  # type: ignore[import-untyped, unused-ignore]
    RecordWriter,
)

from tracklake import ExportError
from tracklake.exporters.tensorboard.events import STATUS_TAG
from tracklake.files import fsync_dir

_BOOKKEEPING_TAGS = frozenset({STATUS_TAG, hparams_metadata.SESSION_END_INFO_TAG})


def io_error(exc: OSError, what: str, path: Path) -> ExportError:
    return ExportError(f"cannot {what} TensorBoard event file {path}: "
                       f"{exc.strerror or exc}", retryable=True)


class EventFile:
    """One run's event file: framed records buffered here, appended at `offset`."""

    def __init__(self, path: Path, fd: int, offset: int, buffer_bytes: int) -> None:
        self.path = path
        self.offset = offset  # bytes of the file written completely by this handle
        self._fd: int | None = fd
        self._pending = bytearray()
        self._buffer_bytes = buffer_bytes
        self._failed: str | None = None

    def append(self, frames: bytes) -> None:
        self._check()
        self._pending += frames
        if len(self._pending) >= self._buffer_bytes:
            self._drain()

    def sync(self) -> int:
        """Append what is buffered, fsync, and return the durable length of the file."""
        self._check()
        self._drain()
        assert self._fd is not None
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._fail(exc, "fsync")
        return self.offset

    def close(self) -> None:
        """Close the file; what is still buffered is dropped (it was not committed)."""
        fd, self._fd = self._fd, None
        self._pending.clear()
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                raise io_error(exc, "close", self.path) from exc

    def _drain(self) -> None:
        if not self._pending:
            return
        assert self._fd is not None
        data = bytes(self._pending)
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except OSError as exc:
            self._fail(exc, "write")
        self.offset += len(data)
        self._pending.clear()

    def _fail(self, exc: OSError, what: str) -> NoReturn:
        # The file may now end in part of a record: nothing more goes to it until the run
        # is opened again, which cuts it back to the last commit.
        error = io_error(exc, what, self.path)
        self._failed = str(error)
        raise error from exc

    def _check(self) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path} is closed")
        if self._failed is not None:
            raise ExportError(f"{self._failed}; open the run again to resume from the last "
                              "commit", retryable=True)


def frames(events: Iterable[Any]) -> bytes:
    """TFRecord framing (length, masked CRC-32C of both) by TensorBoard's RecordWriter."""
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for event in events:
        writer.write(event.SerializeToString())
    return buffer.getvalue()


def holds_records(path: Path) -> bool:
    """Whether an event file holds any exported record (anything but the header events
    and `finish_run()` bookkeeping). A file it cannot parse counts as holding records."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        while True:
            head = f.read(12)
            if len(head) < 12:
                return False  # the end, or a torn header
            (length,) = struct.unpack("<Q", head[:8])
            if length > size - f.tell():
                return False  # a torn record at the end
            data = f.read(length)
            f.read(4)
            try:
                event = event_pb2.Event.FromString(data)
            except DecodeError:
                return True  # not an event: leave the file alone
            if event.HasField("summary") and any(
                    v.tag not in _BOOKKEEPING_TAGS for v in event.summary.value):
                return True
            if not (event.HasField("file_version") or event.HasField("session_log")
                    or event.HasField("summary")):
                return True


def make_dirs(path: Path) -> None:
    """Create `path` and missing parents, fsyncing each new directory's entry."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        fsync_dir(d.parent)


def reopen(path: Path, offset: int, buffer_bytes: int) -> EventFile:
    """The committed event file, cut back to the committed offset."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError as exc:
        raise ExportError(
            f"{path} holds {offset} committed bytes of this run but is missing: if its "
            "file system is not mounted, mount it and export again; to export the run "
            "again from its start, pass --from-start", retryable=False) from exc
    except OSError as exc:
        raise io_error(exc, "open", path) from exc
    try:
        size = os.fstat(fd).st_size
        if size < offset:
            raise ExportError(
                f"{path} is {size} bytes, shorter than the {offset} bytes committed: it "
                "was changed outside tracklake; delete it and pass --from-start to "
                "export the run again", retryable=False)
        if size > offset:  # written after the last commit: the loop sends it again
            os.ftruncate(fd, offset)
            os.fsync(fd)
        os.lseek(fd, offset, os.SEEK_SET)
    except OSError as exc:
        os.close(fd)
        raise io_error(exc, "cut back", path) from exc
    except ExportError:
        os.close(fd)
        raise
    return EventFile(path, fd, offset, buffer_bytes)


def base_name(run_id: str) -> str:
    return f"events.out.tfevents.tracklake.{run_id}"


def file_name(base: str, generation: int) -> str:
    # Zero-padded, so that TensorBoard, which reads a run's files in name order, reads
    # the generations in order.
    return base if generation == 0 else f"{base}.{generation:06d}"


def generation_of(base: str, name: str) -> int | None:
    """The generation number of the event file `name`, or None if it is not one."""
    if name == base:
        return 0
    m = re.fullmatch(re.escape(base) + r"\.(\d{6})", name)
    return int(m.group(1)) if m else None
