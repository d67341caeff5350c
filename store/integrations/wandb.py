"""The opt-in that serves frameworks' own ``import wandb`` from `tracklake.wandb`.

``TRACKLAKE_WANDB=1`` in the environment (read at interpreter start-up, so it reaches
subprocesses, torchrun workers and Ray workers that inherit it), or `install()` in the
process before the framework imports wandb. Without either, nothing of the real wandb
changes. See docs/integrations.md.
"""

from tracklake._integrations.wandb.alias import ENV, install, installed, uninstall

__all__ = ["ENV", "install", "installed", "uninstall"]
