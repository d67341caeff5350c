"""Per-rank writer: in-memory column buffers, the flush thread, and write-failure policy.

`Run` appends to the buffers under a short lock and returns: a metric call is buffered as
(seq, step, time, key tuple, value list), so the per-value work happens later, in C, when
the flush thread (or a synchronous `flush()`) swaps the buffers out and turns them into
record batches of at most `batch_values` values, appended to the kind's current segment.
If the training thread outpaces the flush thread by `4 * batch_values` values while the
disk is healthy, the training thread writes a batch itself (back-pressure) instead of
letting memory grow. A write that fails keeps its batches pending
and retries later from a fresh segment; while nothing can be written, buffered data is
capped at `max_buffer_bytes` and what arrives beyond that is dropped and counted
(docs/concepts.md, "When the disk fails").
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._format import SCHEMAS, StreamId, segment_name, stream_dir
from tracklake._format.segment import SegmentWriter, stream_schema

_METRICS = SCHEMAS["metrics"]
#: Rough in-memory cost of one buffered metric value (a float object and its list slot).
_BYTES_PER_BUFFERED_VALUE = 32
MetricCall = tuple[int, int, int, tuple[str, ...], list[float]]  # seq, step, time_us, keys, values


@dataclass
class WriteFailures:
    """What could not be written, for the stderr report, the event record and finish()."""

    count: int = 0
    last_error: str | None = None
    dropped_values: int = 0
    dropped_records: int = 0
    reported: bool = False
    by_errno: dict[str, int] = field(default_factory=dict)


def _float_array(values: list[float]) -> pa.Array:
    try:
        return pa.array(values, pa.float64())
    except (pa.ArrowInvalid, OverflowError, TypeError):
        # a Python int beyond float64 range slipped through the fast path
        return pa.array([_clamp(v) for v in values], pa.float64())


def _clamp(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float64 range
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):  # an object that passed the fast path's sum() only
        return math.nan


class RankWriter:
    """Buffers one rank's records and writes them to that rank's segments."""

    def __init__(
        self,
        root: Path,
        project: str,
        run: str,
        rank: int,
        attempt: int,
        *,
        flush_interval: float = 0.5,
        batch_values: int = 65536,
        segment_bytes: int = 64 << 20,
        segment_seconds: float = 600.0,
        max_buffer_bytes: int = 256 << 20,
        fsync: bool = True,
        heartbeat: Callable[[], None] | None = None,
        heartbeat_interval: float = 30.0,
    ) -> None:
        self.root = root
        self.ids = {kind: StreamId(project, run, rank, attempt, kind) for kind in SCHEMAS}
        self.flush_interval = flush_interval
        self.batch_values = batch_values
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self.max_buffer_bytes = max_buffer_bytes
        self.fsync = fsync
        self.failures = WriteFailures()
        self._heartbeat = heartbeat
        self._heartbeat_interval = heartbeat_interval
        self._last_heartbeat = time.monotonic()

        self.lock = threading.Lock()  # guards the buffers below; held for microseconds
        self.metric_calls: list[MetricCall] = []
        self.buffered_values = 0  # metric values in metric_calls
        self.backpressure_values = 4 * batch_values
        self.rows: dict[str, list[dict[str, Any]]] = {k: [] for k in SCHEMAS if k != "metrics"}
        self.next_seq: dict[str, int] = dict.fromkeys(SCHEMAS, 0)
        self.dropping = False  # set while the buffer is over budget; log() drops and counts

        self._io_lock = threading.Lock()  # one flush at a time
        self._pending: list[tuple[str, pa.RecordBatch]] = []
        self._pending_bytes = 0
        self._segments: dict[str, SegmentWriter] = {}
        self._segment_numbers: dict[str, int] = dict.fromkeys(SCHEMAS, 0)
        self._retry_at = 0.0
        self._backoff = flush_interval
        self._failing = False  # between a failed write and the next successful one
        self._key_ids: dict[str, int] = {}
        self._key_dictionary = pa.array([], pa.string())
        self._keyset_ids: dict[tuple[str, ...], Any] = {}  # key tuple -> int32 index array
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(
            target=self._loop, name=f"tracklake-writer-{run}-r{rank}", daemon=True
        )
        self._thread.start()

    # -- called from the training thread ---------------------------------------------

    def add_rows(self, kind: str, rows: list[dict[str, Any]]) -> int:
        """Buffer rows of a non-metric kind as one record group; returns its seq."""
        with self.lock:
            if self.dropping:
                self.failures.dropped_records += len(rows)
                return -1
            seq = self.next_seq[kind]
            self.next_seq[kind] = seq + 1
            for row in rows:
                row["seq"] = seq
            self.rows[kind].extend(rows)
        return seq

    def wake(self) -> None:
        self._wake.set()

    def relieve(self) -> None:
        """Called by `log()` when the buffer outgrew the flush thread: write now if the disk
        is healthy (back-pressure), else let `flush()` decide what to drop."""
        if self._retry_at <= time.monotonic():
            self.flush()
        else:
            with self.lock:
                self._update_dropping()

    def _update_dropping(self) -> None:
        buffered = self.buffered_values * _BYTES_PER_BUFFERED_VALUE + self._pending_bytes
        self.dropping = buffered > self.max_buffer_bytes

    # -- the flush thread --------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._closing:
                break
            try:
                self.flush()
            except Exception as exc:  # a bug must not stop the writer: report it, keep going
                with self._io_lock:
                    self._on_failure("metrics", exc)

    def flush(self) -> bool:
        """Write everything buffered so far; True if nothing is left pending."""
        with self._io_lock:
            self._build_batches()
            now = time.monotonic()
            if self._pending and now >= self._retry_at:
                self._write_pending()
            self._roll_old_segments()
            if self._heartbeat and now - self._last_heartbeat >= self._heartbeat_interval:
                self._last_heartbeat = now
                self._guarded(self._heartbeat)
            return not self._pending

    def _build_batches(self) -> None:
        with self.lock:
            calls = self.metric_calls
            self.metric_calls = []
            self.buffered_values = 0
            rows = {k: v for k, v in self.rows.items() if v}
            for kind in rows:
                self.rows[kind] = []
        start = 0
        while start < len(calls):
            end, n = start, 0
            while end < len(calls) and (n == 0 or n + len(calls[end][4]) <= self.batch_values):
                n += len(calls[end][4])
                end += 1
            self._add_pending("metrics", self._metric_batch(calls[start:end]))
            start = end
        for kind, kind_rows in rows.items():
            self._add_pending(kind, pa.RecordBatch.from_pylist(kind_rows, schema=SCHEMAS[kind]))

    def _key_indices(self, keys: tuple[str, ...]) -> Any:
        ids = self._keyset_ids.get(keys)
        if ids is None:
            import numpy as np

            for key in keys:
                if key not in self._key_ids:
                    self._key_ids[key] = len(self._key_ids)
            if len(self._key_dictionary) != len(self._key_ids):
                self._key_dictionary = pa.array(list(self._key_ids), pa.string())
            ids = np.fromiter((self._key_ids[k] for k in keys), np.int32, len(keys))
            self._keyset_ids[keys] = ids
        return ids

    def _metric_batch(self, calls: list[MetricCall]) -> pa.RecordBatch:
        import numpy as np  # on the flush thread, not at `import tracklake`

        counts = np.fromiter((len(c[4]) for c in calls), np.int64, len(calls))
        meta = np.array([c[:3] for c in calls], dtype=np.int64)
        key_ids = np.concatenate([self._key_indices(c[3]) for c in calls])
        values = [v for c in calls for v in c[4]]
        return pa.record_batch(
            [
                pa.array(np.repeat(meta[:, 0], counts)),
                pa.array(np.repeat(meta[:, 2], counts)).cast(_METRICS.field("time").type),
                pa.array(np.repeat(meta[:, 1], counts)),
                self._key_dictionary.take(pa.array(key_ids)),
                _float_array(values),
            ],
            schema=_METRICS,
        )

    def _add_pending(self, kind: str, batch: pa.RecordBatch) -> None:
        self._pending.append((kind, batch))
        self._pending_bytes += batch.nbytes
        if self.failures.count and self._pending:
            self._update_dropping()

    def _write_pending(self) -> None:
        while self._pending:
            kind, batch = self._pending[0]
            try:
                self._segment_for(kind, batch).append(batch)
            except OSError as exc:
                self._on_failure(kind, exc)
                return
            self._pending.pop(0)
            self._pending_bytes -= batch.nbytes
        with self.lock:
            self.dropping = False
        if self._failing:
            self._failing = False
            self._backoff = self.flush_interval
            self._record_recovery()
            self._build_batches()  # write the recovery event now, not at some later flush
            self._write_pending()

    def _segment_for(self, kind: str, batch: pa.RecordBatch) -> SegmentWriter:
        seg = self._segments.get(kind)
        if seg is not None and (
            seg.size >= self.segment_bytes
            or time.monotonic() - seg.opened_at >= self.segment_seconds
        ):
            self._seal(kind)
            seg = None
        if seg is None:
            number = self._segment_numbers[kind]
            self._segment_numbers[kind] = number + 1
            ident = self.ids[kind]
            first_seq = int(batch.column(0)[0].as_py())
            path = stream_dir(self.root, ident) / segment_name(number, first_seq)
            seg = SegmentWriter(path, stream_schema(SCHEMAS[kind], ident), fsync=self.fsync)
            self._segments[kind] = seg
        return seg

    def _seal(self, kind: str) -> None:
        seg = self._segments.pop(kind)
        try:
            seg.seal()
        except OSError as exc:
            seg.abandon()
            self._on_failure(kind, exc)

    def _roll_old_segments(self) -> None:
        now = time.monotonic()
        for kind, seg in list(self._segments.items()):
            if now - seg.opened_at >= self.segment_seconds:
                self._seal(kind)

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except OSError as exc:
            self._on_failure("runs", exc)

    def record_failure(self, exc: Exception) -> None:
        """Count a failure of a write made outside the flush (an artifact, the attempt file)."""
        with self._io_lock:
            self._count_failure(None, exc)

    def _on_failure(self, kind: str, exc: Exception) -> None:
        seg = self._segments.pop(kind, None)
        if seg is not None:
            seg.abandon()  # continue in a new segment; the reader sees this one's torn tail
        self._failing = True
        self._backoff = min(self._backoff * 2, 30.0)
        self._retry_at = time.monotonic() + self._backoff
        self._count_failure(kind, exc)

    def _count_failure(self, kind: str | None, exc: Exception) -> None:
        f = self.failures
        f.count += 1
        f.last_error = f"{exc.__class__.__name__}: {exc}"
        errno_ = getattr(exc, "errno", None)
        name = _errno_name(errno_) if isinstance(errno_, int) else type(exc).__name__
        f.by_errno[name] = f.by_errno.get(name, 0) + 1
        if not f.reported:
            f.reported = True
            ident = self.ids.get(kind or "metrics", self.ids["metrics"])
            print(
                f"tracklake: cannot write run {ident.run!r} rank {ident.rank} under "
                f"{self.root}: {f.last_error}. Training continues; tracklake keeps up to "
                f"{_size(self.max_buffer_bytes)} buffered, retries with backoff, and "
                "reports the total at finish(). (Reported once.)",
                file=sys.stderr,
                flush=True,
            )

    def _record_recovery(self) -> None:
        f = self.failures
        text = (f"{f.count} failed writes ({', '.join(f'{k}: {v}' for k, v in f.by_errno.items())})"
                f"; last: {f.last_error}; dropped {f.dropped_values} metric values and "
                f"{f.dropped_records} records while the buffer was full")
        self.add_rows("events", [{"time": _now_us(), "step": None, "level": "warning",
                                  "kind": "write_error", "title": "writes failed, then recovered",
                                  "text": text}])

    # -- shutdown ----------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> bool:
        """Flush, retrying until `timeout`, seal every segment, stop the thread."""
        deadline = time.monotonic() + timeout
        self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        while True:
            with self._io_lock:
                self._retry_at = 0.0
            if self.flush() or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        with self._io_lock:
            for kind in list(self._segments):
                self._seal(kind)
            return not self._pending

    @property
    def pending_records(self) -> int:
        return sum(b.num_rows for _, b in self._pending)


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.0f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.0f} KiB"


def _now_us() -> int:
    return time.time_ns() // 1000


def _errno_name(number: int) -> str:
    import errno

    return errno.errorcode.get(number, str(number))
