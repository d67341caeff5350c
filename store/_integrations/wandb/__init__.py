"""`tracklake.wandb`: W&B's module API over the store (docs/integrations.md).

init.py maps ``wandb.init``; run.py is the run object; history.py W&B's steps, rows and
``define_metric`` axes; values.py what each logged value becomes; data_types.py,
artifacts.py, config.py and settings.py W&B's classes; current.py the process's current
run; missing.py the names not provided; alias.py the opt-in that serves ``import wandb``.
"""

from tracklake._integrations.wandb.artifacts import Artifact
from tracklake._integrations.wandb.config import Config, PreInit, Summary
from tracklake._integrations.wandb.data_types import Audio, Histogram, Html, Image, Table, Video
from tracklake._integrations.wandb.history import MetricRule
from tracklake._integrations.wandb.init import init
from tracklake._integrations.wandb.missing import missing_attribute
from tracklake._integrations.wandb.run import WandbRun
from tracklake._integrations.wandb.settings import Settings

__all__ = [
    "Artifact",
    "Audio",
    "Config",
    "Histogram",
    "Html",
    "Image",
    "MetricRule",
    "PreInit",
    "Settings",
    "Summary",
    "Table",
    "Video",
    "WandbRun",
    "init",
    "missing_attribute",
]
