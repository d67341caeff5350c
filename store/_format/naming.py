"""Names that become path components, and how ranks agree on a run id without talking."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from tracklake._errors import InvalidNameError, StoreError

MAX_NAME_LENGTH = 128
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@-]+")

#: The store root when neither `root=` nor $TRACKLAKE_ROOT is given, relative to the working
#: directory. The "-" keeps it from ever being importable: a directory named like the
#: package would shadow `import tracklake` for scripts run from there (W&B's ./wandb trap).
DEFAULT_ROOT = "tracklake-store"
#: The largest rank the int32 `rank` partition column holds.
MAX_RANK = (1 << 31) - 1

#: Launcher variables that identify one job for all of its ranks, in order of preference.
LAUNCHER_RUN_ID_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID",
                        "JOB_ID", "MLP_TASK_ID")


def safe_name(name: object, what: str) -> str:
    """`name` made safe as one path component, or InvalidNameError naming it.

    Characters outside ``[A-Za-z0-9._+@-]`` become ``_``; names that would be empty, ``.``
    or ``..``, contain NUL, or exceed 128 characters after that are refused.
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be str, not {type(name).__name__}")
    if "\x00" in name:
        raise InvalidNameError(f"{what} name {name!r} contains NUL")
    cleaned = _UNSAFE.sub("_", name).strip("_")
    if cleaned in ("", ".", "..") or set(cleaned) == {"."}:
        raise InvalidNameError(f"{what} name {name!r} has no usable characters")
    if len(cleaned) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{what} name {name[:40]!r}... is {len(cleaned)} characters; the limit is "
            f"{MAX_NAME_LENGTH}"
        )
    return cleaned


def resolve_root(root: str | os.PathLike[str] | None) -> Path:
    """The store root: `root`, else $TRACKLAKE_ROOT, else ./tracklake-store (made absolute).

    A URL (``s3://…``) is refused: a store is written only in a directory; readers take
    URLs through `tracklake.read.resolve_root`."""
    chosen = root if root is not None else os.environ.get("TRACKLAKE_ROOT") or DEFAULT_ROOT
    if "://" in os.fspath(chosen):
        raise StoreError(f"{os.fspath(chosen)}: a store in an object store is read-only "
                         "(runs, show, sql, query, export read it); write to a directory")
    return Path(chosen).expanduser().absolute()


def resolve_rank(rank: int | None, env: Mapping[str, str] = os.environ) -> int:
    """This process's rank: `rank`, else $RANK, else torch.distributed's, else 0.

    A rank must fit the int32 `rank` column: ValueError (naming where it came from) if not.
    """
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
            raise ValueError(f"rank must be a non-negative int up to {MAX_RANK}, not {rank!r}")
        return rank
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if env.get(var, "").isdigit():
            if int(env[var]) > MAX_RANK:
                raise ValueError(f"${var}={env[var]} is not a rank from 0 to {MAX_RANK}")
            return int(env[var])
    dist = sys.modules.get("torch.distributed")  # only if the caller already imported it
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def world_size(env: Mapping[str, str] = os.environ) -> int:
    """$WORLD_SIZE as an int (1 when unset or not a number)."""
    value = env.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def resolve_run_id(run_id: str | None, project: str, name: str | None,
                   env: Mapping[str, str] = os.environ) -> str:
    """The run id that every rank of one job computes the same way (docs/concepts.md).

    1. `run_id` as given; 2. $TRACKLAKE_RUN_ID; 3. a launcher's job id
    (TORCHELASTIC_RUN_ID unless it is torchrun's default "none", SLURM_JOB_ID with
    SLURM_ARRAY_TASK_ID, LSF, PBS, SGE); 4. for a multi-process job
    (WORLD_SIZE > 1) with MASTER_ADDR/MASTER_PORT, a hash of those with project and
    name; 5. otherwise a new id from the name, the time and 4 random bytes.
    """
    if run_id is not None:
        return safe_name(run_id, "run")
    if env.get("TRACKLAKE_RUN_ID"):
        return safe_name(env["TRACKLAKE_RUN_ID"], "run")
    for var in LAUNCHER_RUN_ID_VARS:
        value = env.get(var, "")
        if value and value.lower() != "none":
            if var == "SLURM_JOB_ID" and env.get("SLURM_ARRAY_TASK_ID"):
                value = f"{value}_{env['SLURM_ARRAY_TASK_ID']}"
            return safe_name(f"{var.split('_')[0].lower()}-{value}", "run")
    if world_size(env) > 1 and env.get("MASTER_ADDR"):
        seed = "\x1f".join([project, name or "", env["MASTER_ADDR"], env.get("MASTER_PORT", "")])
        return "job-" + hashlib.sha256(seed.encode()).hexdigest()[:16]
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    prefix = safe_name(name, "run")[:60] + "-" if name else ""
    return f"{prefix}{stamp}-{secrets.token_hex(4)}"
