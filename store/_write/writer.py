"""Per-rank writer: in-memory buffers, their memory budget and the write-failure counts.

`Run` hands each call to `RankWriter` (`add_metrics`, `add_rows`), which appends it to the
buffers under a lock held for microseconds and returns: the caller never waits on storage.
Only the writer thread (`Flusher`, flusher.py) touches files: it takes the buffers, writes
them and reports back here what is pending, what failed and what was lost.
`flush()` and `close()` wait for that thread, up to a deadline.

Memory is bounded by dropping, never by blocking: while buffered and unwritten data exceed
`max_buffer_bytes` (the disk fails, or a write hangs on a stuck file system), new calls are
dropped and counted until a write succeeds again (docs/concepts.md, "When the disk fails").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracklake._format import SCHEMAS, StreamId
from tracklake._write import failures as _messages
from tracklake._write.batches import MetricCall
from tracklake._write.failures import WriteFailures
from tracklake._write.flusher import Flusher

#: Rough in-memory cost of one buffered metric value (a float object and its list slot).
_BYTES_PER_BUFFERED_VALUE = 32
#: Rough in-memory cost of one buffered row beyond its strings (a dict and its slots).
_BYTES_PER_BUFFERED_ROW = 256


#: The most one text value may hold (UTF-8): larger ones belong in an artifact. Keeps every
#: batch a writer makes within what readers decode (docs/format.md, "Limits").
MAX_VALUE_BYTES = 16 << 20


def _row_bytes(kind: str, rows: list[dict[str, Any]]) -> int:
    """What `rows` take buffered; ValueError naming the field of a value that is larger
    than MAX_VALUE_BYTES."""
    total = 0
    for row in rows:
        total += _BYTES_PER_BUFFERED_ROW
        for name, value in row.items():
            if isinstance(value, str):
                n = len(value)
                if n * 4 > MAX_VALUE_BYTES and len(value.encode(errors="replace")) > \
                        MAX_VALUE_BYTES:
                    raise ValueError(
                        f"{kind} field {name!r}"
                        + (f" of key {row['key']!r}" if isinstance(row.get("key"), str) else "")
                        + f" holds {n:,} characters, more than the {MAX_VALUE_BYTES >> 20} MiB "
                        "one value may hold; log it as an artifact (run.log_artifact)")
                total += n
            elif isinstance(value, (list, tuple)):  # a histogram's edges, trace token ids
                total += 8 * len(value)
            elif hasattr(value, "nbytes"):  # a NumPy array (a histogram's counts)
                total += int(value.nbytes)
    return total


class RankWriter:
    """Buffers one rank's records; its `Flusher` thread writes them to that rank's segments."""

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
        on_sealed: Callable[[], None] | None = None,
    ) -> None:
        self.root = root
        self.ids = {kind: StreamId(project, run, rank, attempt, kind) for kind in SCHEMAS}
        self.batch_values = batch_values
        self.max_buffer_bytes = max_buffer_bytes
        self.failures = WriteFailures()

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

        self._flusher = Flusher(
            self, root, self.ids, flush_interval=flush_interval, batch_values=batch_values,
            segment_bytes=segment_bytes, segment_seconds=segment_seconds, fsync=fsync,
            heartbeat=heartbeat, heartbeat_interval=heartbeat_interval,
            name=f"tracklake-writer-{run}-r{rank}", on_sealed=on_sealed)

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
                    self._flusher.wake()  # _lock held: wake() takes another, for microseconds
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
        nbytes = _row_bytes(kind, rows)
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

    def _report_drops(self) -> None:
        _messages.say(_messages.dropping(self.ids["metrics"], self.root,
                                         self.max_buffer_bytes, self.stuck_for()))

    def flush(self, timeout: float | None = None) -> bool:
        """Ask the thread to write everything buffered so far and wait for it (at most
        `timeout` seconds); True if nothing was left pending."""
        return self._flusher.flush(timeout)

    def close(self, timeout: float, finalize: Callable[[bool], None] | None = None) -> bool:
        """Refuse new calls, write what is buffered (retrying until shortly before the
        deadline), seal the segments, then call `finalize(complete)` on the thread.

        Returns by the deadline: True if all of that happened and nothing is unwritten.
        """
        with self._lock:
            self._accepting = False
        return self._flusher.close(timeout, finalize)

    def record_failure(self, exc: Exception, where: Path | None = None) -> None:
        """Count a failure of a write other than a segment's (an artifact, the attempt
        file, shipping into the store at `where` when it is not this writer's root)."""
        with self._lock:
            message = self._count_failure(None, exc, where)
        _messages.say(message)

    def snapshot(self) -> WriteFailures:
        """A copy of the failure counts, for `finish()`'s report."""
        with self._lock:
            return self.failures.copy()

    def unwritten_records(self) -> int:
        """Records (metric values and rows) accepted but not written yet."""
        return self.buffered_values + self._buffered_rows + self._pending_rows

    def stuck_for(self) -> float | None:
        """Seconds the write in progress has been running, or None."""
        return self._flusher.stuck_for()

    # -- called from the writer thread (flusher.Buffers) ---------------------------------

    def take(self) -> tuple[list[MetricCall], dict[str, list[dict[str, Any]]]]:
        """Everything buffered since the last take: the metric calls, the rows by kind."""
        with self._lock:
            calls = self._metric_calls
            self._metric_calls = []
            self.buffered_values = 0
            rows = {k: v for k, v in self._rows.items() if v}
            for kind in rows:
                self._rows[kind] = []
            self._buffered_row_bytes = 0
            self._buffered_rows = 0
        return calls, rows

    def note_pending(self, nbytes: int, rows: int) -> None:
        """Built and unwritten batches grew by `nbytes` and `rows` (negative: shrank)."""
        self._pending_bytes += nbytes  # only the thread writes these; callers read them
        self._pending_rows += rows

    def caught_up(self) -> None:
        """Everything kept is written: accept calls again."""
        with self._lock:
            self.dropping = False

    def write_failed(self, kind: str, exc: OSError) -> None:
        """A segment write failed (it is retried): count it, and drop calls if over budget."""
        with self._lock:
            message = self._count_failure(kind, exc)
            self._over_budget(0)
        _messages.say(message)

    def _count_failure(self, kind: str | None, exc: Exception,
                       where: Path | None = None) -> str | None:
        """Count a failed write (with _lock held); the message to print, the first time."""
        if not self.failures.write_failed(exc):
            return None
        ident = self.ids.get(kind or "metrics", self.ids["metrics"])
        if where is not None:  # shipping: nothing waits in memory, the node's disk holds it
            return _messages.cannot_ship(ident, where, self.failures.last_error)
        return _messages.cannot_write(ident, self.root, self.max_buffer_bytes,
                                      self.failures.last_error)

    def lost(self, kind: str, dropped: int, exc: Exception) -> None:
        """A batch that can never be written (not a disk failure): count what it drops."""
        what = f"{dropped} metric values" if kind == "metrics" else f"{dropped} {kind} records"
        error = f"cannot store {what}: {exc.__class__.__name__}: {exc}"
        with self._lock:
            first = self.failures.lost(kind, dropped, error)
        if first:
            _messages.say(_messages.lost(self.ids.get(kind, self.ids["metrics"]), error))

    def segment_taken(self, kind: str, path: Path) -> None:
        """The open segment of `kind` was removed under the writer: count it, say so once."""
        with self._lock:
            first = self.failures.taken(path)
        if first:
            _messages.say(_messages.taken(self.ids.get(kind, self.ids["metrics"]), path))

    def record_recovery(self) -> None:
        """Writes failed, then one succeeded: buffer an event saying so (never dropped)."""
        self._add_rows("events", [{"time": _now_us(), "step": None, "level": "warning",
                                   "kind": "write_error", "title": "writes failed, then recovered",
                                   "text": self.failures.recovery_text()}], internal=True)


def _now_us() -> int:
    return time.time_ns() // 1000
