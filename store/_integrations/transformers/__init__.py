"""tracklake as a transformers `TrainerCallback` (docs/integrations.md)."""

from tracklake._integrations.transformers.callback import TracklakeCallback, register

__all__ = ["TracklakeCallback", "register"]
