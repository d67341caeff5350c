"""``wandb.init(...)``: every argument of W&B's, mapped to `tracklake.init`.

- project: `project`, $WANDB_PROJECT, else ``uncategorized`` (W&B's default);
  name: `name`, $WANDB_NAME; run id: `id`, $WANDB_RUN_ID, else tracklake's rules
  (launcher ids, so that every rank of a job is one run); tags: `tags`, $WANDB_TAGS.
- `mode`/``settings.mode``/$WANDB_MODE: ``disabled`` (or $WANDB_DISABLED) writes nothing;
  ``online``, ``offline`` and ``shared`` all write the store (nothing here is online).
- ranks: a rank variable ($RANK, ...) wins; otherwise, in shared mode or with
  ``settings.x_label``, the primary (``x_primary`` not False) is rank 0 and a secondary
  takes the number of a label like ``rank_3``, else a rank derived from its label (a
  range no trainer reaches, the same in every attempt of a job; `shared_rank`).
- `reinit`: True or ``finish_previous`` finishes the current run first; ``create_new``
  keeps it; anything else returns the current run, as W&B does.
- `config` (with `config_include_keys`/`config_exclude_keys`) is the run's config;
  entity, group, job type, notes, resume, fork/resume-from and dir are recorded in a
  ``wandb.init`` event; any other keyword is ignored with one warning naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracklake._errors import WandbError
from tracklake._format.naming import MAX_RANK, RANK_VARS
from tracklake._integrations.wandb import current
from tracklake._integrations.wandb.run import INIT_EVENT, WandbRun
from tracklake._integrations.wandb.settings import Settings, as_settings
from tracklake._write.coerce import jsonable
from tracklake._write.run import init as tracklake_init

#: First rank of a shared-mode secondary without a rank of its own (as verl's other Ray
#: actors, docs/verl.md): above any trainer's world size.
SECONDARY_RANK_BASE = 1 << 21
DEFAULT_PROJECT = "uncategorized"
_RANK_LABEL = re.compile(r"(?:^|[^A-Za-z])rank[_\-:]?(\d{1,9})$", re.IGNORECASE)
_warned: set[str] = set()


def init(entity: str | None = None, project: str | None = None, dir: Any = None,
         id: str | None = None, name: str | None = None, notes: str | None = None,
         tags: Sequence[str] | None = None, config: Any = None,
         config_exclude_keys: Sequence[str] | None = None,
         config_include_keys: Sequence[str] | None = None,
         allow_val_change: bool | None = None, group: str | None = None,
         job_type: str | None = None, mode: str | None = None, force: bool | None = None,
         reinit: bool | str | None = None, resume: bool | str | None = None,
         resume_from: str | None = None, fork_from: str | None = None,
         save_code: bool | None = None, tensorboard: bool | None = None,
         sync_tensorboard: bool | None = None, monitor_gym: bool | None = None,
         settings: Settings | Mapping[str, Any] | Any = None, anonymous: Any = None,
         *, root: str | os.PathLike[str] | None = None, **kwargs: Any) -> WandbRun:
    """``wandb.init``: start (or, by `reinit`, return) the process's current run, written
    to the store at `root` (default $TRACKLAKE_ROOT, as `tracklake.init`)."""
    for key in kwargs:
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"tracklake.wandb.init(): {key}={kwargs[key]!r} is not an argument "
                          "of wandb.init that tracklake.wandb knows; ignored", stacklevel=2)
    options = as_settings(settings)
    env = os.environ
    chosen_mode = mode or options.mode or env.get("WANDB_MODE") or "offline"
    if env.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
        chosen_mode = "disabled"
    previous = current.run
    if previous is not None:
        choice = reinit if reinit is not None else options.reinit
        if choice in (True, "finish_previous"):
            previous.finish()
        elif choice != "create_new":
            if resume == "must":
                raise WandbError("Cannot resume a run while another run is active. You must "
                                 "either finish it using run.finish(), or use "
                                 "reinit='create_new' when calling wandb.init().")
            return previous
    project = project or options.project or env.get("WANDB_PROJECT") or DEFAULT_PROJECT
    name = name or options.run_name or env.get("WANDB_NAME") or None
    run_id = id or options.run_id or env.get("WANDB_RUN_ID") or None
    if tags is None and env.get("WANDB_TAGS"):
        tags = [t.strip() for t in env["WANDB_TAGS"].split(",") if t.strip()]
    identity = {
        "entity": entity or env.get("WANDB_ENTITY"), "group": group or env.get(
            "WANDB_RUN_GROUP"), "job_type": job_type or env.get("WANDB_JOB_TYPE"),
        "notes": notes or env.get("WANDB_NOTES"), "tags": [str(t) for t in tags or ()],
        "mode": chosen_mode, "resume": resume, "resume_from": resume_from,
        "fork_from": fork_from, "dir": None if dir is None else os.fspath(dir),
        "x_label": options.x_label, "x_primary": options.x_primary}
    values = _config(config, config_include_keys, config_exclude_keys)
    if chosen_mode == "disabled":
        wb = WandbRun(None, project=project, name=name, run_id=run_id or "disabled",
                      settings=options, identity=identity,
                      allow_val_change=bool(allow_val_change))
    else:
        store = tracklake_init(project=project, name=name, run_id=run_id,
                               rank=shared_rank(chosen_mode, options, env), root=root,
                               tags=identity["tags"])
        wb = WandbRun(store, project=project, name=name, run_id=store.id, settings=options,
                      identity=identity, allow_val_change=bool(allow_val_change))
        wb._event(INIT_EVENT, "init", json.dumps(jsonable(identity), sort_keys=True))
    if values:
        wb.config.update(values, allow_val_change=True)
    current.started(wb)
    return wb


def shared_rank(mode: str, settings: Settings, env: Mapping[str, str]) -> int | None:
    """The rank of a process of W&B's shared mode (module docstring); None: tracklake's
    own rule (`resolve_rank`)."""
    if any(env.get(var) for var in RANK_VARS):
        return None
    label = settings.x_label
    if mode != "shared" and label is None:
        return None
    if settings.x_primary is not False:
        return None  # the primary: rank 0 unless torch.distributed says otherwise
    if label is not None:
        match = _RANK_LABEL.search(str(label))
        if match is not None and int(match[1]) < SECONDARY_RANK_BASE:
            return int(match[1])
    seed = str(label) if label is not None else f"{os.uname().nodename}:{os.getpid()}"
    digest = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    return SECONDARY_RANK_BASE + digest % (MAX_RANK - SECONDARY_RANK_BASE + 1)


def _config(config: Any, include: Sequence[str] | None, exclude: Sequence[str] | None
            ) -> dict[str, Any]:
    """`config` as a dict: a mapping, dataclass, Namespace, OmegaConf, or a YAML/JSON file
    path (as W&B reads one); filtered by the include/exclude keys."""
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        config = _read_config_file(Path(config))
    from tracklake._write.coerce import config_to_mapping

    values = dict(config_to_mapping(config))
    if include:
        values = {k: v for k, v in values.items() if k in include}
    if exclude:
        values = {k: v for k, v in values.items() if k not in exclude}
    return values


def _read_config_file(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml  # type: ignore[import-untyped, unused-ignore]  # as W&B reads them

        return yaml.safe_load(text) or {}
    return json.loads(text)
