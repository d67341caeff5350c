"""The TensorBoard destination: one event file per run, framed with TensorBoard's own
`RecordWriter`, appended across exports and cut back to the last commit on reopening.

Layout: ``<logdir>/<project>/<run>/events.out.tfevents.tracklake.<run>`` (a path made from
the run id, never from its display name), plus ``….<run>.NNNNNN`` generations when the
export state was lost (see below). Records become events as follows:

| tracklake | TensorBoard | tag | step |
|---|---|---|---|
| metrics | scalar (`simple_value`) | key | step |
| texts | text, markdown as logged | key | step |
| configs | text: key/value table | `config` | 0 |
|  | hparams session start (once per file) | `_hparams_/session_start_info` | 0 |
| generations | text: sample/input/output/score table per key, step | `generations/<key>` | step |
| traces | text: root span, its descendants as a nested list | `traces/<root name>` | step |
| artifacts | text: name/digest/size/media type table per step | `artifacts` | step |
| events (kind alert) | text: level, title, text; one per step | `alerts` | step |
| `finish_run()` | text: status, attempts, ranks | `tracklake/status` | 0 |
|  | hparams session end (if hparams were written) | `_hparams_/session_end_info` | 0 |

Wall times are record times (the first record's for a table, the root's start for a
trace; the time of writing for `finish_run()`).
A missing step is written as 0. Events of other kinds (`write_error`) and record kinds this
module does not know are skipped. A table column ``rank`` appears where one write holds
records of several ranks. Scalars are float32 (TensorBoard's `simple_value`): values are
rounded, and magnitudes beyond float32 become ±inf. TensorBoard keeps only the first hparams
summary of a run, so config keys logged after the first configs write appear in the
`config` text only. A child span is held (in the commit state, at most `MAX_HELD_SPANS`)
until its root span arrives; what is still held at `finish_run()` is written then.

Exactly-once. Framed records are buffered in memory and appended to the file when the
buffer passes `buffer_bytes` and at `commit()`, which also fsyncs and returns
``{"file", "offset", ...}``. `open_run(state)` cuts the file back to ``state["offset"]``
(the loop re-sends everything after the commit), and refuses, without retrying, a file
that is missing or shorter than the committed offset. With an empty state (the loop
re-sends the run from its start) and no event file, generation 0 is created. If the
newest generation holds no exported records (an export that died before its first
commit), it is rewritten from its start. Otherwise the state was lost after a commit: a
new generation is started, and the older files are left in place (a warning names them)
for the user to delete. Every file starts with a ``SessionLog.START`` at the lowest step;
TensorBoard's Python loader drops, at each START after the first, everything it read
before (its legacy `EventAccumulator` drops scalars but keeps texts), and its Rust data
server drops the points of a tag at and after a step that comes again, which a complete
re-export from the first step does for every tag.

Caveat: a TensorBoard server that read records past the committed offset before a crash
keeps showing them until it is restarted; records reach the file only in buffer-sized
appends and at commit, so that window is small.
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import click
import pyarrow as pa
from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]

# TensorBoard ships no type information; everything from it is Any.
from tensorboard.compat.proto import (  # type: ignore[import-untyped, unused-ignore]
    event_pb2,
    summary_pb2,
)
from tensorboard.plugins.hparams import (  # type: ignore[import-untyped, unused-ignore]
    api_pb2,
    plugin_data_pb2,
)
from tensorboard.plugins.hparams import (  # type: ignore[import-untyped, unused-ignore]
    metadata as hparams_metadata,
)
from tensorboard.summary.writer.record_writer import (  # type: ignore[import-untyped, unused-ignore]
    RecordWriter,
)

from tracklake._errors import ExportError
from tracklake._format import fsync_dir
from tracklake.exporters._protocol import RunInfo
from tracklake.exporters._tensorboard_events import (
    STATUS_TAG,
    Held,
    alert_events,
    artifact_events,
    cell,
    config_events,
    generation_events,
    metric_events,
    orphan_events,
    text_event,
    text_events,
    trace_events,
)

logger = logging.getLogger(__name__)


_BOOKKEEPING_TAGS = frozenset({STATUS_TAG, hparams_metadata.SESSION_END_INFO_TAG})
_SAFE_NAME = re.compile(r"[A-Za-z0-9._+@-]{1,128}\Z")
_MIN_STEP = -(2**63)
_HPARAMS_STATUS = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE",
                   "killed": "STATUS_FAILURE", "crashed": "STATUS_FAILURE",
                   "running": "STATUS_RUNNING"}


# -- the event file --------------------------------------------------------------------


def _io_error(exc: OSError, what: str, path: Path) -> ExportError:
    return ExportError(f"cannot {what} TensorBoard event file {path}: "
                       f"{exc.strerror or exc}", retryable=True)


class _EventFile:
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
                raise _io_error(exc, "close", self.path) from exc

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
        error = _io_error(exc, what, self.path)
        self._failed = str(error)
        raise error from exc

    def _check(self) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path} is closed")
        if self._failed is not None:
            raise ExportError(f"{self._failed}; open the run again to resume from the last "
                              "commit", retryable=True)


def _frames(events: Iterable[Any]) -> bytes:
    """TFRecord framing (length, masked CRC-32C of both) by TensorBoard's RecordWriter."""
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for event in events:
        writer.write(event.SerializeToString())
    return buffer.getvalue()


def _holds_records(path: Path) -> bool:
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


def _make_dirs(path: Path) -> None:
    """Create `path` and missing parents, fsyncing each new directory's entry."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        fsync_dir(d.parent)


# -- the destination -------------------------------------------------------------------


@dataclass
class _OpenRun:
    file: _EventFile
    hparams: bool  # the hparams summary is in the file
    held: Held


class TensorBoardDestination:
    """Writes each run as TensorBoard event files in LOGDIR/PROJECT/RUN/."""

    name: ClassVar[str] = "tensorboard"

    def __init__(self, *, logdir: str | os.PathLike[str], buffer_bytes: int = 1 << 20) -> None:
        self.logdir = Path(os.path.abspath(os.path.expanduser(os.fspath(logdir))))
        self.buffer_bytes = buffer_bytes
        self._runs: dict[str, _OpenRun] = {}

    @classmethod
    def cli_options(cls) -> list[click.Option]:
        return [click.Option(["--logdir"], required=True, type=click.Path(),
                             help="TensorBoard log directory; each run is written to "
                                  "LOGDIR/PROJECT/RUN/.")]

    def describe(self) -> str:
        return f"tensorboard:{self.logdir}"

    def run_dir(self, run: RunInfo) -> Path:
        """Where a run's event files go (from its project and run id)."""
        for part in (run.project, run.run):
            if not _SAFE_NAME.match(part) or part in (".", ".."):
                raise ExportError(f"run {run.key!r}: {part!r} cannot be used as a directory "
                                  "name", retryable=False)
        return self.logdir / run.project / run.run

    # -- the protocol ------------------------------------------------------------------

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        self._drop(run.key)  # an earlier pass's handle: what it did not commit goes
        directory = self.run_dir(run)
        if state:
            name, offset, hparams, held = _parse_state(run, state)
            handle = self._reopen(directory / name, offset)
        else:
            handle, hparams, held = self._start(run, directory), False, Held()
        self._runs[run.key] = _OpenRun(handle, hparams, held)

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        current = self._open(run)
        if records.num_rows == 0:
            return
        held = current.held
        events: Iterable[Any]
        if kind == "metrics":
            events = metric_events(records)
        elif kind == "texts":
            events = text_events(records)
        elif kind == "configs":
            events = config_events(run, records, with_hparams=not current.hparams)
        elif kind == "generations":
            events = generation_events(records)
        elif kind == "traces":
            held = held.copy()  # changed only once the file took the events
            events = trace_events(records, held)
        elif kind == "artifacts":
            events = artifact_events(records)
        elif kind == "events":
            events = alert_events(records)
        else:
            return  # a kind added by a newer format: optional, so skipped
        current.file.append(_frames(events))
        current.held = held
        current.hparams = current.hparams or kind == "configs"

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        current = self._open(run)
        offset = current.file.sync()
        return {"file": current.file.path.name, "offset": offset, "hparams": current.hparams,
                "held_spans": list(current.held.spans.values()),
                "omitted_spans": dict(current.held.omitted)}

    def finish_run(self, run: RunInfo) -> None:
        """Write the final status (and held spans whose root never came), fsync, and close
        the run's file. Not part of a commit: opening the run again cuts it off."""
        current = self._open(run)
        now = time.time()
        held = current.held.copy()
        events = list(orphan_events(held))
        status = (f"**{cell(run.status)}** · attempts: {run.attempts} · ranks: "
                  + ", ".join(str(r) for r in run.ranks))
        events.append(text_event(STATUS_TAG, status, 0, now))
        if current.hparams:
            end = plugin_data_pb2.SessionEndInfo(
                status=api_pb2.Status.Value(_HPARAMS_STATUS.get(run.status, "STATUS_UNKNOWN")),
                end_time_secs=now)
            summary = summary_pb2.Summary()
            summary.value.add(
                tag=hparams_metadata.SESSION_END_INFO_TAG, tensor=hparams_metadata.NULL_TENSOR,
                metadata=hparams_metadata.create_summary_metadata(
                    plugin_data_pb2.HParamsPluginData(session_end_info=end)))
            events.append(event_pb2.Event(wall_time=now, step=0, summary=summary))
        current.file.append(_frames(events))
        current.file.sync()
        self._drop(run.key)

    def close(self) -> None:
        """Close every file; records written since their last commit are dropped."""
        errors = []
        for key in list(self._runs):
            try:
                self._drop(key)
            except ExportError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- files -------------------------------------------------------------------------

    def _open(self, run: RunInfo) -> _OpenRun:
        current = self._runs.get(run.key)
        if current is None:
            raise RuntimeError(f"run {run.key} is not open: call open_run() first")
        return current

    def _drop(self, key: str) -> None:
        current = self._runs.pop(key, None)
        if current is not None:
            current.file.close()

    def _reopen(self, path: Path, offset: int) -> _EventFile:
        """The committed event file, cut back to the committed offset."""
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError as exc:
            raise ExportError(
                f"{path} holds {offset} committed bytes of this run but is missing: if its "
                "file system is not mounted, mount it and export again; to export the run "
                "again from its start, delete its export state", retryable=False) from exc
        except OSError as exc:
            raise _io_error(exc, "open", path) from exc
        try:
            size = os.fstat(fd).st_size
            if size < offset:
                raise ExportError(
                    f"{path} is {size} bytes, shorter than the {offset} bytes committed: it "
                    "was changed outside tracklake; delete it and the run's export state to "
                    "export the run again", retryable=False)
            if size > offset:  # written after the last commit: the loop sends it again
                os.ftruncate(fd, offset)
                os.fsync(fd)
            os.lseek(fd, offset, os.SEEK_SET)
        except OSError as exc:
            os.close(fd)
            raise _io_error(exc, "cut back", path) from exc
        except ExportError:
            os.close(fd)
            raise
        return _EventFile(path, fd, offset, self.buffer_bytes)

    def _start(self, run: RunInfo, directory: Path) -> _EventFile:
        """An event file for a run exported from its start (see the module docstring)."""
        try:
            _make_dirs(directory)
        except OSError as exc:
            raise ExportError(f"cannot create TensorBoard run directory {directory} "
                              f"({exc.filename or directory}: {exc.strerror or exc})",
                              retryable=True) from exc
        base = _base_name(run.run)
        try:
            found = sorted(g for n in os.listdir(directory)
                           if (g := _generation(base, n)) is not None)
            generation = found[-1] if found else 0
            path = directory / _file_name(base, generation)
            if found and _holds_records(path):
                generation += 1
                logger.warning(
                    "%s already holds records of run %s but the export state is empty "
                    "(lost, or another exporter writes here): exporting the run again to "
                    "%s, which TensorBoard reads in place of the older files; delete those "
                    "once it is done", path, run.key, _file_name(base, generation))
                path = directory / _file_name(base, generation)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ExportError(f"cannot create a TensorBoard event file in {directory}: "
                              f"{exc.strerror or exc}", retryable=True) from exc
        try:
            os.ftruncate(fd, 0)
            fsync_dir(directory)
        except OSError as exc:
            os.close(fd)
            raise _io_error(exc, "create", path) from exc
        handle = _EventFile(path, fd, 0, self.buffer_bytes)
        # Every file starts with a SessionLog.START: TensorBoard's loaders take the first
        # one of a run as its start and every later one as a restart, dropping what they
        # read before it at steps from its step on (here: all of it).
        now = time.time()
        handle.append(_frames([
            event_pb2.Event(wall_time=now, file_version="brain.Event:2",
                            source_metadata=event_pb2.SourceMetadata(
                                writer="tracklake.exporters.tensorboard")),
            event_pb2.Event(wall_time=now, step=_MIN_STEP, session_log=event_pb2.SessionLog(
                status=event_pb2.SessionLog.START,
                msg=f"tracklake: run {run.key} exported from its start"))]))
        return handle


def _base_name(run_id: str) -> str:
    return f"events.out.tfevents.tracklake.{run_id}"


def _file_name(base: str, generation: int) -> str:
    # Zero-padded, so that TensorBoard, which reads a run's files in name order, reads
    # the generations in order.
    return base if generation == 0 else f"{base}.{generation:06d}"


def _generation(base: str, name: str) -> int | None:
    if name == base:
        return 0
    m = re.fullmatch(re.escape(base) + r"\.(\d{6})", name)
    return int(m.group(1)) if m else None


def _parse_state(run: RunInfo, state: Mapping[str, Any]) -> tuple[str, int, bool, Held]:
    name, offset = state.get("file"), state.get("offset")
    spans, omitted = state.get("held_spans", []), state.get("omitted_spans", {})
    if (not isinstance(name, str) or _generation(_base_name(run.run), name) is None
            or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0
            or not isinstance(spans, list) or not isinstance(omitted, dict)
            or not all(isinstance(s, dict) and isinstance(s.get("id"), str) for s in spans)):
        raise ExportError(f"run {run.key}: the TensorBoard export state {dict(state)!r} is not "
                          "one this exporter wrote; delete the run's export state to export "
                          "it again from its start", retryable=False)
    held = Held({s["id"]: dict(s) for s in spans},
                 {str(k): int(v) for k, v in omitted.items()})
    return name, offset, bool(state.get("hparams")), held
