"""The swanlab destination: see `destination.py` and docs/exporters.md."""

from tracklake.exporters.swanlab.destination import SwanlabDestination

__all__ = ["SwanlabDestination"]
