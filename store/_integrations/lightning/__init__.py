"""tracklake as a Lightning logger (docs/integrations.md)."""

from tracklake._integrations.lightning.logger import TracklakeLogger

__all__ = ["TracklakeLogger"]
