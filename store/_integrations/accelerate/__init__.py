"""tracklake as an accelerate tracker (docs/integrations.md)."""

from tracklake._integrations.accelerate.tracker import TracklakeTracker, register

__all__ = ["TracklakeTracker", "register"]
