"""The wandb destination: see `destination.py` and docs/exporters.md."""

from tracklake.exporters.wandb.destination import WandbDestination

__all__ = ["WandbDestination"]
