"""The interface a destination implements; the shared loop (`_loop.py`) does the rest.

A destination only turns tables of records into the destination's calls. Selecting runs,
reading after the cursor, choosing ranks, batching, retrying, committing cursors and
following live runs belong to the loop, so every destination gets them the same way.

Exactly-once: the loop persists the cursor together with the state `commit()` returns,
and hands that state back to `open_run()` after a restart. A destination whose writes
are idempotent (MLflow with deterministic timestamps) can return ``{}``; an append-only
file destination (TensorBoard) returns its file offsets and truncates back to them on
`open_run()`, dropping what was written after the last commit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import pyarrow as pa


@dataclass(frozen=True)
class RunInfo:
    """What a destination knows about the run it exports."""

    project: str
    run: str
    name: str | None
    status: str  # running, finished, failed, killed, crashed
    attempts: int
    ranks: tuple[int, ...]
    tags: tuple[str, ...]
    started_at: str | None
    config: Mapping[str, Any] = field(default_factory=dict)  # flattened, secrets redacted
    identity: Mapping[str, Any] = field(default_factory=dict)  # of rank 0's latest attempt

    @property
    def key(self) -> str:
        """Stable identity of the run across exports: ``project/run``."""
        return f"{self.project}/{self.run}"

    @property
    def export_id(self) -> str:
        """A deterministic id for the destination's run, valid where ids are restricted
        (W&B, SwanLab): ``tl`` + the first 16 hex digits of SHA-256(`key`)."""
        return "tl" + hashlib.sha256(self.key.encode()).hexdigest()[:16]


@runtime_checkable
class Destination(Protocol):
    """A place runs are exported to (one instance per `tracklake export` process)."""

    #: The name used on the command line and in the entry point group.
    name: ClassVar[str]

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        """Find or create the destination run deterministically (never by name alone).

        `state` is what `commit()` last returned for this run ({} the first time).
        """

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        """Send records of one kind (columns as in docs/format.md, plus ``rank``,
        ``attempt``; metric keys already carry the rank prefix the rank mode asks for).

        Raise `ExportError(retryable=...)` for failures; anything else is a bug.
        """

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        """Make everything written so far durable; return the state to keep beside the
        cursor (JSON-serialisable, no credentials)."""
        ...

    def finish_run(self, run: RunInfo) -> None:
        """The run is finished and fully exported: record its final status."""

    def close(self) -> None:
        """Release connections and files."""
