"""The TensorBoard destination: one event file per run, framed with TensorBoard's own
`RecordWriter`, appended across exports and cut back to the last commit on reopening.

The layout, mapping, limits, exactly-once design, generations and troubleshooting are
documented in docs/exporters.md (TensorBoard). In short: `write()` turns records into
events (`events`) and buffers their frames; `commit()` appends them, fsyncs
and returns the file's name and length, and `open_run()` truncates the file to that
length (`file`), because the loop re-sends everything after the commit. An
event file can only be appended to, so when the export state is lost after a commit the
run goes to a new generation (``….NNNNNN``) that starts with a ``SessionLog.START``, which
makes TensorBoard's loaders drop what they read from the older files. Child spans wait in
the state until their root arrives, so that a trace is written whole.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeGuard

import click
import pyarrow as pa

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

from tracklake import ExportError
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo
from tracklake.exporters.tensorboard.events import (
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
from tracklake.exporters.tensorboard.file import (
    EventFile,
    base_name,
    file_name,
    frames,
    generation_of,
    holds_records,
    io_error,
    make_dirs,
    reopen,
)
from tracklake.exporters.tensorboard.histograms import histogram_events
from tracklake.exporters.tensorboard.media import media_events
from tracklake.files import fsync_dir

logger = logging.getLogger(__name__)


_SAFE_NAME = re.compile(r"[A-Za-z0-9._+@-]{1,128}\Z")
_MIN_STEP = -(2**63)
_HPARAMS_STATUS = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE",
                   "killed": "STATUS_FAILURE", "crashed": "STATUS_FAILURE",
                   "running": "STATUS_RUNNING"}


# -- the destination -------------------------------------------------------------------


@dataclass
class _OpenRun:
    file: EventFile
    hparams: bool  # the hparams summary is in the file
    held: Held
    #: per rank ("-" for rank aggregates): the latest attempt whose metrics are in the file
    attempts: dict[str, int] = field(default_factory=dict)
    top_step: int | None = None  # the highest metric step in the file


class TensorBoardDestination(Destination):
    """Writes each run as TensorBoard event files in LOGDIR/PROJECT/RUN/."""

    name: ClassVar[str] = "tensorboard"

    def __init__(self, *, logdir: str | os.PathLike[str], buffer_bytes: int = 1 << 20) -> None:
        self.logdir = Path(os.path.abspath(os.path.expanduser(os.fspath(logdir))))
        self.buffer_bytes = buffer_bytes
        self._runs: dict[str, _OpenRun] = {}
        self._context: ExportContext | None = None  # from `start()`

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
        return [click.Option(["--logdir"], required=True, type=click.Path(),
                             help="TensorBoard log directory; each run is written to "
                                  "LOGDIR/PROJECT/RUN/.")]

    def start(self, context: ExportContext) -> None:
        self._context = context

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
            saved = _parse_state(run, state)
            handle = reopen(directory / saved.file, saved.offset, self.buffer_bytes)
            self._runs[run.key] = _OpenRun(handle, saved.hparams, saved.held, saved.attempts,
                                           saved.top_step)
        else:
            self._runs[run.key] = _OpenRun(self._start(run, directory), False, Held())

    def missing(self, run: RunInfo, state: Mapping[str, Any]) -> str | None:
        """Why this log directory no longer holds what `state` says was committed of
        `run` (its event file gone), or None."""
        if not state:
            return None
        saved = _parse_state(run, state)
        path = self.run_dir(run) / saved.file
        if path.is_file():
            return None
        return f"{path} holds {saved.offset} committed bytes of run {run.key} but is missing"

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        current = self._open(run)
        if records.num_rows == 0:
            return
        held = current.held
        events: Iterable[Any]
        attempts, top_step = current.attempts, current.top_step
        if kind == "metrics":
            events = metric_events(records)
            attempts, top_step, restart = _restart(records, attempts, top_step)
            if restart is not None:
                events = itertools.chain([_restart_event(run, restart)], events)
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
        elif kind == "histograms":
            events = histogram_events(records)
        elif kind == "media":
            if self._context is None:
                raise ExportError(f"run {run.key}: cannot write media: the destination was "
                                  "not started (`start()` tells it the store)",
                                  retryable=False)
            events = media_events(records, self._context.root, f"run {run.key}")
        else:
            return  # a kind added by a newer format: optional, so skipped
        current.file.append(frames(events))
        current.held = held
        current.attempts, current.top_step = attempts, top_step
        current.hparams = current.hparams or kind == "configs"

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        current = self._open(run)
        offset = current.file.sync()
        return {"file": current.file.path.name, "offset": offset, "hparams": current.hparams,
                "held_spans": list(current.held.spans.values()),
                "omitted_spans": dict(current.held.omitted),
                "attempts": dict(current.attempts), "top_step": current.top_step}

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
        current.file.append(frames(events))
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

    def _start(self, run: RunInfo, directory: Path) -> EventFile:
        """An event file for a run exported from its start: a new generation if the newest
        one holds exported records (docs/exporters.md, TensorBoard)."""
        try:
            make_dirs(directory)
        except OSError as exc:
            raise ExportError(f"cannot create TensorBoard run directory {directory} "
                              f"({exc.filename or directory}: {exc.strerror or exc})",
                              retryable=True) from exc
        base = base_name(run.run)
        try:
            found = sorted(g for n in os.listdir(directory)
                           if (g := generation_of(base, n)) is not None)
            generation = found[-1] if found else 0
            path = directory / file_name(base, generation)
            if found and holds_records(path):
                generation += 1
                logger.warning(
                    "%s already holds records of run %s but the export state is empty "
                    "(lost, or another exporter writes here): exporting the run again to "
                    "%s, which TensorBoard reads in place of the older files; delete those "
                    "once it is done", path, run.key, file_name(base, generation))
                path = directory / file_name(base, generation)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ExportError(f"cannot create a TensorBoard event file in {directory}: "
                              f"{exc.strerror or exc}", retryable=True) from exc
        try:
            os.ftruncate(fd, 0)
            fsync_dir(directory)
        except OSError as exc:
            os.close(fd)
            raise io_error(exc, "create", path) from exc
        handle = EventFile(path, fd, 0, self.buffer_bytes)
        # Every file starts with a SessionLog.START: TensorBoard's loaders take the first
        # one of a run as its start and every later one as a restart, dropping what they
        # read before it at steps from its step on (here: all of it).
        now = time.time()
        handle.append(frames([
            event_pb2.Event(wall_time=now, file_version="brain.Event:2",
                            source_metadata=event_pb2.SourceMetadata(
                                writer="tracklake.exporters.tensorboard.destination")),
            _session_start(_MIN_STEP, f"tracklake: run {run.key} exported from its start",
                           now)]))
        return handle


@dataclass(frozen=True)
class _Saved:
    """What an export state says of a run's event file."""

    file: str
    offset: int
    hparams: bool
    held: Held
    attempts: dict[str, int]  # none in a state written before they were kept: an
    top_step: int | None      # attempt after it is then taken as the first


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_state(run: RunInfo, state: Mapping[str, Any]) -> _Saved:
    """The state, every field checked (a state file is input: it may have been planted)."""
    name, offset = state.get("file"), state.get("offset")
    spans, omitted = state.get("held_spans", []), state.get("omitted_spans", {})
    attempts, top = state.get("attempts", {}), state.get("top_step")
    if (not isinstance(name, str) or generation_of(base_name(run.run), name) is None
            or not _is_int(offset) or offset < 0
            or not isinstance(spans, list) or not isinstance(omitted, dict)
            or not all(isinstance(s, dict) and isinstance(s.get("id"), str) for s in spans)
            or not all(_is_int(v) for v in omitted.values())
            or not isinstance(attempts, dict)
            or not all(isinstance(k, str) and _is_int(v) for k, v in attempts.items())
            or not (top is None or _is_int(top))):
        raise ExportError(f"run {run.key}: the TensorBoard export state {dict(state)!r} is not "
                          "one this exporter wrote; pass --from-start to export "
                          "it again from its start", retryable=False)
    held = Held({s["id"]: dict(s) for s in spans}, {str(k): v for k, v in omitted.items()})
    return _Saved(name, offset, bool(state.get("hparams")), held, dict(attempts), top)


def _restart(records: pa.Table, attempts: dict[str, int], top_step: int | None
             ) -> tuple[dict[str, int], int | None, int | None]:
    """The attempts and top step once `records` (metrics) are written, and the step at
    which they restart the run: the lowest step of an attempt later than the file holds
    for its rank, if the file holds metrics at or after it. TensorBoard's loaders then
    drop what they read before at that step and after, as the default views do."""
    attempts = dict(attempts)
    restart: int | None = None
    ranks = records.column("rank").to_pylist() if "rank" in records.column_names else None
    numbers = records.column("attempt").to_pylist() if "attempt" in records.column_names \
        else None
    steps = records.column("step").to_pylist()
    if numbers is not None:
        lowest: dict[str, int] = {}  # per rank: the lowest step of its new attempt
        for i, attempt in enumerate(numbers):
            if attempt is None:
                continue
            rank = "-" if ranks is None or ranks[i] is None else str(ranks[i])
            seen = attempts.get(rank)
            if seen is None or attempt > seen:
                if seen is not None and steps[i] is not None:
                    lowest[rank] = min(lowest.get(rank, steps[i]), steps[i])
                attempts[rank] = attempt
            elif attempt == attempts[rank] and rank in lowest and steps[i] is not None:
                lowest[rank] = min(lowest[rank], steps[i])
        first = min(lowest.values(), default=None)
        if first is not None and top_step is not None and first <= top_step:
            restart = first
    present = [s for s in steps if s is not None]
    if present:
        top_step = max(present) if top_step is None else max(top_step, max(present))
    return attempts, top_step, restart


def _restart_event(run: RunInfo, step: int) -> Any:
    return _session_start(step, f"tracklake: a later attempt of run {run.key} logs again "
                                f"from step {step}", time.time())


def _session_start(step: int, msg: str, now: float) -> Any:
    """A ``SessionLog.START`` at `step`: TensorBoard's loaders drop what they read before
    it at that step and after."""
    return event_pb2.Event(wall_time=now, step=step, session_log=event_pb2.SessionLog(
        status=event_pb2.SessionLog.START, msg=msg))
