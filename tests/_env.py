"""Which environment variables tests strip: the user's tracklake/destination settings and
launcher ids, which would otherwise change run ids, ranks and destinations."""

from __future__ import annotations

import os
from collections.abc import Mapping

STRIPPED_PREFIXES = ("TRACKLAKE_", "WANDB_", "MLFLOW_", "SWANLAB_")
LAUNCHER_VARS = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "LSB_JOBID", "PBS_JOBID", "JOB_ID",
    "MLP_TASK_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
})


def stripped(name: str) -> bool:
    return name.startswith(STRIPPED_PREFIXES) or name in LAUNCHER_VARS


def child_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a child process, without the stripped variables (but with
    the tests' choice of automatic compaction and system metrics, TRACKLAKE_COMPACT and
    TRACKLAKE_SYSTEM_METRICS)."""
    return {k: v for k, v in environ.items()
            if not stripped(k) or k in ("TRACKLAKE_COMPACT", "TRACKLAKE_SYSTEM_METRICS")}
