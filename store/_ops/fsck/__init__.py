"""`fsck`: find damage in a store, say what it costs, and repair what can be repaired
(see `check`)."""

from tracklake._ops.fsck.check import RepairBusyError, fsck
from tracklake._ops.fsck.report import FsckReport, Problem

__all__ = ["FsckReport", "Problem", "RepairBusyError", "fsck"]
