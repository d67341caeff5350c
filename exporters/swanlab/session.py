"""One SwanLab session: `swanlab.init` → log → `run.finish`, its files fsynced, SwanLab's
console output kept out of the exporter's; and the checks that say early what is missing
(SwanLab version, cloud credentials, the dashboard package of local mode).

Only SwanLab's public API is used here (`swanlab.init`, `swanlab.Settings`,
`swanlab.Text`, `Run.log`/`finish`/`dir`, `swanlab.exceptions`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# SwanLab ships no type information; everything from it is Any.
import swanlab  # type: ignore[import-untyped, unused-ignore]

from tracklake import ExportError
from tracklake.exporters.swanlab.errors import translate
from tracklake.files import fsync_dir, fsync_file

logger = logging.getLogger(__name__)

#: The SwanLab versions this exporter is written and tested against (the `swanlab` extra).
SUPPORTED = ((0, 10, 3), (0, 11, 0))
SUPPORTED_TEXT = "swanlab>=0.10.3,<0.11"
#: SwanLab's `--mode` names by tracklake's (SwanLab calls cloud mode "online").
MODES = {"cloud": "online", "offline": "offline", "local": "local"}
#: The dashboard package SwanLab 0.10's local mode requires, at exactly this version.
SWANBOARD_VERSION = "0.1.10b2"
PROJECT_NAME = re.compile(r"[0-9a-zA-Z_\-+.]{1,100}\Z")  # SwanLab's project name rule
WORKSPACE_NAME = re.compile(r"[0-9a-zA-Z_\-]{1,25}\Z")
SUFFIX = "tracklake"
_FINISH_STATES = {"finished": "success", "killed": "aborted"}  # others: crashed


def check_version() -> None:
    """Refuse a SwanLab outside the supported range: its run files and options change
    between minor versions."""
    try:
        found = version("swanlab")
    except PackageNotFoundError as exc:
        raise ExportError("SwanLab is not installed: pip install 'tracklake[swanlab]'",
                          retryable=False) from exc
    numbers = tuple(int(p) for p in re.findall(r"\d+", found)[:3])
    if not SUPPORTED[0] <= numbers < SUPPORTED[1]:
        raise ExportError(f"SwanLab {found} is installed; the SwanLab exporter supports "
                          f"{SUPPORTED_TEXT}: pip install 'tracklake[swanlab]'",
                          retryable=False)


def check_mode(mode: str) -> None:
    """What a mode needs before any run is exported: cloud an API key, local SwanLab's
    dashboard package."""
    if mode == "cloud" and swanlab.Settings().api_key is None:
        raise ExportError(
            "SwanLab cloud mode needs an API key: set SWANLAB_API_KEY for the exporter "
            "process (or run `swanlab login`, which stores it in ~/.swanlab/.netrc); "
            "SWANLAB_API_HOST selects a self-hosted server", retryable=False)
    if mode == "local":
        if importlib.util.find_spec("swanboard") is None:
            raise ExportError(
                "SwanLab local mode needs SwanLab's dashboard package: pip install "
                f"'swanlab[dashboard]' (swanboard {SWANBOARD_VERSION}); or export with "
                "--mode offline", retryable=False)
        if (version("swanboard") != SWANBOARD_VERSION
                and os.environ.get("SWANLAB_SKIP_SWANBOARD_VERSION_CHECK") != "1"):
            raise ExportError(
                f"swanboard {version('swanboard')} is installed; SwanLab's local mode needs "
                f"swanboard {SWANBOARD_VERSION}: pip install 'swanlab[dashboard]'",
                retryable=False)


def session_name(run_id: str, number: int) -> str:
    """The directory of session `number` of a SwanLab run, inside the log directory."""
    return f"run-{run_id}-{SUFFIX}{number:06d}"


def session_of(base: str, name: str) -> tuple[str, int] | None:
    """(SwanLab run id, session number) of a session directory of the tracklake run whose
    base SwanLab id is `base` (its attempts' runs are ``<base>-a<N>``), else None."""
    m = re.fullmatch(rf"run-({re.escape(base)}(?:-a\d+)?)-{SUFFIX}(\d{{6}})", name)
    return (m.group(1), int(m.group(2))) if m else None


def set_aside(path: Path) -> Path:
    """Rename a session directory that is not part of the committed state, so that
    neither SwanLab nor ``swanlab sync`` of ``run-<id>-tracklake*`` takes it for one."""
    target = path.with_name(f"uncommitted-{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(path, target)
        fsync_dir(path.parent)
    except OSError as exc:
        raise ExportError(f"cannot set aside the uncommitted SwanLab session {path}: "
                          f"{exc.strerror or exc}", retryable=True) from exc
    return target


@dataclass(frozen=True)
class Session:
    """Everything `swanlab.init` is given for one session of one run."""

    logdir: Path
    mode: str  # tracklake's name: cloud, offline or local
    run_id: str
    number: int
    project: str
    workspace: str | None
    name: str
    group: str
    tags: tuple[str, ...]
    description: str
    config: dict[str, Any]

    @property
    def directory(self) -> Path:
        return self.logdir / session_name(self.run_id, self.number)

    def settings(self) -> Any:
        return quiet_settings(self.directory.name)


def quiet_settings(run_dir: str) -> Any:
    """SwanLab settings for a session in `run_dir` with every probe (hardware, runtime,
    requirements, git, monitor) and console capture off: the export process is not the
    training run they would describe."""
    off = swanlab.Settings.Probe(hardware=False, runtime=False, requirements=False,
                                 conda=False, git=False, swanlab=False, monitor=False)
    return swanlab.Settings(
        interactive=False, terminal=swanlab.Settings.Terminal(proxy_type="none"),
        probe=off, run=swanlab.Settings.Run(dir=run_dir))


def run_session(session: Session, send: Callable[[Any], None], *, state: str,
                where: str) -> None:
    """init → `send(run)` → finish(state); the session's files fsynced. A session that
    fails is set aside and the error says whether retrying can help."""
    output = io.StringIO()
    try:
        with _quiet(output):
            run = swanlab.init(
                project=session.project, workspace=session.workspace, name=session.name,
                group=session.group, tags=list(session.tags), description=session.description,
                id=session.run_id, resume="allow", mode=MODES[session.mode],
                log_dir=str(session.logdir), config=session.config or None,
                settings=session.settings(), reinit=True)
    except Exception as exc:  # cleaned up whatever it is, then `translate`d
        _drop(session.directory)
        raise translate(exc, f"{where}: swanlab.init failed{_tail(output.getvalue())}"
                        ) from exc
    try:
        with _quiet(output):
            send(run)
            run.finish(state=state)
        _fsync_tree(Path(run.dir))
    except Exception as exc:  # the session is set aside whatever the error
        _finish_crashed(run, exc, output, where)
        _drop(session.directory)
        raise translate(exc, f"{where}: writing the SwanLab session {session.directory} "
                             f"failed{_tail(output.getvalue())}") from exc
    logger.debug("%s: SwanLab session %s written; SwanLab said: %s", where,
                 session.directory, output.getvalue().strip())


def _finish_crashed(run: Any, error: Exception, output: io.StringIO, where: str) -> None:
    """End a session whose sending failed; the error that ends it is the one to report,
    so a second failure here is only logged."""
    try:
        with _quiet(output):
            run.finish(state="crashed", error=str(error))
    except Exception as exc:  # reported below; the first error is raised by the caller
        logger.warning("%s: finishing the failed SwanLab session also failed: %s: %s",
                       where, type(exc).__name__, exc)


def finish_state(status: str) -> str:
    """SwanLab's finish state for a tracklake run status."""
    return _FINISH_STATES.get(status, "crashed")


@contextlib.contextmanager
def _quiet(output: io.StringIO) -> Iterator[None]:
    """SwanLab prints its banner and warnings to stdout (a rich console that writes to
    whatever sys.stdout is); keep them for the debug log and error messages instead."""
    with contextlib.redirect_stdout(output):
        yield


def _tail(text: str) -> str:
    text = text.strip()
    return f" (SwanLab said: {text[-600:]})" if text else ""


def _drop(directory: Path) -> None:
    if directory.exists():
        set_aside(directory)


def _fsync_tree(directory: Path) -> None:
    """fsync every file SwanLab wrote for the session, then the directories up to the
    log directory: SwanLab itself only flushes."""
    for parent, _, files in os.walk(directory):
        for name in files:
            fsync_file(Path(parent) / name)
        fsync_dir(Path(parent))
    fsync_dir(directory.parent)
