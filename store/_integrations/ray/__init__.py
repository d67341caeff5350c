"""tracklake as a Ray Tune logger callback and a Ray Train callback (docs/integrations.md)."""

from tracklake._integrations.ray.train import TracklakeTrainCallback
from tracklake._integrations.ray.tune import TracklakeLoggerCallback

__all__ = ["TracklakeLoggerCallback", "TracklakeTrainCallback"]
