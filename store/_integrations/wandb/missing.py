"""W&B names that `tracklake.wandb` does not provide, and what to use instead: an
`AttributeError` that says so, rather than a silent stand-in."""

from __future__ import annotations

_DOCS = "docs/integrations.md, W&B-compatible module"
_READ = ("read runs from the store with tracklake.query(sql) or tracklake.read_run(); "
         "upload them with `tracklake export wandb`")
_ONE_RUN = ("call tracklake.wandb.init(id=...) in each process: processes with one id are "
            "ranks of one run")

ALTERNATIVES = {
    "Api": _READ, "api": _READ, "apis": _READ,
    "use_artifact": "artifacts stay in the store: find them with "
                    "tracklake.query('SELECT * FROM artifacts') and tracklake.files",
    "restore": "find stored files with tracklake.query('SELECT * FROM artifacts')",
    "log_model": "log_artifact(path, type='model')",
    "use_model": "tracklake.query('SELECT * FROM artifacts')",
    "link_model": "log_artifact(path, type='model'); registries are W&B's",
    "link_artifact": "log_artifact(); registries are W&B's",
    "sweep": "no sweeps: run the search yourself and log each trial as its own run",
    "agent": "no sweeps: run the search yourself and log each trial as its own run",
    "controller": "no sweeps: run the search yourself and log each trial as its own run",
    "plot": "log a tracklake.wandb.Table; charts are made where the run is exported",
    "plot_table": "log a tracklake.wandb.Table; charts are made where the run is exported",
    "Object3D": "log the file with log_artifact()",
    "Molecule": "log the file with log_artifact()",
    "Plotly": "log the figure's HTML as tracklake.wandb.Html",
    "Graph": "log the model summary as text",
    "Classes": "log the class names in the config",
    "JoinedTable": "log the joined rows as one tracklake.wandb.Table",
    "EvalTable": "log the rows as a tracklake.wandb.Table",
    "attach": _ONE_RUN, "_attach": _ONE_RUN,
    "tensorboard": "export the run to TensorBoard with `tracklake export tensorboard`",
    "setup": "nothing to set up: no service process runs",
    "teardown": "nothing to tear down: finish() the run",
    "require": "nothing to require",
    "sync": "upload with `tracklake export wandb` (docs/exporters.md)",
    "upsert_run_queue": _READ,
    "get_project_url": "nothing is online: runs are in the store",
    "get_url": "nothing is online: runs are in the store",
    "get_sweep_url": "nothing is online: runs are in the store",
    "use_api_key": "no key is needed: nothing is online",
}


def missing_attribute(name: str, where: str = "tracklake.wandb") -> AttributeError:
    """The error for W&B's `name`, naming what to use instead."""
    short = name.rsplit(".", 1)[-1]
    instead = ALTERNATIVES.get(short)
    hint = f"use instead: {instead}" if instead else f"see {_DOCS} for what is supported"
    return AttributeError(f"{where} has no attribute {short!r} (W&B's {name}); {hint}")
