"""tracklake as a backend of verl: ``trainer.logger=['console','tracklake']``.

Installed through verl's ``verl.plugins`` entry point in every process that imports verl;
`install()` does the same by hand (e.g. with ``VERL_USE_EXTERNAL_PLUGINS=none``).
See docs/verl.md.
"""

from tracklake._integrations.verl import (
    BACKEND,
    DapoFilteredRewardTableLogger,
    Tracking,
    ValidationGenerationsLogger,
    active_run,
    install,
    installed,
    run_id_for,
)

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
