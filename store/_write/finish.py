"""A run's lifecycle: running until `finish()`, which closes the rank's writer and writes
the attempt's final record with its `FinishReport`.

`RunHandle` is the part of `Run` that starts and ends it (run.py adds the logging
methods): it owns the rank's `RankWriter` and the attempt record that the writer thread
keeps alive (the heartbeat) and finally closes. Process exit and SIGTERM reach it
through `lifecycle.py`.
"""

from __future__ import annotations

import enum
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tracklake._errors import RunStateError
from tracklake._format.attempt import TERMINAL_STATUSES, now_iso, write_attempt
from tracklake._write import lifecycle as _lifecycle
from tracklake._write.compactor import Compactor, compaction_wanted
from tracklake._write.failures import say
from tracklake._write.shipping import ShipThread
from tracklake._write.writer import RankWriter

_Handle = TypeVar("_Handle", bound="RunHandle")


class Lifecycle(enum.Enum):
    """Where a `Run` is in its life: running until `finish()` begins, then finished."""

    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class FinishReport:
    """What `Run.finish()` could and could not write."""

    status: str
    complete: bool  # every record reached the disk
    failed_writes: int = 0
    last_error: str | None = None
    dropped_values: int = 0
    dropped_records: int = 0
    unwritten_records: int = 0
    segments_taken: int = 0  # open segments another process removed: their data may be lost
    errors_by_errno: dict[str, int] = field(default_factory=dict)


class RunHandle:
    """One rank's handle on a run, without the logging methods (`Run` adds them)."""

    def __init__(self, *, root: Path, project: str, run_id: str, name: str | None, rank: int,
                 attempt: int, attempt_path: Path, record: dict[str, Any],
                 writer_options: Mapping[str, Any]) -> None:
        self.root = root
        self.project = project
        self.id = run_id
        self.name = name
        self.rank = rank
        self.attempt = attempt
        self._record = record
        self._attempt_path = attempt_path
        self._state = Lifecycle.RUNNING
        self._state_lock = threading.Lock()
        self._finished = threading.Event()
        self._finishing_thread: threading.Thread | None = None
        self._status = "running"
        self._report: FinishReport | None = None
        options = dict(writer_options)
        local: Path | None = options.pop("local", None)
        compact = compaction_wanted(options.pop("compact", None)) and local is None
        self._compactor = Compactor(root, project, run_id, rank) if compact else None
        self._deadline = 0.0  # of finish(), for its last shipping round
        self._shipping: ShipThread | None = None
        self._writer = RankWriter(
            local or root, project, run_id, rank, attempt,
            heartbeat=self._heartbeat if local is None else self._refresh_claims,
            on_sealed=self._compactor.segment_sealed if self._compactor else None, **options)
        if local is not None:  # ship mode: this node's disk, moved into root by a thread
            try:
                self._shipping = ShipThread(
                    local, root, self._writer.ids.values(), heartbeat=self._heartbeat,
                    heartbeat_interval=options.get("heartbeat_interval", 30.0),
                    fsync=options.get("fsync", True),
                    on_failure=lambda exc: self._writer.record_failure(exc, root))
            except BaseException as exc:
                self._writer.close(0.0)
                error = self._not_started(exc, local)
                if isinstance(exc, Exception):
                    raise RuntimeError(error) from exc
                raise

    def _not_started(self, exc: BaseException, local: Path) -> str:
        """Record the attempt failed (it would show running while this process lives)
        when its shipper could not start, nothing logged yet; what went wrong."""
        error = (f"ship mode: shipping from {local} into {self.root} could not start "
                 f"({type(exc).__name__}: {exc})")
        report = FinishReport(status="failed", complete=False, last_error=error)
        self._record.update(status="failed", finished_at=now_iso(), heartbeat_at=now_iso(),
                            write_report=report.__dict__)
        try:
            write_attempt(self._attempt_path, self._record, root=self.root)
        except OSError as write_error:
            print(f"tracklake: {error}; recording attempt {self.attempt} of run {self.id!r} "
                  f"failed did not work either: {write_error}", file=sys.stderr, flush=True)
        return error

    def _refuse(self, what: str) -> None:
        _lifecycle.wait_if_terminating()  # after SIGTERM the process ends; do not raise first
        raise RunStateError(f"run {self.id!r} is finished; {what} after finish() is refused")

    def _refresh_claims(self) -> None:
        """In ship mode, the writer thread's heartbeat: the streams' `.shipping` claims."""
        if self._shipping is not None:
            self._shipping.refresh_claims()

    def _heartbeat(self) -> None:
        self._record["heartbeat_at"] = now_iso()
        write_attempt(self._attempt_path, self._record, root=self.root)

    def flush(self, *, timeout: float = 30.0) -> bool:
        """Write everything logged so far to disk now; True if nothing is left pending.

        Never raises for storage: False while writes are failing (the writer keeps
        retrying) or if they did not complete within `timeout` seconds.
        """
        return self._writer.flush(timeout)

    def finish(self, status: str = "finished", *, timeout: float = 30.0) -> FinishReport:
        """Flush, seal the segments and record the final status, returning by `timeout`.

        Idempotent: a second call (from another thread, or at exit while a SIGTERM is
        being handled) waits for the first, up to its own `timeout`.
        """
        with self._state_lock:
            first = self._state is Lifecycle.RUNNING
            if first:
                if status not in TERMINAL_STATUSES:
                    raise ValueError("status must be finished, failed, killed or crashed, "
                                     f"not {status!r}")
                self._state = Lifecycle.FINISHED
                self._status = status
                self._finishing_thread = threading.current_thread()
        if not first:
            if self._finishing_thread is not threading.current_thread():
                self._finished.wait(timeout)
            return self._report or FinishReport(status="finishing", complete=False)
        self._deadline = time.monotonic() + timeout
        try:
            self._writer.close(timeout, finalize=self._write_final_record)
            report = self._report
            if report is None:  # the writer did not get through by the deadline
                report = self._report = self._build_report(complete=False)
            if not report.complete:
                print(f"tracklake: run {self.id!r} rank {self.rank} finished with unwritten "
                      f"data: {report}", file=sys.stderr, flush=True)
            return report
        finally:
            _lifecycle.forget(self)
            self._finished.set()

    def _build_report(self, complete: bool) -> FinishReport:
        f = self._writer.snapshot()
        last_error = f.last_error
        stuck = self._writer.stuck_for()
        if stuck is not None:
            last_error = (f"a write under {self.root} has not returned for {stuck:.1f} s"
                          + (f"; before that: {last_error}" if last_error else ""))
        return FinishReport(status=self._status, complete=complete and not f.dropped_values
                            and not f.dropped_records and not f.segments_taken,
                            failed_writes=f.count, segments_taken=f.segments_taken,
                            last_error=last_error, dropped_values=f.dropped_values,
                            dropped_records=f.dropped_records,
                            unwritten_records=self._writer.unwritten_records(),
                            errors_by_errno=dict(f.by_errno))

    def _write_final_record(self, complete: bool) -> None:
        """On the writer thread, once the segments are sealed: the attempt's final record
        (in ship mode, once they are shipped, or as far as the root let them be)."""
        if self._shipping is not None and not self._shipping.finish(self._deadline):
            complete = False
            left = (f"records are left to ship in {self._shipping.local}: `tracklake ship "
                    f"--root {self.root} --local {self._shipping.local.parent}` on this "
                    "node moves them")
            self._writer.record_failure(OSError(left), self.root)
            say(f"tracklake: run {self.id!r} rank {self.rank}: {left}")  # always, not once
        report = self._build_report(complete)
        self._record.update(status=self._status, finished_at=now_iso(),
                            heartbeat_at=now_iso(), write_report=report.__dict__)
        try:
            write_attempt(self._attempt_path, self._record, root=self.root)
        except OSError as exc:
            self._writer.record_failure(exc)
            report = self._build_report(complete=False)
        self._report = report
        if self._compactor is not None:
            self._compactor.run_finished()

    @property
    def finished(self) -> bool:
        return self._state is Lifecycle.FINISHED

    def __enter__(self: _Handle) -> _Handle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is KeyboardInterrupt:
            self.finish("killed")
        else:
            self.finish("failed" if exc_type else "finished")

    def __repr__(self) -> str:
        return (f"Run(project={self.project!r}, id={self.id!r}, rank={self.rank}, "
                f"attempt={self.attempt}, state={self._state.value})")
