"""What one rank's writer could not write, and the stderr messages that say so, once each.

Three kinds of trouble, counted apart: a write that failed (`OSError`: disk full,
read-only, I/O error; retried), a call dropped because too much is waiting (the disk
fails or a write hangs), and records that can never be written (a batch that fails to
build or write for another reason; not retried). The writer counts with its buffer lock
held and prints the returned message after releasing it.
"""

from __future__ import annotations

import errno
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tracklake._format import StreamId


@dataclass
class WriteFailures:
    """What could not be written, for the stderr report, the event record and finish()."""

    count: int = 0  # failed writes (OSError)
    last_error: str | None = None
    dropped_values: int = 0
    dropped_records: int = 0
    reported: bool = False
    by_errno: dict[str, int] = field(default_factory=dict)
    drops_reported: bool = False
    errors_reported: bool = False
    segments_taken: int = 0  # open segments removed or replaced by another process

    def copy(self) -> WriteFailures:
        return WriteFailures(**{**self.__dict__, "by_errno": dict(self.by_errno)})

    def write_failed(self, exc: Exception) -> bool:
        """Count a failed write; True the first time (say so)."""
        self.count += 1
        self.last_error = f"{exc.__class__.__name__}: {exc}"
        number = getattr(exc, "errno", None)
        name = (errno.errorcode.get(number, str(number)) if isinstance(number, int)
                else type(exc).__name__)
        self.by_errno[name] = self.by_errno.get(name, 0) + 1
        first, self.reported = not self.reported, True
        return first

    def dropped(self, kind: str, records: int) -> bool:
        """Count a call dropped because too much is waiting; True the first time, unless a
        failed write was already reported (its message says that calls will drop)."""
        if kind == "metrics":
            self.dropped_values += records
        else:
            self.dropped_records += records
        first, self.drops_reported = not self.drops_reported, True
        return first and not self.reported

    def lost(self, kind: str, records: int, error: str) -> bool:
        """Count records that can never be written; True the first time."""
        if kind == "metrics":
            self.dropped_values += records
        else:
            self.dropped_records += records
        self.last_error = error
        first, self.errors_reported = not self.errors_reported, True
        return first

    def taken(self, path: Path) -> bool:
        """Count an open segment that another process removed; True the first time."""
        self.segments_taken += 1
        self.last_error = f"segment {path} was removed while this writer appended to it"
        return self.segments_taken == 1

    def recovery_text(self) -> str:
        """The text of the event recorded when writes work again."""
        errors = ", ".join(f"{k}: {v}" for k, v in self.by_errno.items())
        return (f"{self.count} failed writes ({errors}); last: {self.last_error}; dropped "
                f"{self.dropped_values} metric values and {self.dropped_records} records "
                "while the buffer was full")


def cannot_write(ident: StreamId, root: Path, budget: int, error: str | None) -> str:
    return (f"tracklake: cannot write run {ident.run!r} rank {ident.rank} under {root}: "
            f"{error}. Training continues; tracklake keeps up to {size(budget)} buffered, "
            "retries with backoff, and reports the total at finish(). (Reported once.)")


def cannot_ship(ident: StreamId, root: Path, error: str | None) -> str:
    return (f"tracklake: cannot ship run {ident.run!r} rank {ident.rank} into {root}: "
            f"{error}. Training continues; its records stay on this node's disk and are "
            "shipped once the root answers (retried every round); finish() reports what is "
            "left and the command that ships it. (Reported once.)")


def dropping(ident: StreamId, root: Path, budget: int, stuck_for: float | None) -> str:
    why = (f"a write under {root} has not returned for {stuck_for:.1f} s (is the file "
           "system hung?)" if stuck_for is not None else "the writer cannot keep up")
    return (f"tracklake: run {ident.run!r} rank {ident.rank}: {why}; more than "
            f"{size(budget)} is waiting, so new values are dropped and counted until writes "
            "catch up; finish() reports the total. (Reported once.)")


def lost(ident: StreamId, error: str) -> str:
    return (f"tracklake: run {ident.run!r} rank {ident.rank}: {error}. Training continues; "
            "finish() reports every record dropped this way. (Reported once.)")


def taken(ident: StreamId, path: Path) -> str:
    return (f"tracklake: run {ident.run!r} rank {ident.rank}: the segment {path} was removed "
            "or replaced by another process while this writer still appended to it (a "
            "compaction or retention that judged this writer gone?); what it held may be lost. "
            "Writing continues in a new segment; finish() reports it incomplete. (Reported "
            "once.)")


def say(message: str | None) -> None:
    if message is not None:
        print(message, file=sys.stderr, flush=True)


def size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.0f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.0f} KiB"
