"""Putting tracklake's subclasses where verl's trainers look up their loggers."""

from __future__ import annotations

from verl.utils import tracking as _verl

from tracklake._integrations.verl import rollout_trace
from tracklake._integrations.verl.generations import (
    DapoFilteredRewardTableLogger,
    ValidationGenerationsLogger,
)
from tracklake._integrations.verl.tracking import Tracking

_REPLACEMENTS = {
    "Tracking": Tracking,
    "ValidationGenerationsLogger": ValidationGenerationsLogger,
    "DapoFilteredRewardTableLogger": DapoFilteredRewardTableLogger,
}


def install() -> None:
    """Make ``tracklake`` a backend of verl's loggers in this process. Idempotent.

    verl has no registry of backends, so the names in `verl.utils.tracking` are replaced
    by subclasses; this reaches every module that looks them up after the call, which is
    all of verl's trainers when it runs from the ``verl.plugins`` entry point (verl loads
    that group while ``import verl`` runs, before any trainer module is imported).
    """
    for name, cls in _REPLACEMENTS.items():
        setattr(_verl, name, cls)
    rollout_trace.install()


def installed() -> bool:
    """True if verl's loggers in this process are tracklake's subclasses."""
    return rollout_trace.installed() and all(
        getattr(_verl, name) is cls for name, cls in _REPLACEMENTS.items())
