"""One W&B session of one W&B run: `wandb.init` → send → `finish`, the transaction log
fsynced; and setting aside the sessions a commit does not count (docs/exporters.md,
Weights & Biases, "Exactly once")."""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wandb

from tracklake import ExportError
from tracklake.exporters._protocol import RunInfo
from tracklake.exporters._shared.attempt_routes import Routes, Target, attempt_label
from tracklake.exporters._shared.nest import nest
from tracklake.exporters.wandb.errors import translate
from tracklake.files import fsync_dir, fsync_file

logger = logging.getLogger(__name__)

SUFFIX = "tracklake"

#: What every session turns off: system metrics, machine and code capture, console
#: capture (the export process is not the training run they would describe).
QUIET = {
    "silent": True, "console": "off",
    "x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True,
    "disable_git": True, "disable_code": True, "save_code": False,
    "x_save_requirements": False, "disable_job_creation": True,
}


@dataclass(frozen=True)
class Sessions:
    """Where and how the sessions of every run are made."""

    mode: str
    dir: Path
    entity: str | None
    wandb_project: str | None
    proxy: str | None

    def settings(self, target: Target) -> Any:
        """wandb's settings for the next session of `target` (its directory suffix)."""
        nonce = uuid.uuid4().hex[:8]
        options: dict[str, Any] = {
            **QUIET, "mode": self.mode,
            "x_sync_dir_suffix": f"{SUFFIX}{target.sessions:06d}{nonce}",
        }
        if self.proxy:
            options.update(http_proxy=self.proxy, https_proxy=self.proxy)
        return wandb.Settings(**options)

    def run(self, run: RunInfo, target: Target, send: Callable[[Any], None],
            exit_code: int, identity: Mapping[str, str] | None = None) -> None:
        """init → send → finish; the transaction log fsynced. A session that fails is
        finished and set aside, and the error is retryable (the loop sends again).
        `identity`: the group, job type and notes a tracklake.wandb run was given (the
        group defaults to the tracklake run id)."""
        identity = identity or {}
        config = nest({**run.config})
        name, extra = attempt_label(run, target)
        tags = [*run.tags, *extra]
        try:
            wb = wandb.init(
                entity=self.entity, project=self.wandb_project or run.project,
                dir=str(self.dir), id=target.id, resume="allow", name=name,
                group=identity.get("group", run.run), job_type=identity.get("job_type"),
                notes=identity.get("notes"), tags=tags, config=config or None,
                reinit="create_new", settings=self.settings(target))
        except Exception as exc:  # cleaned up whatever it is, then `translate`d
            _forget_failed_init()
            raise _init_error(run, exc) from exc
        sync_file = Path(wb.settings.sync_file)
        try:
            send(wb)
        except Exception as exc:  # the session is set aside whatever the error
            _finish_failed(wb, run)
            _rename_uncommitted(sync_file)
            raise translate(exc, f"run {run.key}: logging to W&B failed") from exc
        try:
            wb.finish(exit_code=exit_code)
            _fsync(sync_file)
        except Exception as exc:
            _rename_uncommitted(sync_file)
            raise translate(exc, f"run {run.key}: finishing the W&B session "
                                 f"{sync_file.parent} failed") from exc

    def set_aside(self, run: RunInfo, current: Routes) -> None:
        """Rename the transaction logs of sessions no commit counts, of the run's base W&B
        run and of its attempts' (also ones no commit knows)."""
        wandb_dir = Path(wandb.Settings(root_dir=str(self.dir)).wandb_dir)
        pattern = re.compile(rf"(?:offline-)?run-\d{{8}}_\d{{6}}-({current.base}(?:-a\d+)?)"
                             rf"-{SUFFIX}(\d{{6}})[0-9a-f]{{8}}\Z")

        def session_of(name: str) -> tuple[str, int] | None:
            m = pattern.match(name)
            return (m.group(1), int(m.group(2))) if m else None

        for name, target_id, committed in current.uncommitted_sessions(wandb_dir,
                                                                         session_of):
            log = wandb_dir / name / f"run-{target_id}.wandb"
            if not log.exists():
                continue  # set aside before
            if committed:
                logger.info("run %s: setting aside %s, written after the last commit",
                            run.key, log)
            else:
                logger.warning("run %s: %s was written by an earlier export but the export "
                               "state does not count it: it is renamed to "
                               ".wandb.uncommitted and its records are exported again",
                               run.key, log)
            _rename_uncommitted(log)


def _init_error(run: RunInfo, exc: Exception) -> ExportError:
    if isinstance(exc, (wandb.errors.UsageError, wandb.errors.AuthenticationError)):
        return ExportError(f"run {run.key}: wandb.init refused: {exc} (online mode needs "
                           "WANDB_API_KEY or `wandb login`; offline needs neither)",
                           retryable=False)
    return translate(exc, f"run {run.key}: wandb.init failed")


def _finish_failed(wb: Any, run: RunInfo) -> None:
    """End a session whose sending failed; the error that ends it is the one to report,
    so a second failure here is only logged."""
    try:
        wb.finish(exit_code=1)
    except Exception as exc:  # reported below; the first error is raised by the caller
        logger.warning("run %s: finishing the failed W&B session also failed: %s: %s",
                       run.key, type(exc).__name__, exc)


def _forget_failed_init() -> None:
    """A `wandb.init` that failed leaves its run registered in the wandb-core service, and
    every later init of that id fails with "run ID is in use": stop the service (the next
    init starts a fresh one)."""
    try:
        wandb.teardown()
    except Exception as exc:  # the init's own error is the one raised by the caller
        logger.warning("stopping the wandb-core service after a failed init failed: %s: %s",
                       type(exc).__name__, exc)


def _rename_uncommitted(path: Path) -> None:
    target = path.with_name(path.name + ".uncommitted")
    try:
        if path.exists():
            os.replace(path, target)
            fsync_dir(path.parent)
    except OSError as exc:
        raise ExportError(f"cannot set aside the uncommitted W&B file {path}: "
                          f"{exc.strerror or exc}", retryable=True) from exc


def _fsync(path: Path) -> None:
    fsync_file(path)
    fsync_dir(path.parent)
    fsync_dir(path.parent.parent)
