"""The interface a destination implements; the shared loop (`_loop/`) does the rest.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import pyarrow as pa

if TYPE_CHECKING:
    import click


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


@dataclass(frozen=True)
class ExportContext:
    """What the loop tells a destination once, in `Destination.start()`, before any run."""

    #: the store being exported; read it (artifacts' blobs, say) through `tracklake.read`
    root: Path
    #: the rank mode: a rank number ("0"), "all" (metric keys under ``rank{r}/``), or
    #: "mean" | "min" | "max" (one aggregate per step across ranks)
    ranks: str


@runtime_checkable
class Destination(Protocol):
    """A place runs are exported to: one instance per `tracklake export` process.

    This docstring and the methods' are the whole contract. The loop calls, in order:
    `start()` once; then per run `open_run()`, any number of `write()` + `commit()`
    pairs, `finish_run()` once the run has ended and everything is delivered; and
    `close()` at the end. The command line builds the instance with `from_cli()` from the
    options `cli_options()` declares, and names it with `describe()`.

    A class that subclasses `Destination` inherits the defaults of `commit_interval`,
    `cli_options()`, `from_cli()`, `describe()` and `start()`; one that does not must
    define them all (`tracklake.exporters.load` checks). Nothing is ever set on a
    destination from outside.

    Optional: ``missing(run, state) -> str | None``, where `state` is what `commit()`
    returned last. For a run with nothing new whose records were delivered, the loop
    asks (once per run and process) why the destination no longer holds them (its
    files deleted, say), and a reason stops the run with it and the ``--from-start``
    hint. ``ending(run) -> None``: for a run that has ended, called once everything of
    it was written, before the last `commit()` of that delivery (a destination that
    holds records back until the other ranks pass them lets them go then).

    Records come per run after their stream's cursor, leaving out what a later attempt of
    the rank logged again (the default views' rule); with ``--ranks all`` the ranks are
    read side by side, the one whose metrics reached the lowest step first.

    Errors: raise `tracklake.ExportError(retryable=True)` for what waiting can fix (the
    service is down, a time-out, a full disk on the destination's side) and
    ``retryable=False`` for what it cannot (a refused credential, a deleted project).
    Anything else is a bug: the loop lets it through, and the export stops with its
    traceback.
    """

    #: The name used on the command line and in the ``tracklake.exporters`` entry points.
    name: ClassVar[str]
    #: While following a live run, seconds at least between two deliveries to it (each
    #: ends in `commit()`); 0 delivers as soon as records arrive. A finished run is
    #: delivered at once. ``--commit-interval`` overrides it.
    commit_interval: ClassVar[float] = 0.0
    #: False for a destination that is only looked at (the console): each export shows
    #: the runs from their start, and nothing of where it stands is kept in the store.
    keeps_state: ClassVar[bool] = True

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
        """The destination's own options on ``tracklake export NAME`` (none by default);
        their values reach `from_cli()` as keyword arguments."""
        return []

    @classmethod
    def from_cli(cls, **options: Any) -> Destination:
        """An instance from the values of `cli_options()` (by default ``cls(**options)``)."""
        return cls(**options)

    def describe(self) -> str:
        """Which destination this instance writes to, e.g. ``mlflow:http://host:5000``:
        shown to users, and (hashed) the name of the directory keeping its cursors, so two
        instances writing to different places keep separate cursors. Default: `name`."""
        return self.name

    def start(self, context: ExportContext) -> None:
        """Called once before the first run with what the export is about (the store
        root, the rank mode). Default: nothing to do."""

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        """Find or create the destination run deterministically (never by name alone).

        `state` is what `commit()` last returned for this run ({} the first time). What
        was written after that commit must be forgotten (truncated, set aside or
        overwritten idempotently): the loop sends it again.
        """

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        """Send records of one kind (columns as in docs/format.md, plus ``rank``,
        ``attempt``; metric keys already carry the rank prefix the rank mode asks for).
        Records of one run arrive in cursor order; they may be buffered until `commit()`.
        """

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        """Make everything written so far durable; return the state to keep beside the
        cursor (JSON-serialisable, no credentials)."""
        ...

    def finish_run(self, run: RunInfo) -> None:
        """The run has ended (`run.status`) and is fully exported: record its status.
        May be called again after a restart: it must be idempotent."""

    def close(self) -> None:
        """Release connections and files."""


#: Every member a destination class must have, for `missing_hooks()`.
HOOKS: tuple[str, ...] = ("name", "commit_interval", "cli_options", "from_cli", "describe",
                          "start", "open_run", "write", "commit", "finish_run", "close")


def missing_hooks(cls: type) -> list[str]:
    """The members of the `Destination` contract that `cls` lacks."""
    return [hook for hook in HOOKS if not hasattr(cls, hook)]
