"""tracklake in Ray: ``TracklakeLoggerCallback`` for Tune (a run per trial) and
``TracklakeTrainCallback`` for Train (a rank per worker). See docs/integrations.md."""

from tracklake._integrations.ray import TracklakeLoggerCallback, TracklakeTrainCallback

__all__ = ["TracklakeLoggerCallback", "TracklakeTrainCallback"]
