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

import datetime as _dt
import html
import io
import json
import logging
import os
import re
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import click
import pyarrow as pa
import pyarrow.compute as pc
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
from tensorboard.plugins.hparams import (  # type: ignore[import-untyped, unused-ignore]
    summary_v2 as hparams_summary,
)
from tensorboard.plugins.text import (  # type: ignore[import-untyped, unused-ignore]
    summary_v2 as text_summary,
)
from tensorboard.summary.writer.record_writer import (  # type: ignore[import-untyped, unused-ignore]
    RecordWriter,
)

from tracklake._errors import ExportError
from tracklake._format import fsync_dir
from tracklake.exporters._protocol import RunInfo

logger = logging.getLogger(__name__)

#: Child spans held until their root arrives (kept in the commit state, so bounded).
MAX_HELD_SPANS = 200
#: Lines of one rendered trace (root and descendants) before "… N more spans".
MAX_TRACE_LINES = 40
#: Characters of a span error message shown in a trace.
MAX_ERROR_CHARS = 200

STATUS_TAG = "tracklake/status"
_BOOKKEEPING_TAGS = frozenset({STATUS_TAG, hparams_metadata.SESSION_END_INFO_TAG})
_SAFE_NAME = re.compile(r"[A-Za-z0-9._+@-]{1,128}\Z")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")
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


# -- records to events -----------------------------------------------------------------


def _column(table: pa.Table, name: str) -> list[Any]:
    if name in table.column_names:
        return list(table.column(name).to_pylist())
    return [None] * table.num_rows


def _times(table: pa.Table) -> list[float]:
    """Record times in seconds since the epoch, as TensorBoard wall times."""
    return [us / 1_000_000 for us in table.column("time").cast(pa.int64()).to_pylist()]


def _step(step: int | None) -> int:
    return 0 if step is None else step


def _cell(value: object) -> str:
    """Text shown literally in markdown (a table cell or a list item)."""
    text = "" if value is None else str(value)
    text = _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))
    return text.replace("\r\n", "\n").replace("\n", "<br>")


def _number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _md_table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _text_event(tag: str, text: str, step: int, wall_time: float) -> Any:
    return event_pb2.Event(wall_time=wall_time, step=step,
                           summary=text_summary.text_pb(tag, text))


def _several(ranks: Iterable[int | None]) -> bool:
    return len(set(ranks)) > 1


def _metric_events(records: pa.Table) -> Iterator[Any]:
    """One event per record group (same step and time), one scalar per key."""
    values: list[Any] = []
    current: tuple[int, float] | None = None
    for step, key, value, t in zip(_column(records, "step"), _column(records, "key"),
                                   _column(records, "value"), _times(records), strict=True):
        if value is None:
            continue
        group = (_step(step), t)
        if group != current and values:
            yield _scalar_event(current, values)
            values = []
        current = group
        values.append(summary_pb2.Summary.Value(tag=key, simple_value=value))
    if values:
        yield _scalar_event(current, values)


def _scalar_event(group: tuple[int, float] | None, values: list[Any]) -> Any:
    assert group is not None
    return event_pb2.Event(wall_time=group[1], step=group[0],
                           summary=summary_pb2.Summary(value=values))


def _text_events(records: pa.Table) -> Iterator[Any]:
    for step, key, text, t in zip(_column(records, "step"), _column(records, "key"),
                                  _column(records, "text"), _times(records), strict=True):
        yield _text_event(key, text or "", _step(step), t)


def _groups(records: pa.Table, *names: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows (as dicts, with ``wall_time``) grouped by the given columns, in first-seen order."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row, t in zip(records.to_pylist(), _times(records), strict=True):
        row["wall_time"] = t
        out.setdefault(tuple(row.get(n) for n in names), []).append(row)
    return out


def _generation_events(records: pa.Table) -> Iterator[Any]:
    for (key, step), rows in _groups(records, "key", "step").items():
        by_rank = _several(r.get("rank") for r in rows)
        extra = any(r.get("extra") for r in rows)
        headers = [*(["rank"] if by_rank else []), "sample", "input", "output", "score",
                   *(["extra"] if extra else [])]
        table = [[*([r.get("rank")] if by_rank else []), r["sample"], r["input"], r["output"],
                  _number(r["score"]), *([r.get("extra")] if extra else [])] for r in rows]
        yield _text_event(f"generations/{key}", _md_table(headers, table), _step(step),
                          rows[0]["wall_time"])


def _artifact_events(records: pa.Table) -> Iterator[Any]:
    for (step,), rows in _groups(records, "step").items():
        by_rank = _several(r.get("rank") for r in rows)
        headers = [*(["rank"] if by_rank else []), "name", "digest", "size", "media type"]
        table = [[*([r.get("rank")] if by_rank else []), r["name"], r["digest"],
                  f"{r['size']:,} B" if r["size"] is not None else "", r["media_type"]]
                 for r in rows]
        yield _text_event("artifacts", _md_table(headers, table), _step(step),
                          rows[0]["wall_time"])


def _alert_events(records: pa.Table) -> Iterator[Any]:
    alerts = records.filter(pc.equal(records.column("kind"), "alert"))
    for (step,), rows in _groups(alerts, "step").items():
        by_rank = _several(r.get("rank") for r in rows)
        parts = []
        for r in rows:
            where = f" (rank {r.get('rank')})" if by_rank else ""
            head = f"**{_cell((r['level'] or 'warning').upper())}**{where}: {_cell(r['title'])}"
            parts.append(head + (f"\n\n{r['text']}" if r["text"] else ""))
        yield _text_event("alerts", "\n\n".join(parts), _step(step), rows[0]["wall_time"])


def _config_events(run: RunInfo, records: pa.Table, with_hparams: bool) -> Iterator[Any]:
    rows = records.to_pylist()
    if not rows:
        return
    wall_time = _times(records)[0]
    by_rank = _several(r.get("rank") for r in rows)
    headers = [*(["rank"] if by_rank else []), "key", "value"]
    table = [[*([r.get("rank")] if by_rank else []), r["key"], r["value"]] for r in rows]
    yield _text_event("config", _md_table(headers, table), 0, wall_time)
    if with_hparams:
        values = {k: _hparam(v) for k, v in run.config.items()}
        values.update((r["key"], _hparam(_json_value(r["value"]))) for r in rows)
        start = _start_time(run.started_at)
        summary = hparams_summary.hparams_pb(values, trial_id=run.key,
                                             start_time_secs=wall_time if start is None
                                             else start)
        yield event_pb2.Event(wall_time=wall_time, step=0, summary=summary)


def _json_value(text: str | None) -> Any:
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return text


def _hparam(value: Any) -> bool | int | float | str:
    """An hparam value TensorBoard takes: bool, number or string (JSON for the rest)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _start_time(started_at: str | None) -> float | None:
    if not started_at:
        return None
    try:
        return _dt.datetime.fromisoformat(started_at).timestamp()
    except ValueError:
        return None


# -- traces ------------------------------------------------------------------------------


def _span(row: Mapping[str, Any], start: float) -> dict[str, Any]:
    """What a trace text needs of a span (JSON, for the commit state)."""
    end = row.get("end_time")
    ms = (end.timestamp() - start) * 1000 if end is not None else None
    error = row.get("error")
    return {"id": row["span_id"], "parent": row["parent_id"], "trace": row["trace_id"],
            "name": row["name"], "status": row["status"], "ms": ms, "t": start,
            "step": row.get("step"),
            "error": error[:MAX_ERROR_CHARS] if isinstance(error, str) else None}


def _span_line(span: Mapping[str, Any]) -> str:
    ms = f", {span['ms']:.1f} ms" if span.get("ms") is not None else ""
    error = f": {_cell(span['error'])}" if span.get("error") else ""
    return f"{_cell(span['name'])} ({_cell(span['status'])}{ms}){error}"


def _render_trace(root: Mapping[str, Any], spans: list[dict[str, Any]], omitted: int,
                  note: str = "") -> str:
    """A root span in bold, then its descendants as a nested list (at most
    `MAX_TRACE_LINES` of them)."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in sorted(spans, key=lambda s: s["t"]):
        children.setdefault(s["parent"], []).append(s)
    lines: list[str] = []
    seen = {root["id"]}
    total = 0
    stack = [(c, 0) for c in reversed(children.get(root["id"], []))]
    while stack:
        span, depth = stack.pop()
        if span["id"] in seen:
            continue  # a span listed as its own ancestor: damaged ids, shown once
        seen.add(span["id"])
        total += 1
        if len(lines) < MAX_TRACE_LINES:
            lines.append(f"{'    ' * depth}- {_span_line(span)}")
        stack.extend((c, depth + 1) for c in reversed(children.get(span["id"], [])))
    rest = total - len(lines) + omitted
    if rest > 0:
        lines.append(f"- … {rest} more spans")
    head = f"**{_span_line(root)}**{note}"
    return head + ("\n\n" + "\n".join(lines) if lines else "")


@dataclass
class _Held:
    """Child spans waiting for their root; saved in the commit state."""

    spans: dict[str, dict[str, Any]] = field(default_factory=dict)
    omitted: dict[str, int] = field(default_factory=dict)  # trace id -> spans not kept

    def copy(self) -> _Held:
        return _Held(dict(self.spans), dict(self.omitted))

    def add(self, span: dict[str, Any]) -> None:
        if span["id"] in self.spans or len(self.spans) < MAX_HELD_SPANS:
            self.spans[span["id"]] = span
        else:
            self.omitted[span["trace"]] = self.omitted.get(span["trace"], 0) + 1

    def take(self, trace: str) -> tuple[list[dict[str, Any]], int]:
        spans = [s for s in self.spans.values() if s["trace"] == trace]
        for s in spans:
            del self.spans[s["id"]]
        return spans, self.omitted.pop(trace, 0)


def _trace_events(records: pa.Table, held: _Held) -> Iterator[Any]:
    """Texts of the root spans in `records`; their children come from `held` (updated)."""
    roots: dict[tuple[str, int], list[str]] = {}
    wall: dict[tuple[str, int], float] = {}
    for row, t in zip(records.to_pylist(), _times(records), strict=True):
        span = _span(row, t)
        if span["parent"] is not None:
            held.add(span)
            continue
        spans, omitted = held.take(span["trace"])
        key = (span["name"], _step(span["step"]))
        roots.setdefault(key, []).append(_render_trace(span, spans, omitted))
        wall.setdefault(key, t)
    for (name, step), texts in roots.items():
        yield _text_event(f"traces/{name}", "\n\n".join(texts), step, wall[(name, step)])


def _orphan_events(held: _Held) -> Iterator[Any]:
    """Traces whose root span never came: each outermost held span stands for the root."""
    traces = sorted({s["trace"] for s in held.spans.values()})
    for trace in traces:
        spans, omitted = held.take(trace)
        ids = {s["id"] for s in spans}
        for top in sorted((s for s in spans if s["parent"] not in ids), key=lambda s: s["t"]):
            text = _render_trace(top, spans, omitted,
                                 note=" — the root span of this trace was not recorded")
            omitted = 0
            yield _text_event(f"traces/{top['name']}", text, _step(top["step"]), top["t"])


# -- the destination -------------------------------------------------------------------


@dataclass
class _OpenRun:
    file: _EventFile
    hparams: bool  # the hparams summary is in the file
    held: _Held


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
            handle, hparams, held = self._start(run, directory), False, _Held()
        self._runs[run.key] = _OpenRun(handle, hparams, held)

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        current = self._open(run)
        if records.num_rows == 0:
            return
        held = current.held
        events: Iterable[Any]
        if kind == "metrics":
            events = _metric_events(records)
        elif kind == "texts":
            events = _text_events(records)
        elif kind == "configs":
            events = _config_events(run, records, with_hparams=not current.hparams)
        elif kind == "generations":
            events = _generation_events(records)
        elif kind == "traces":
            held = held.copy()  # changed only once the file took the events
            events = _trace_events(records, held)
        elif kind == "artifacts":
            events = _artifact_events(records)
        elif kind == "events":
            events = _alert_events(records)
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
        events = list(_orphan_events(held))
        status = (f"**{_cell(run.status)}** · attempts: {run.attempts} · ranks: "
                  + ", ".join(str(r) for r in run.ranks))
        events.append(_text_event(STATUS_TAG, status, 0, now))
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


def _parse_state(run: RunInfo, state: Mapping[str, Any]) -> tuple[str, int, bool, _Held]:
    name, offset = state.get("file"), state.get("offset")
    spans, omitted = state.get("held_spans", []), state.get("omitted_spans", {})
    if (not isinstance(name, str) or _generation(_base_name(run.run), name) is None
            or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0
            or not isinstance(spans, list) or not isinstance(omitted, dict)
            or not all(isinstance(s, dict) and isinstance(s.get("id"), str) for s in spans)):
        raise ExportError(f"run {run.key}: the TensorBoard export state {dict(state)!r} is not "
                          "one this exporter wrote; delete the run's export state to export "
                          "it again from its start", retryable=False)
    held = _Held({s["id"]: dict(s) for s in spans},
                 {str(k): int(v) for k, v in omitted.items()})
    return name, offset, bool(state.get("hparams")), held
