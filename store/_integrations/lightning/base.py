"""Lightning's logger base and rank, from ``lightning`` or else ``pytorch_lightning``.
Lightning duck-types its loggers, so one class serves the Trainers of both packages."""

from __future__ import annotations

import importlib
from typing import Any


def _lightning() -> tuple[Any, Any, Any]:
    for package in ("lightning.pytorch", "pytorch_lightning"):
        try:
            loggers = importlib.import_module(f"{package}.loggers.logger")
            utilities = importlib.import_module(f"{package}.utilities")
        except ImportError:
            continue
        return loggers.Logger, loggers.rank_zero_experiment, utilities.rank_zero_only
    raise ImportError("tracklake's Lightning logger needs lightning or pytorch_lightning "
                      "installed (pip install 'tracklake[lightning]')")


Logger, rank_zero_experiment, rank_zero_only = _lightning()

__all__ = ["Logger", "rank_zero_experiment", "rank_zero_only"]
