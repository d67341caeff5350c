"""What `init()` says about the identity it resolved when it may not be what the user
meant: one line each, on stderr, naming the variable and how to change it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from tracklake._format.naming import LAUNCHER_RUN_ID_VARS, world_size


def identity_notes(*, project: str, given_project: str, run: str, run_id: str | None,
                   attempt: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """The lines to say (none when everything was as given)."""
    notes = []
    if given_project != project:
        notes.append(f"tracklake: project {given_project!r} is stored as {project!r} (only "
                     "letters, digits and ._+@- are kept); the CLI finds it by either name")
    if run_id is not None and run_id != run:
        notes.append(f"tracklake: run id {run_id!r} is stored as {run!r} (only letters, "
                     "digits and ._+@- are kept); the CLI finds it by either name")
    from_env = run_id is None and bool(env.get("TRACKLAKE_RUN_ID"))
    if from_env and attempt > 1:
        notes.append(f"tracklake: $TRACKLAKE_RUN_ID={env['TRACKLAKE_RUN_ID']} names an "
                     f"existing run: this is attempt {attempt} of {project}/{run}, and the "
                     "steps it logs again hide the earlier attempts' there; unset "
                     "TRACKLAKE_RUN_ID (or pass run_id=) to start a new run")
    launched = any(env.get(v, "") and env.get(v, "").lower() != "none"
                   for v in LAUNCHER_RUN_ID_VARS)
    try:
        size = world_size(env)
    except ValueError:
        size = 1
    if (run_id is None and not from_env and not launched and size > 1
            and not env.get("MASTER_ADDR")):
        notes.append(f"tracklake: WORLD_SIZE={size} but no MASTER_ADDR, TRACKLAKE_RUN_ID or "
                     f"launcher job id: this rank starts a run of its own ({project}/{run}) "
                     "instead of joining its job's; set TRACKLAKE_RUN_ID to the same value "
                     "on every rank, or pass run_id=")
    return notes
