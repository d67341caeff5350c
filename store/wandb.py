"""W&B's module API, written to the local store: ``import tracklake.wandb as wandb``.

Training code that uses W&B runs unchanged and never touches a network; the run is
replayed into W&B later by ``tracklake export wandb``. What maps to what, and what is not
supported, is in docs/integrations.md. ``wandb.run`` is None until `init()`;
``wandb.config`` and ``wandb.summary`` are the current run's (before `init()`, using them
raises `Error`, as in W&B). A name of W&B's that is not here raises `AttributeError`
naming what to use instead.

Frameworks that ``import wandb`` themselves (transformers, TRL, verl) reach this module
with the opt-in of `tracklake.integrations.wandb` (``TRACKLAKE_WANDB=1``).

Signatures are W&B's, positional parameters included (W&B code calls ``wandb.init`` and
``wandb.log`` so), unlike the keyword-only options of tracklake's own API.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tracklake._errors import WandbCommError as CommError
from tracklake._errors import WandbConfigError as ConfigError
from tracklake._errors import WandbError as Error
from tracklake._errors import WandbUsageError as UsageError
from tracklake._integrations.wandb import (
    Artifact,
    Audio,
    Config,
    Histogram,
    Html,
    Image,
    MetricRule,
    PreInit,
    Settings,
    Summary,
    Table,
    Video,
    init,
    missing_attribute,
    util,
)
from tracklake._integrations.wandb import WandbRun as Run
from tracklake._integrations.wandb import current as _current


class AlertLevel(str, enum.Enum):
    """``wandb.AlertLevel``."""

    INFO = "INFO"
    WARN = "WARN"
    ERROR = "ERROR"


#: The wandb release whose module API this one follows (code that checks the version,
#: such as verl's INCREMENTAL tables from 0.20, takes the paths it would take there).
__version__ = "0.31.0"

_PRE_INIT = {"config": PreInit("wandb.config"), "summary": PreInit("wandb.summary")}


def __getattr__(name: str) -> Any:
    """``run``, ``config`` and ``summary`` follow the current run; other names of W&B's
    raise AttributeError naming what to use instead."""
    if name == "run":
        return _current.run
    if name in _PRE_INIT:
        run = _current.run
        return _PRE_INIT[name] if run is None else getattr(run, name)
    if name.startswith("__"):
        raise AttributeError(f"module 'tracklake.wandb' has no attribute {name!r}")
    raise missing_attribute(f"wandb.{name}")


def _run(call: str) -> Run:
    run = _current.run
    if run is None:
        raise Error(f"You must call wandb.init() before {call}()")
    return run


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None,
        sync: bool | None = None) -> None:
    """``wandb.log`` on the current run."""
    _run("wandb.log").log(data, step=step, commit=commit)


def define_metric(name: str, step_metric: str | Any = None, step_sync: bool | None = None,
                  hidden: bool | None = None, summary: str | None = None,
                  goal: str | None = None, overwrite: bool | None = None) -> MetricRule:
    """``wandb.define_metric`` on the current run."""
    return _run("wandb.define_metric").define_metric(
        name, step_metric=step_metric, step_sync=step_sync, hidden=hidden, summary=summary,
        goal=goal, overwrite=overwrite)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """``wandb.finish``: finish the current run (nothing without one)."""
    run = _current.run
    if run is not None:
        run.finish(exit_code=exit_code, quiet=quiet)


def login(key: str | None = None, relogin: bool | None = None, host: str | None = None,
          force: bool | None = None, timeout: int | None = None, verify: bool = True,
          referrer: str | None = None, prompt: bool = True, **kwargs: Any) -> bool:
    """No-op: nothing is online, so there is nothing to log in to. Returns True."""
    return True


def save(glob_str: str | os.PathLike[str] | None = None,
         base_path: str | os.PathLike[str] | None = None, policy: str = "live",
         glob: bool = True) -> bool | list[str]:
    """``wandb.save``: the files stored as artifacts of the current run."""
    return _run("wandb.save").save(glob_str, base_path=base_path, policy=policy, glob=glob)


def log_artifact(artifact_or_path: Artifact | str | os.PathLike[str], name: str | None = None,
                 type: str | None = None, aliases: Sequence[str] | None = None,
                 tags: Sequence[str] | None = None) -> Artifact | None:
    """``wandb.log_artifact`` on the current run."""
    return _run("wandb.log_artifact").log_artifact(artifact_or_path, name=name, type=type,
                                                   aliases=aliases, tags=tags)


def alert(title: str, text: str, level: str | AlertLevel | None = None,
          wait_duration: Any = None) -> None:
    """``wandb.alert``: an alert event of the current run."""
    _run("wandb.alert").alert(title, text, level=level, wait_duration=wait_duration)


def watch(models: Any = None, criterion: Any = None, log: str | None = "gradients",
          log_freq: int = 1000, idx: int | None = None, log_graph: bool = False) -> None:
    """No-op (said once): gradients and parameters are not recorded."""
    _run("wandb.watch").watch()


def unwatch(models: Any = None) -> None:
    """No-op (said once)."""
    _run("wandb.unwatch").unwatch()


def mark_preempting() -> None:
    """Record that the current run expects to be preempted."""
    _run("wandb.mark_preempting").mark_preempting()


def termlog(string: str = "", newline: bool = True, repeat: bool = True,
            prefix: bool = True) -> None:
    """W&B's console line, on stderr."""
    _term("", string, newline, prefix)


def termwarn(string: str, newline: bool = True, repeat: bool = True,
             prefix: bool = True) -> None:
    _term("WARNING ", string, newline, prefix)


def termerror(string: str, newline: bool = True, repeat: bool = True,
              prefix: bool = True) -> None:
    _term("ERROR ", string, newline, prefix)


def _term(level: str, string: str, newline: bool, prefix: bool) -> None:
    head = f"wandb: {level}" if prefix else ""
    print(head + str(string), end="\n" if newline else "", file=sys.stderr, flush=True)


__all__ = [
    "AlertLevel",
    "Artifact",
    "Audio",
    "CommError",
    "Config",
    "ConfigError",
    "Error",
    "Histogram",
    "Html",
    "Image",
    "Run",
    "Settings",
    "Summary",
    "Table",
    "UsageError",
    "Video",
    "alert",
    "define_metric",
    "finish",
    "init",
    "log",
    "log_artifact",
    "login",
    "mark_preempting",
    "save",
    "termerror",
    "termlog",
    "termwarn",
    "unwatch",
    "util",
    "watch",
]
