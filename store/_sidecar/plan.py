"""From ``export=`` to exporter command lines: which destinations, with which options.

``export`` is a sequence of destination names (``["wandb", "mlflow"]``) or a mapping of
names to options (``{"tensorboard": {"logdir": "/data/tb"}}``): each option becomes the
destination's command-line option (``tracking_uri`` → ``--tracking-uri``). What is not
given comes from the environment, as `tracklake export` reads it (``MLFLOW_TRACKING_URI``,
``WANDB_MODE``, ``SWANLAB_LOG_DIR``, ...) and ``TENSORBOARD_DIR`` (verl's variable) for
TensorBoard's log directory, which the exporter requires.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

#: The entry point group of installed destinations (as `tracklake export` lists them).
GROUP = "tracklake.exporters"
#: Options the sidecar sets itself: the run it follows and how.
RESERVED = frozenset({"root", "project", "run", "runs", "tag", "tags", "all", "all_runs",
                      "since", "follow", "while_pid"})
#: TensorBoard's log directory when neither the options nor $TENSORBOARD_DIR give one
#: (verl's default root; the exporter adds PROJECT/RUN below it).
TENSORBOARD_DEFAULT = "tensorboard_log"

#: How much lower than the trainer's a sidecar's CPU priority is (os.nice): where they
#: compete for cores, training comes first and the exporters catch up afterwards.
NICENESS = 10
#: SwanLab modes the exporter knows, as $SWANLAB_MODE may give them.
SWANLAB_MODES = ("offline", "local", "cloud")

ExportOption = Sequence[str] | Mapping[str, Mapping[str, Any] | None]


@dataclass(frozen=True)
class SidecarSpec:
    """One exporter process to run: `tracklake export <destination> <options>`."""

    destination: str
    options: tuple[str, ...]
    where: str  # the destination's address in words, for the console
    log: Path

    def argv(self, python: str) -> list[str]:
        """The command that runs it with interpreter `python` (no console script needed)."""
        return [python, "-m", "tracklake._sidecar", "export", self.destination, *self.options]

    def command_line(self) -> str:
        """The same command as a user types it."""
        return shlex.join(["tracklake", "export", self.destination, *self.options])


def installed_destinations() -> list[str]:
    """Names of the installed destinations (read from package metadata, nothing imported)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def normalize(export: Any) -> dict[str, dict[str, Any]]:
    """``export=`` as {destination: options}; TypeError/ValueError naming what is wrong."""
    if isinstance(export, (str, bytes)):
        raise TypeError(f"export= takes a list of destination names, e.g. [{export!r}], "
                        f"not the string {export!r}")
    if isinstance(export, Mapping):
        items = list(export.items())
    elif isinstance(export, Sequence):
        items = [(name, None) for name in export]
    else:
        raise TypeError("export= takes a list of destination names or a mapping of names to "
                        f"options, not {type(export).__name__}")
    chosen: dict[str, dict[str, Any]] = {}
    for name, options in items:
        if not isinstance(name, str) or not name:
            raise TypeError(f"export=: a destination name must be a non-empty str, not {name!r}")
        if name in chosen:
            raise ValueError(f"export=: destination {name!r} is listed twice")
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"export=: the options of {name!r} must be a mapping, not "
                            f"{type(options).__name__}")
        chosen[name] = dict(options or {})
    known = installed_destinations()
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ValueError(f"export=: no installed exporter for {unknown}; installed: {known} "
                         "(e.g. pip install 'tracklake[wandb]')")
    for name, options in chosen.items():
        reserved = sorted(RESERVED.intersection(options))
        if reserved:
            raise ValueError(f"export=: option(s) {reserved} of {name!r} are set by the sidecar "
                             "itself (it follows this run)")
    return chosen


def _with_defaults(name: str, options: dict[str, Any], env: Mapping[str, str]
                   ) -> tuple[dict[str, Any], str]:
    """The options completed from the environment, and where the data goes, in words."""
    options = dict(options)
    if name == "tensorboard":
        logdir = options.get("logdir") or env.get("TENSORBOARD_DIR") or TENSORBOARD_DEFAULT
        options["logdir"] = os.path.abspath(os.path.expanduser(str(logdir)))
        return options, options["logdir"]
    if name == "mlflow":
        uri = options.get("tracking_uri") or env.get("MLFLOW_TRACKING_URI")
        return options, str(uri) if uri else "MLflow's default tracking URI (./mlruns)"
    if name == "wandb":
        mode = options.get("mode") or env.get("WANDB_MODE") or "offline"
        directory = options.get("dir") or env.get("WANDB_DIR") or os.getcwd()
        return options, f"W&B {mode}, files under {directory}"
    if name == "swanlab":
        if not options.get("mode") and env.get("SWANLAB_MODE") in SWANLAB_MODES:
            options["mode"] = env["SWANLAB_MODE"]  # verl's variable; the exporter has no envvar
        mode = options.get("mode") or "offline"
        logdir = options.get("logdir") or env.get("SWANLAB_LOG_DIR") or "./swanlog"
        return options, f"SwanLab {mode}, files under {logdir}"
    return options, name


def _as_arguments(name: str, options: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in options.items():
        if not isinstance(key, str) or not key.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"export=: {name!r} has an option name that is not one: {key!r}")
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is True:
                args.append(flag)
            elif item is None or item is False:
                continue
            else:
                args += [flag, str(item)]
    return args


def plan_sidecars(export: Any, *, root: Path, project: str, run_id: str, pid: int,
                  env: Mapping[str, str] = os.environ) -> list[SidecarSpec]:
    """The exporter processes that `export` asks for, following run `run_id`."""
    logs = root / "exports" / "sidecars" / project / run_id
    specs = []
    for name, given in normalize(export).items():
        options, where = _with_defaults(name, given, env)
        follow = ["--root", str(root), "--project", project, "--run", run_id, "--follow",
                  "--while-pid", str(pid)]
        specs.append(SidecarSpec(destination=name,
                                 options=(*follow, *_as_arguments(name, options)),
                                 where=where, log=logs / f"{name}.log"))
    return specs
