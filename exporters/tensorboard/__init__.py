"""The tensorboard destination: see `destination.py` and docs/exporters.md."""

from tracklake.exporters.tensorboard.destination import TensorBoardDestination

__all__ = ["TensorBoardDestination"]
