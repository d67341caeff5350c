"""Shared fixtures: an explicit store root per test and a clean environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_STRIPPED_PREFIXES = ("TRACKLAKE_", "WANDB_", "MLFLOW_", "SWANLAB_")
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID",
                  "LSB_JOBID", "PBS_JOBID", "JOB_ID", "MLP_TASK_ID", "OMPI_COMM_WORLD_RANK",
                  "PMI_RANK")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's TRACKLAKE_/WANDB_/MLFLOW_ settings or launcher ids."""
    for name in list(os.environ):
        if name.startswith(_STRIPPED_PREFIXES) or name in _LAUNCHER_VARS:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty store root, passed explicitly to every call."""
    path = tmp_path / "store"
    path.mkdir()
    return path
