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
from tracklake._format import FORMAT_VERSION, KINDS
from tracklake._run import FinishReport, Run, init
from tracklake._trace import Span

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "CursorError",
    "FinishReport",
    "FormatError",
    "InvalidNameError",
    "NewerFormatError",
    "QueryError",
    "Run",
    "RunNotFoundError",
    "RunStateError",
    "Span",
    "StoreError",
    "TracklakeError",
    "init",
]
