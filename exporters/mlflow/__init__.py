"""The mlflow destination: see `destination.py` and docs/exporters.md."""

from tracklake.exporters.mlflow.destination import MlflowDestination

__all__ = ["MlflowDestination"]
