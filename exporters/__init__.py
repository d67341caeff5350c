"""tracklake.exporters: processes that tail the store and replay it into other tools.

`export(destination, root=..., selection=Selection(...))` runs the shared loop; a
destination implements the small `Destination` protocol and registers itself in the
``tracklake.exporters`` entry point group. `MemoryDestination` is a test double.
"""

from tracklake.exporters._loop.loop import Exporter, export
from tracklake.exporters._loop.options import (
    ExportOptions,
    ExportProgress,
    ExportSummary,
    RunOutcome,
)
from tracklake.exporters._loop.select import Selection
from tracklake.exporters._loop.status import export_status
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo
from tracklake.exporters._registry import available, load
from tracklake.exporters.memory import MemoryDestination

__all__ = [
    "Destination",
    "ExportContext",
    "ExportOptions",
    "ExportProgress",
    "ExportSummary",
    "Exporter",
    "MemoryDestination",
    "RunInfo",
    "RunOutcome",
    "Selection",
    "available",
    "export",
    "export_status",
    "load",
]
