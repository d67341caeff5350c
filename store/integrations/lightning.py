"""tracklake as a Lightning logger: ``Trainer(logger=TracklakeLogger(project="p"))``,
for ``lightning`` and ``pytorch_lightning`` alike. See docs/integrations.md."""

from tracklake._integrations.lightning import TracklakeLogger

__all__ = ["TracklakeLogger"]
