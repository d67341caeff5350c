"""tracklake: a local-first event store for ML training runs.

Training ranks write with `init()` and `Run`; `query()` runs SQL over the store; the
`tracklake.exporters` package replays it into WandB, MLflow, SwanLab or TensorBoard.

The read side (query, compaction, reader) is imported on first use, so that a training
process importing tracklake pays for little beyond pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tracklake._errors import (
    CursorError,
    ExportError,
    FormatError,
    InvalidNameError,
    NewerFormatError,
    NoAnswerError,
    QueryError,
    RunNotFoundError,
    RunStateError,
    StoreError,
    TracklakeError,
)
from tracklake._format import FORMAT_VERSION, KINDS, StreamId
from tracklake._write.finish import FinishReport
from tracklake._write.run import Run, init
from tracklake._write.trace import Span
from tracklake._write.traced import trace
from tracklake._write.tracking import Tracking

if TYPE_CHECKING:
    from tracklake._format.cursor import Cursor
    from tracklake._ops.compact import CompactionReport, compact
    from tracklake._read.query import connect, query
    from tracklake._read.reader import ReadProblems, RunRecord, find_run, list_runs, read_run

__version__ = "0.1.0"

_LAZY = {
    "CompactionReport": "tracklake._ops.compact",
    "compact": "tracklake._ops.compact",
    "Cursor": "tracklake._format.cursor",
    "connect": "tracklake._read.query",
    "query": "tracklake._read.query",
    "ReadProblems": "tracklake._read.reader",
    "RunRecord": "tracklake._read.reader",
    "find_run": "tracklake._read.reader",
    "list_runs": "tracklake._read.reader",
    "read_run": "tracklake._read.reader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracklake' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "CompactionReport",
    "Cursor",
    "CursorError",
    "ExportError",
    "FinishReport",
    "FormatError",
    "InvalidNameError",
    "NewerFormatError",
    "NoAnswerError",
    "QueryError",
    "ReadProblems",
    "Run",
    "RunNotFoundError",
    "RunRecord",
    "RunStateError",
    "Span",
    "StoreError",
    "StreamId",
    "Tracking",
    "TracklakeError",
    "compact",
    "connect",
    "find_run",
    "init",
    "list_runs",
    "query",
    "read_run",
    "trace",
]
