"""Names that become path components, and how ranks agree on a run id without talking."""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import os
import re
import secrets
import stat
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


def env_root(env: Mapping[str, str] = os.environ) -> str | None:
    """$TRACKLAKE_ROOT, or None when it is unset or empty (one rule for readers and writers)."""
    return env.get("TRACKLAKE_ROOT") or None


def resolve_root(root: str | os.PathLike[str] | None) -> Path:
    """The store root: `root`, else $TRACKLAKE_ROOT, else ./tracklake-store (made absolute).

    An empty $TRACKLAKE_ROOT counts as unset; an empty `root` is refused. A URL
    (``s3://…``) is refused: a store is written only in a directory; readers take
    URLs through `tracklake.read.resolve_root`."""
    if root is not None and not os.fspath(root):
        raise StoreError("root='' names no directory: pass the store's directory, or "
                         "leave root unset for $TRACKLAKE_ROOT, else ./" + DEFAULT_ROOT)
    chosen = root if root is not None else env_root() or DEFAULT_ROOT
    if "://" in os.fspath(chosen):
        raise StoreError(f"{os.fspath(chosen)}: a store in an object store is read-only "
                         "(runs, show, sql, query, export read it); write to a directory")
    return Path(chosen).expanduser().absolute()


#: Launcher variables that hold this process's global rank, in order of preference.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_WHOLE_NUMBER = re.compile(r"[0-9]+")


def _env_number(env: Mapping[str, str], var: str, low: int) -> int | None:
    """$`var` as a whole number from `low` to 2^31-1, None if unset or empty, else
    ValueError naming the variable (``RANK='abc'``, ``-1`` and `` 3 `` are refused)."""
    value = env.get(var, "")
    if value == "":
        return None
    if _WHOLE_NUMBER.fullmatch(value) is None or not low <= int(value) <= MAX_RANK:
        what = "a rank" if low == 0 else "a world size"
        raise ValueError(f"{var}={value!r} is not {what}: a whole number {low}…2^31−1")
    return int(value)


def resolve_rank(rank: int | None, env: Mapping[str, str] = os.environ) -> int:
    """This process's rank: `rank`, else the first set of `RANK_VARS`, else
    torch.distributed's, else 0.

    A rank must fit the int32 `rank` column: ValueError (naming where it came from) if not,
    and for a variable that is set but is not a whole number.
    """
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
            raise ValueError(f"rank must be a non-negative int up to {MAX_RANK}, not {rank!r}")
        return rank
    for var in RANK_VARS:
        found = _env_number(env, var, 0)
        if found is not None:
            return found
    dist = sys.modules.get("torch.distributed")  # only if the caller already imported it
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def world_size(env: Mapping[str, str] = os.environ) -> int:
    """$WORLD_SIZE as an int (1 when unset or empty; ValueError naming it if it is not a
    whole number from 1 to 2^31-1)."""
    return _env_number(env, "WORLD_SIZE", 1) or 1


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


def check_writable_root(root: Path) -> Path:
    """`root` if it is a directory or does not exist yet (init creates it); an OSError
    naming it and what it is otherwise (a file, a FIFO, a device)."""
    try:
        mode = os.stat(root).st_mode
    except FileNotFoundError:
        return root
    except OSError as exc:  # a parent that is a file, a link into a closed directory
        raise StoreError(f"cannot use {root} as the store root: {exc.strerror}") from exc
    if not stat.S_ISDIR(mode):
        what = ("a regular file" if stat.S_ISREG(mode) else "a FIFO"
                if stat.S_ISFIFO(mode) else "a device or socket")
        raise NotADirectoryError(errno.ENOTDIR, f"the store root {root} is {what}, not a "
                                 "directory: pass a directory (it is created if missing)",
                                 str(root))
    return root
