"""tracklake: a local-first event store for ML training runs.

Training ranks write with `init()` and `Run`; `query()` runs SQL over the store; the
`tracklake.exporters` package replays it into WandB, MLflow, SwanLab or TensorBoard.
"""

from tracklake._errors import (
    CursorError,
    FormatError,
    InvalidNameError,
    NewerFormatError,
    QueryError,
    RunNotFoundError,
    RunStateError,
    StoreError,
    TracklakeError,
)
from tracklake._compact import CompactionReport, compact
from tracklake._cursor import Cursor
from tracklake._format import FORMAT_VERSION, KINDS, StreamId
from tracklake._query import connect, query
from tracklake._reader import ReadProblems, RunRecord, find_run, list_runs, read_run
from tracklake._run import FinishReport, Run, init
from tracklake._trace import Span

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "CompactionReport",
    "Cursor",
    "CursorError",
    "FinishReport",
    "FormatError",
    "InvalidNameError",
    "NewerFormatError",
    "QueryError",
    "ReadProblems",
    "Run",
    "RunNotFoundError",
    "RunRecord",
    "RunStateError",
    "Span",
    "StoreError",
    "StreamId",
    "TracklakeError",
    "compact",
    "connect",
    "find_run",
    "init",
    "list_runs",
    "query",
    "read_run",
]
