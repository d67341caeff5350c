"""An in-memory destination: a test double for code that exports, and the reference
implementation of the `Destination` protocol."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from tracklake import ExportError
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo


@dataclass
class MemoryRun:
    """What the destination holds for one run."""

    info: RunInfo
    committed: dict[str, list[pa.Table]] = field(default_factory=dict)
    uncommitted: dict[str, list[pa.Table]] = field(default_factory=dict)
    commits: int = 0
    finished_status: str | None = None

    def table(self, kind: str) -> pa.Table | None:
        """Everything committed of one kind (None if nothing)."""
        tables = self.committed.get(kind)
        return pa.concat_tables(tables) if tables else None


class MemoryDestination(Destination):
    """Keeps exported records in memory. Uncommitted records are dropped when a run is
    opened again, as an append-only destination would truncate them; `fail_next` makes
    the next write raise, to test retries."""

    name: ClassVar[str] = "memory"

    def __init__(self) -> None:
        self.runs: dict[str, MemoryRun] = {}
        self.fail_next: ExportError | None = None
        self.closed = False
        self.context: ExportContext | None = None  # what `start()` was told
        self._id = uuid.uuid4().hex[:12]  # each instance is its own destination

    def describe(self) -> str:
        return f"memory:{self._id}"

    def start(self, context: ExportContext) -> None:
        self.context = context

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        held = self.runs.setdefault(run.key, MemoryRun(run))
        held.info = run
        held.uncommitted.clear()

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        self.runs[run.key].uncommitted.setdefault(kind, []).append(records)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        held = self.runs[run.key]
        for kind, tables in held.uncommitted.items():
            held.committed.setdefault(kind, []).extend(tables)
        held.uncommitted.clear()
        held.commits += 1
        return {"commits": held.commits}

    def finish_run(self, run: RunInfo) -> None:
        self.runs[run.key].finished_status = run.status

    def close(self) -> None:
        self.closed = True
