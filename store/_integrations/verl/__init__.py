"""verl: ``tracklake`` as a backend of verl's own `Tracking` and generation loggers.

`install()` (run by verl's ``verl.plugins`` entry point in every process that imports
verl) puts subclasses of verl's `Tracking`, `ValidationGenerationsLogger` and
`DapoFilteredRewardTableLogger` in `verl.utils.tracking`. They behave exactly as verl's
unless ``"tracklake"`` is in the backends (``trainer.logger``). See docs/verl.md.
"""

from tracklake._integrations.verl.generations import (
    DapoFilteredRewardTableLogger,
    ValidationGenerationsLogger,
)
from tracklake._integrations.verl.install import install, installed
from tracklake._integrations.verl.tracking import BACKEND, Tracking, active_run, run_id_for

__all__ = [
    "BACKEND",
    "DapoFilteredRewardTableLogger",
    "Tracking",
    "ValidationGenerationsLogger",
    "active_run",
    "install",
    "installed",
    "run_id_for",
]
