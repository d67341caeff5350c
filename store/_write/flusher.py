"""The writer thread of one rank: it alone builds record batches and writes them.

`RankWriter` (writer.py) buffers the calls and asks this thread to write them (`wake`,
`flush`, `close`). Every `flush_interval`, or sooner when asked, the thread takes what is
buffered (`Buffers.take`), turns it into record batches (`batches.py`) and appends them
to the kind's current segment (`SegmentWriter`), rolling to a new segment by size and
age. A write that fails with `OSError` keeps its batches and retries later, with a
backoff, from a fresh segment; any other failure to build or write a batch drops exactly
that batch's records, counted by the buffers' side (`Buffers.lost`), and the thread
carries on with the rest (docs/concepts.md, "When the disk fails").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from tracklake._format import SCHEMAS, StreamId, segment_name, stream_dir
from tracklake._format.files import store_dir
from tracklake._format.segment import SegmentWriter, stream_schema
from tracklake._write.batches import (
    KeyColumn,
    MetricCall,
    cut_rows,
    metric_batches,
    row_batches,
)

#: While closing, failed writes are retried this often (instead of the backoff).
_CLOSE_RETRY_SECONDS = 0.2


class Buffers(Protocol):
    """What the thread asks of the buffering side (`RankWriter`), one call each."""

    def take(self) -> tuple[list[MetricCall], dict[str, list[dict[str, Any]]]]: ...
    def note_pending(self, nbytes: int, rows: int) -> None: ...  # built, not yet written
    def caught_up(self) -> None: ...  # everything kept is written
    def write_failed(self, kind: str, exc: OSError) -> None: ...  # a segment write; retried
    def record_failure(self, exc: Exception) -> None: ...  # another write (the heartbeat)
    def lost(self, kind: str, dropped: int, exc: Exception) -> None: ...  # never written
    def segment_taken(self, kind: str, path: Path) -> None: ...  # removed while open
    def record_recovery(self) -> None: ...  # writes failed, then one succeeded
    def unwritten_records(self) -> int: ...


class Flusher:
    """The thread that writes one rank's buffered records to that rank's segments."""

    def __init__(
        self,
        buffers: Buffers,
        root: Path,
        ids: dict[str, StreamId],
        *,
        flush_interval: float,
        batch_values: int,
        segment_bytes: int,
        segment_seconds: float,
        fsync: bool,
        heartbeat: Callable[[], None] | None,
        heartbeat_interval: float,
        name: str,
        on_sealed: Callable[[], None] | None = None,
    ) -> None:
        self._buffers = buffers
        self.root = root
        self.ids = ids
        self.flush_interval = flush_interval
        self.batch_values = batch_values
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self.fsync = fsync
        self._heartbeat = heartbeat
        self._heartbeat_interval = heartbeat_interval
        self._on_sealed = on_sealed  # called after a cycle that sealed a segment (running)
        self._sealed = False
        self._last_heartbeat = time.monotonic()
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
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- called from other threads -------------------------------------------------------

    def wake(self) -> None:
        """Write soon, without waiting for `flush_interval` (takes a lock for microseconds)."""
        with self._cond:
            self._wanted = True
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Write everything buffered so far and wait for it (at most `timeout` seconds);
        True if nothing was left pending."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._stopped.is_set() or threading.current_thread() is self._thread:
                return self._clean and not self._buffers.unwritten_records()
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
        """Write what is buffered (retrying until shortly before the deadline), seal the
        segments, then call `finalize(complete)` on the thread.

        Returns by the deadline: True if all of that happened and nothing is unwritten.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._finalize = finalize
            self._close_deadline = deadline - min(1.0, timeout / 4)
            self._cond.notify_all()
        if not self._thread.is_alive() and not self._stopped.is_set():
            self._shutdown()  # no thread (a forked child): do its work here
        self._stopped.wait(max(0.0, deadline - time.monotonic()))
        return self._stopped.is_set() and self._closed_cleanly

    def stuck_for(self) -> float | None:
        """Seconds the write in progress has been running, or None."""
        since = self._io_since
        return None if since is None else time.monotonic() - since

    # -- the thread ------------------------------------------------------------------------

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
                self._buffers.lost("metrics", 0, exc)
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
            self._buffers.caught_up()
        self._roll_old_segments()
        if self._sealed and self._on_sealed is not None:
            self._sealed = False
            self._on_sealed()
        if self._heartbeat and now - self._last_heartbeat >= self._heartbeat_interval:
            self._last_heartbeat = now
            try:
                self._heartbeat()
            except OSError as exc:
                self._buffers.record_failure(exc)

    def _shutdown(self) -> None:
        complete = False
        try:
            complete = self._drain()
        except Exception as exc:  # a bug of ours: count it, still seal and finalize
            self._buffers.lost("metrics", 0, exc)
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
        return not self._pending and not self._buffers.unwritten_records()

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
        calls, rows = self._buffers.take()
        calls = [c for c in calls if c[4]]  # an empty call holds nothing to write
        lost = self._buffers.lost
        for batch in metric_batches(self._keys, calls, self.batch_values, lost):
            self._add_pending("metrics", batch)
        for kind, kind_rows in rows.items():
            for batch in row_batches(kind, kind_rows, lost):
                for piece in cut_rows(batch):
                    self._add_pending(kind, piece)

    def _add_pending(self, kind: str, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._pending.append((kind, batch))
        self._buffers.note_pending(batch.nbytes, batch.num_rows)

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
                self._buffers.lost(kind, batch.num_rows, exc)
            finally:
                self._io_since = None
            self._pending.pop(0)
            self._buffers.note_pending(-batch.nbytes, -batch.num_rows)
        self._buffers.caught_up()
        if self._failing:
            self._failing = False
            self._backoff = self.flush_interval
            self._buffers.record_recovery()
            self._build_batches()  # write the recovery event now, not at some later flush
            self._write_pending()

    def _segment_for(self, kind: str, batch: pa.RecordBatch) -> SegmentWriter:
        seg = self._segments.get(kind)
        if seg is not None and seg.taken():
            self._segment_taken(kind)
            seg = None
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
            store_dir(self.root, path.parent)
            seg = SegmentWriter(path, stream_schema(SCHEMAS[kind], ident), fsync=self.fsync)
            self._segments[kind] = seg
        return seg

    def _seal(self, kind: str) -> None:
        if self._segments[kind].taken():
            self._segment_taken(kind)
            return
        seg = self._segments.pop(kind)
        self._io_since = time.monotonic()
        try:
            seg.seal()
            self._sealed = True
        except OSError as exc:
            seg.abandon()
            self._on_failure(kind, exc)
        finally:
            self._io_since = None

    def _segment_taken(self, kind: str) -> None:
        """The open segment was removed or replaced under this writer: what it held may be
        lost. Say so, and continue in a new segment (the pending batch is not lost)."""
        seg = self._segments.pop(kind)
        seg.close()
        self._buffers.segment_taken(kind, seg.path)

    def _abandon(self, kind: str) -> None:
        seg = self._segments.pop(kind, None)
        if seg is not None:
            seg.abandon()  # continue in a new segment; the reader sees this one's torn tail

    def _roll_old_segments(self) -> None:
        now = time.monotonic()
        for kind, seg in list(self._segments.items()):
            if now - seg.opened_at >= self.segment_seconds:
                self._seal(kind)

    def _on_failure(self, kind: str, exc: OSError) -> None:
        self._abandon(kind)
        self._failing = True
        self._backoff = min(self._backoff * 2, 30.0)
        self._retry_at = time.monotonic() + self._backoff
        self._buffers.write_failed(kind, exc)
