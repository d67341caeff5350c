"""Per-rank writer: in-memory buffers, the one thread that writes, and write-failure policy.

`Run` hands each call to `RankWriter` (`add_metrics`, `add_rows`), which appends it to the
buffers under a lock held for microseconds and returns: the caller never waits on storage.
Only the writer thread touches files. Every `flush_interval`, or sooner when
`batch_values` values wait or a caller asks with `flush()`, it swaps the buffers out,
turns them into record batches (`batches.py`) and appends them to the kind's current
segment (`SegmentWriter`). `flush()` and `close()` wait for that thread, up to a deadline.

Memory is bounded by dropping, never by blocking: while buffered and unwritten data exceed
`max_buffer_bytes` (the disk fails, or a write hangs on a stuck file system), new calls are
dropped and counted until a write succeeds again. A write that fails with `OSError` keeps
its batches and retries later from a fresh segment; any other failure to build or write a
batch drops exactly that batch's records, counted, and the writer carries on with the rest
(docs/concepts.md, "When the disk fails").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracklake._format import SCHEMAS, StreamId, segment_name, stream_dir
from tracklake._format.segment import SegmentWriter, stream_schema
from tracklake._write import failures as _messages
from tracklake._write.batches import KeyColumn, MetricCall, metric_batches, row_batches
from tracklake._write.failures import WriteFailures

#: Rough in-memory cost of one buffered metric value (a float object and its list slot).
_BYTES_PER_BUFFERED_VALUE = 32
#: Rough in-memory cost of one buffered row beyond its strings (a dict and its slots).
_BYTES_PER_BUFFERED_ROW = 256
#: While closing, failed writes are retried this often (instead of the backoff).
_CLOSE_RETRY_SECONDS = 0.2


def _row_bytes(rows: list[dict[str, Any]]) -> int:
    return sum(_BYTES_PER_BUFFERED_ROW + sum(len(v) for v in row.values() if isinstance(v, str))
               for row in rows)


class RankWriter:
    """Buffers one rank's records; its thread writes them to that rank's segments."""

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

        # -- shared with the callers; guarded by _lock, which is never held across I/O
        self._lock = threading.Lock()
        self._accepting = True
        self._metric_calls: list[MetricCall] = []
        self.buffered_values = 0  # metric values in _metric_calls
        self._rows: dict[str, list[dict[str, Any]]] = {k: [] for k in SCHEMAS if k != "metrics"}
        self._buffered_row_bytes = 0
        self._buffered_rows = 0
        self._next_seq: dict[str, int] = dict.fromkeys(SCHEMAS, 0)
        self.dropping = False  # over budget: calls are dropped and counted until a write works
        self._pending_bytes = 0  # built, not yet written (updated by the thread)
        self._pending_rows = 0
        self._io_since: float | None = None  # when the write in progress started

        # -- requests to the thread; guarded by _cond
        self._cond = threading.Condition(threading.Lock())
        self._wanted = False
        self._requested = 0  # flush() calls registered
        self._completed = 0  # flush() calls served
        self._clean = True  # nothing was left pending after the last cycle
        self._close_deadline: float | None = None
        self._stopped = threading.Event()
        self._closed_cleanly = False
        self._finalize: Callable[[bool], None] | None = None

        # -- owned by the thread
        self._keys = KeyColumn()
        self._pending: list[tuple[str, pa.RecordBatch]] = []
        self._segments: dict[str, SegmentWriter] = {}
        self._segment_numbers: dict[str, int] = dict.fromkeys(SCHEMAS, 0)
        self._retry_at = 0.0
        self._backoff = flush_interval
        self._failing = False  # between a failed write and the next successful one
        self._thread = threading.Thread(
            target=self._loop, name=f"tracklake-writer-{run}-r{rank}", daemon=True
        )
        self._thread.start()

    # -- called from training threads: never waits on storage ---------------------------

    def add_metrics(self, step: int, time_us: int, keys: tuple[str, ...],
                    values: list[float]) -> bool:
        """Buffer one `log()` call (non-empty); False if the writer is closed."""
        n = len(values)
        with self._lock:
            if not self._accepting:
                return False
            cost = n * _BYTES_PER_BUFFERED_VALUE
            if self.dropping or (self.buffered_values * _BYTES_PER_BUFFERED_VALUE + cost
                                 + self._buffered_row_bytes + self._pending_bytes
                                 > self.max_buffer_bytes and self._over_budget(cost)):
                report = self.failures.dropped("metrics", n)
            else:
                seq = self._next_seq["metrics"]
                self._next_seq["metrics"] = seq + 1
                self._metric_calls.append((seq, step, time_us, keys, values))
                self.buffered_values += n
                if self.buffered_values >= self.batch_values:
                    self._want_flush()
                return True
        if report:
            self._report_drops()
        return True

    def add_rows(self, kind: str, rows: list[dict[str, Any]]) -> int | None:
        """Buffer rows of a non-metric kind as one record group; its seq, -1 if dropped,
        None if the writer is closed."""
        return self._add_rows(kind, rows, internal=False)

    def _add_rows(self, kind: str, rows: list[dict[str, Any]], *, internal: bool) -> int | None:
        if not rows:
            return -1
        nbytes = _row_bytes(rows)
        with self._lock:
            if not self._accepting and not internal:
                return None
            if not internal and (self.dropping or self._over_budget(nbytes)):
                report = self.failures.dropped(kind, len(rows))
            else:
                seq = self._next_seq[kind]
                self._next_seq[kind] = seq + 1
                for row in rows:
                    row["seq"] = seq
                self._rows[kind].extend(rows)
                self._buffered_row_bytes += nbytes
                self._buffered_rows += len(rows)
                return seq
        if report:
            self._report_drops()
        return -1

    def _over_budget(self, extra: int) -> bool:
        buffered = (self.buffered_values * _BYTES_PER_BUFFERED_VALUE + self._buffered_row_bytes
                    + self._pending_bytes + extra)
        if buffered > self.max_buffer_bytes:
            self.dropping = True
        return self.dropping

    def _want_flush(self) -> None:
        # called with _lock held; _cond is a different lock, held for microseconds
        with self._cond:
            self._wanted = True
            self._cond.notify_all()

    def _report_drops(self) -> None:
        _messages.say(_messages.dropping(self.ids["metrics"], self.root,
                                         self.max_buffer_bytes, self.stuck_for()))

    def flush(self, timeout: float | None = None) -> bool:
        """Ask the thread to write everything buffered so far and wait for it (at most
        `timeout` seconds); True if nothing was left pending."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._stopped.is_set() or threading.current_thread() is self._thread:
                return self._clean and not self._unwritten()
            self._requested += 1
            target = self._requested
            self._cond.notify_all()
            while self._completed < target and not self._stopped.is_set():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._clean

    def close(self, timeout: float, finalize: Callable[[bool], None] | None = None) -> bool:
        """Refuse new calls, write what is buffered (retrying until shortly before the
        deadline), seal the segments, then call `finalize(complete)` on the thread.

        Returns by the deadline: True if all of that happened and nothing is unwritten.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            self._accepting = False
        with self._cond:
            self._finalize = finalize
            self._close_deadline = deadline - min(1.0, timeout / 4)
            self._cond.notify_all()
        if not self._thread.is_alive() and not self._stopped.is_set():
            self._shutdown()  # no thread (a forked child): do its work here
        self._stopped.wait(max(0.0, deadline - time.monotonic()))
        return self._stopped.is_set() and self._closed_cleanly

    def record_failure(self, exc: Exception) -> None:
        """Count a failure of a write made outside the thread (an artifact, the attempt file)."""
        with self._lock:
            message = self._count_failure(None, exc)
        _messages.say(message)

    def snapshot(self) -> WriteFailures:
        """A copy of the failure counts, for `finish()`'s report."""
        with self._lock:
            return self.failures.copy()

    def unwritten_records(self) -> int:
        """Records (metric values and rows) accepted but not written yet."""
        return self._unwritten()

    def _unwritten(self) -> int:
        return self.buffered_values + self._buffered_rows + self._pending_rows

    def stuck_for(self) -> float | None:
        """Seconds the write in progress has been running, or None."""
        since = self._io_since
        return None if since is None else time.monotonic() - since

    # -- the writer thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not (self._wanted or self._requested > self._completed
                        or self._close_deadline is not None):
                    self._cond.wait(self.flush_interval)
                self._wanted = False
                target = self._requested
                closing = self._close_deadline is not None
            if closing:
                self._shutdown()
                return
            try:
                self._cycle()
            except Exception as exc:  # a bug of ours must not stop the writer: count it
                self._count_error("metrics", 0, exc)
            with self._cond:
                self._clean = not self._pending
                self._completed = max(self._completed, target)
                self._cond.notify_all()

    def _cycle(self) -> None:
        self._build_batches()
        now = time.monotonic()
        if self._pending and now >= self._retry_at:
            self._write_pending()
        if not self._pending:
            with self._lock:
                self.dropping = False  # everything kept is written: accept calls again
        self._roll_old_segments()
        if self._heartbeat and now - self._last_heartbeat >= self._heartbeat_interval:
            self._last_heartbeat = now
            self._guarded(self._heartbeat)

    def _shutdown(self) -> None:
        complete = False
        try:
            complete = self._drain()
        except Exception as exc:  # a bug of ours: count it, still seal and finalize
            self._count_error("metrics", 0, exc)
        finally:
            self._finish_thread(complete)

    def _drain(self) -> bool:
        deadline = self._close_deadline or time.monotonic()
        while True:
            self._build_batches()
            if self._pending:
                self._write_pending()  # while closing, every try ignores the backoff
            if not self._pending or time.monotonic() >= deadline:
                break
            with self._cond:
                now = time.monotonic()
                self._cond.wait(max(0.0, min(deadline, now + _CLOSE_RETRY_SECONDS) - now))
        for kind in list(self._segments):
            self._seal(kind)
        return not self._pending and not self._unwritten()

    def _finish_thread(self, complete: bool) -> None:
        self._closed_cleanly = complete
        with self._cond:
            self._clean = complete
            self._completed = self._requested
            self._cond.notify_all()
            finalize = self._finalize
        try:
            if finalize is not None:
                finalize(complete)
        finally:
            self._stopped.set()
            with self._cond:
                self._cond.notify_all()

    def _build_batches(self) -> None:
        with self._lock:
            calls = self._metric_calls
            self._metric_calls = []
            self.buffered_values = 0
            rows = {k: v for k, v in self._rows.items() if v}
            for kind in rows:
                self._rows[kind] = []
            self._buffered_row_bytes = 0
            self._buffered_rows = 0
        calls = [c for c in calls if c[4]]  # an empty call holds nothing to write
        for batch in metric_batches(self._keys, calls, self.batch_values, self._count_error):
            self._add_pending("metrics", batch)
        for kind, kind_rows in rows.items():
            for batch in row_batches(kind, kind_rows, self._count_error):
                self._add_pending(kind, batch)

    def _add_pending(self, kind: str, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._pending.append((kind, batch))
        self._pending_bytes += batch.nbytes
        self._pending_rows += batch.num_rows

    def _write_pending(self) -> None:
        while self._pending:
            kind, batch = self._pending[0]
            self._io_since = time.monotonic()
            try:
                self._segment_for(kind, batch).append(batch)
            except OSError as exc:
                self._on_failure(kind, exc)
                return
            except Exception as exc:  # not the disk: this batch can never be written
                self._abandon(kind)
                self._count_error(kind, batch.num_rows, exc)
            finally:
                self._io_since = None
            self._pending.pop(0)
            self._pending_bytes -= batch.nbytes
            self._pending_rows -= batch.num_rows
        with self._lock:
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
        self._io_since = time.monotonic()
        try:
            seg.seal()
        except OSError as exc:
            seg.abandon()
            self._on_failure(kind, exc)
        finally:
            self._io_since = None

    def _abandon(self, kind: str) -> None:
        seg = self._segments.pop(kind, None)
        if seg is not None:
            seg.abandon()  # continue in a new segment; the reader sees this one's torn tail

    def _roll_old_segments(self) -> None:
        now = time.monotonic()
        for kind, seg in list(self._segments.items()):
            if now - seg.opened_at >= self.segment_seconds:
                self._seal(kind)

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except OSError as exc:
            with self._lock:
                message = self._count_failure("runs", exc)
            _messages.say(message)

    def _on_failure(self, kind: str, exc: Exception) -> None:
        self._abandon(kind)
        self._failing = True
        self._backoff = min(self._backoff * 2, 30.0)
        self._retry_at = time.monotonic() + self._backoff
        with self._lock:
            message = self._count_failure(kind, exc)
            self._over_budget(0)
        _messages.say(message)

    def _count_failure(self, kind: str | None, exc: Exception) -> str | None:
        """Count a failed write (with _lock held); the message to print, the first time."""
        if not self.failures.write_failed(exc):
            return None
        ident = self.ids.get(kind or "metrics", self.ids["metrics"])
        return _messages.cannot_write(ident, self.root, self.max_buffer_bytes,
                                      self.failures.last_error)

    def _count_error(self, kind: str, dropped: int, exc: Exception) -> None:
        """A batch that can never be written (not a disk failure): count what it drops."""
        what = f"{dropped} metric values" if kind == "metrics" else f"{dropped} {kind} records"
        error = f"cannot store {what}: {exc.__class__.__name__}: {exc}"
        with self._lock:
            first = self.failures.lost(kind, dropped, error)
        if first:
            _messages.say(_messages.lost(self.ids.get(kind, self.ids["metrics"]), error))

    def _record_recovery(self) -> None:
        self._add_rows("events", [{"time": _now_us(), "step": None, "level": "warning",
                                   "kind": "write_error", "title": "writes failed, then recovered",
                                   "text": self.failures.recovery_text()}], internal=True)


def _now_us() -> int:
    return time.time_ns() // 1000
