"""The SwanLab destination: one SwanLab run per tracklake run, written by the swanlab SDK
(0.10) in its offline, local or cloud mode, one short SwanLab session per commit.

The mapping, steps, resumed attempts, exactly-once sessions, modes, upload and
troubleshooting are documented in docs/exporters.md (SwanLab). In short: `commit()`
routes each attempt to its SwanLab run (`_shared.attempt_routes`: a resumed attempt that logs
steps again gets ``<id>-a<N>``), merges per step, keeps the last step per key of each run
in the state (values at or below it are dropped and counted, texts move on), and writes
one whole session — init, log, finish, fsync (`session`) — because SwanLab
never appends to an earlier session's file. `open_run()` sets aside every session the
state does not count, so a crash duplicates nothing in the files. SwanLab replaces a
run's config per session, so the state keeps the whole config and every session sends
it. Only SwanLab's public API is used; the tests read the files back with SwanLab's
internal reader.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import click
import pyarrow as pa
import swanlab  # type: ignore[import-untyped, unused-ignore]  # ships no type information

from tracklake import ExportError
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo
from tracklake.exporters._shared.attempt_routes import (
    Collecting,
    Routes,
    Target,
    attempt_label,
    is_count,
)
from tracklake.exporters._shared.media import undecodable_audio, undecodable_image
from tracklake.exporters.swanlab import records as mapping
from tracklake.exporters.swanlab import session as sessions

logger = logging.getLogger(__name__)

_ADD: dict[str, Callable[[mapping.SwanlabPending, pa.Table], None]] = {
    "metrics": mapping.add_metrics, "texts": mapping.add_texts,
    "configs": mapping.add_configs, "generations": mapping.add_generations,
    "traces": mapping.add_traces, "artifacts": mapping.add_artifacts,
    "events": mapping.add_alerts, "histograms": mapping.add_histograms}
STATUS_KEY = "tracklake/status"


def swanlab_run_id(run: RunInfo) -> str:
    """The SwanLab run id of a tracklake run."""
    return run.export_id


def _steps(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and is_count(v)
                                           for k, v in value.items())


class SwanlabState(Routes):
    """The commit state of one run (JSON in the loop's cursor file): its SwanLab runs
    (`_shared.attempt_routes`), the last step per key of each, the config, what was dropped."""

    destination = "SwanLab"

    def __init__(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        super().__init__(run, swanlab_run_id(run), state)

    def _load(self, state: Mapping[str, Any]) -> bool:
        self.last_steps: dict[str, dict[str, int]] = {
            k: dict(v) for k, v in state.get("last_steps", {}).items()}
        self.config: dict[str, Any] = dict(state.get("config", {}))
        self.dropped_values: int = state.get("dropped_values", 0)
        return all(_steps(v) for v in self.last_steps.values()) and is_count(
            self.dropped_values)

    def dump(self) -> dict[str, Any]:
        return {**super().dump(), "last_steps": self.last_steps, "config": self.config,
                "dropped_values": self.dropped_values}


class SwanlabDestination(Destination):
    """Writes each run as a SwanLab run (offline files by default) through the swanlab SDK."""

    name: ClassVar[str] = "swanlab"
    #: while following, seconds between commits to a live run: each commit is a session
    #: directory that `sync` uploads one by one (``--commit-interval`` overrides it)
    commit_interval: ClassVar[float] = 30.0

    def __init__(self, *, mode: str = "offline", logdir: str | None = None,
                 swanlab_project: str | None = None, workspace: str | None = None) -> None:
        if mode not in sessions.MODES:
            raise ValueError(f"mode must be one of {', '.join(sessions.MODES)}, not {mode!r}")
        sessions.check_version()
        for option, value, rule in (("--swanlab-project", swanlab_project,
                                     sessions.PROJECT_NAME),
                                    ("--workspace", workspace, sessions.WORKSPACE_NAME)):
            if value is not None and not rule.match(value):
                raise ExportError(f"{option} {value!r} is not a name SwanLab accepts "
                                  f"({rule.pattern.rstrip(chr(92) + 'Z')})", retryable=False)
        sessions.check_mode(mode)
        self.mode = mode
        base = logdir or os.environ.get("SWANLAB_LOG_DIR") or "swanlog"
        self.logdir = Path(os.path.abspath(os.path.expanduser(base)))
        self.swanlab_project = swanlab_project
        self.workspace = workspace
        self._states: dict[str, SwanlabState] = {}
        self._collecting = Collecting(mapping.SwanlabPending)
        self._context: ExportContext | None = None  # from `start()`

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
        return [
            click.Option(["--mode"], type=click.Choice(list(sessions.MODES)),
                         default="offline", show_default=True,
                         help="offline: run files for `swanlab sync --id`; local: the same "
                              "plus SwanLab's local dashboard; cloud: upload (SWANLAB_API_KEY)."),
            click.Option(["--logdir"], type=click.Path(file_okay=False), default=None,
                         help="SwanLab log directory (default $SWANLAB_LOG_DIR, else "
                              "./swanlog)."),
            click.Option(["--swanlab-project"], default=None, envvar="SWANLAB_PROJ_NAME",
                         help="SwanLab project for every run (default $SWANLAB_PROJ_NAME, "
                              "else the tracklake project)."),
            click.Option(["--workspace"], default=None, envvar="SWANLAB_WORKSPACE",
                         help="SwanLab workspace (cloud; default $SWANLAB_WORKSPACE, else "
                              "your own)."),
        ]

    def start(self, context: ExportContext) -> None:
        self._context = context

    def describe(self) -> str:
        parts = [f"swanlab:{self.mode}:{self.logdir}"]
        if self.workspace or self.swanlab_project:
            parts.append(f"{self.workspace or ''}/{self.swanlab_project or ''}")
        return ":".join(parts)

    # -- the protocol ------------------------------------------------------------------

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        current = SwanlabState(run, state)
        project = self.swanlab_project or run.project
        if not sessions.PROJECT_NAME.match(project):
            raise ExportError(f"run {run.key}: {project!r} is not a SwanLab project name "
                              "(letters, digits, _ - + . and at most 100 of them); choose "
                              "one with --swanlab-project", retryable=False)
        self._set_aside(run, current)
        self._states[run.key] = current
        self._collecting.open(run.key)

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        self._collecting.pending(run.key)  # raises unless the run is open
        add = _ADD.get(kind)
        if kind == "media":
            if self._context is None:
                raise ExportError(f"run {run.key}: cannot send media: the destination was "
                                  "not started (`start()` tells it the store)",
                                  retryable=False)
            add = functools.partial(mapping.add_media, self._context.root)
        if add is not None and records.num_rows:
            self._collecting.add(run.key, records, add)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        pending = self._collecting.pending(run.key)
        current = self._states[run.key]
        for target, collected in current.split(pending, mapping.SwanlabPending):
            if not collected.empty():
                self._commit_target(run, current, target, collected)
        self._collecting.committed(run.key)
        return current.dump()

    def _commit_target(self, run: RunInfo, current: SwanlabState, target: Target,
                       pending: mapping.SwanlabPending) -> None:
        last_steps = current.last_steps.get(target.id, {})
        planned = mapping.rows_by_step(pending, last_steps)
        if planned.dropped:
            logger.warning("run %s: %d metric values at or before the last step SwanLab run "
                           "%s holds for their key were dropped (SwanLab keeps one value per "
                           "key and step)", run.key, planned.dropped, target.id)
        config = {**current.config, **pending.config}

        def send(sl: Any) -> None:
            for step, row in planned.rows:
                sl.log({k: _value(v) for k, v in row.items()}, step=step)

        self._session(run, target, config, send, state="success")
        target.sessions += 1
        current.last_steps[target.id] = planned.last_steps
        if pending.metrics:
            newest = max(pending.metrics)
            target.last_step = newest if target.last_step is None else max(target.last_step,
                                                                           newest)
        current.config = config
        current.dropped_values += planned.dropped

    def finish_run(self, run: RunInfo) -> None:
        """Record the final status in a session of its own (not part of a commit: a
        later `open_run()` sets it aside, and the next `finish_run()` writes it again)."""
        self._collecting.pending(run.key)  # raises unless the run is open
        current = self._states[run.key]
        text = (f"**{run.status}** · attempts: {run.attempts} · ranks: "
                + ", ".join(str(r) for r in run.ranks)
                + f" · metric values dropped: {current.dropped_values}")

        def send(sl: Any) -> None:  # at the attempt's number: a new attempt finishes again
            sl.log({STATUS_KEY: swanlab.Text(text, caption=run.status)}, step=run.attempts)

        for target in current.targets:
            self._session(run, target, current.config, send,
                          state=sessions.finish_state(run.status))
        self._collecting.close(run.key)

    def close(self) -> None:
        """Forget open runs; what they collected since their last commit is dropped."""
        self._collecting.close()
        self._states.clear()

    # -- sessions ----------------------------------------------------------------------

    def _session(self, run: RunInfo, target: Target, config: Mapping[str, Any],
                 send: Callable[[Any], None], *, state: str) -> None:
        name, extra = attempt_label(run, target)
        tags = (*run.tags[:30 - len(extra)], *extra)  # SwanLab takes at most 30
        session = sessions.Session(
            logdir=self.logdir, mode=self.mode, run_id=target.id, number=target.sessions,
            project=self.swanlab_project or run.project, workspace=self.workspace,
            name=name[:512], group=run.run[:512], tags=tuple(t[:512] for t in tags),
            description=f"tracklake run {run.key}"[:1024],
            config=mapping.nest({**run.config, **config}))
        sessions.run_session(session, send, state=state, where=f"run {run.key}")

    def _set_aside(self, run: RunInfo, current: SwanlabState) -> None:
        """Set aside the session directories no commit counts."""
        uncommitted = current.uncommitted_sessions(
            self.logdir, lambda name: sessions.session_of(current.base, name))
        for name, _, committed in uncommitted:
            moved = sessions.set_aside(self.logdir / name)
            if committed:
                logger.info("run %s: set aside %s, written after the last commit, as %s",
                            run.key, name, moved.name)
            else:
                logger.warning("run %s: %s was written by an earlier export but the export "
                               "state does not count it: it is set aside as %s and its records "
                               "are exported again", run.key, self.logdir / name, moved.name)


def _media(ref: mapping.MediaRef) -> Any:
    """The SwanLab object of a media record: `Image`; `Video` for a GIF; `Audio` where the
    soundfile package lets SwanLab read it; else a text naming the file. SwanLab decodes
    images and audio whole: one that would decode past a bound is a text too."""
    if ref.type == "image":
        return _decoded(ref, undecodable_image, swanlab.Image)
    if ref.media_type == "image/gif":
        return swanlab.Video(Path(ref.blob).read_bytes(), caption=ref.caption or None)
    if ref.type == "audio" and importlib.util.find_spec("soundfile") is not None:
        return _decoded(ref, undecodable_audio, swanlab.Audio)
    return [swanlab.Text(f"{ref.type} `{ref.media_type}` in the tracklake store: "
                         f"`{ref.blob}`", caption=ref.caption or ref.type)]


def _decoded(ref: mapping.MediaRef, why_not: Callable[[Path], str | None],
             make: Callable[..., Any]) -> Any:
    """`make(blob, caption=...)`, unless `why_not` says SwanLab should not decode the
    blob: then a text naming the file and why, with a warning."""
    why = why_not(Path(ref.blob))
    if why is None:
        return make(ref.blob, caption=ref.caption or None)
    logger.warning("%s %s left out: its blob is not decoded (%s)", ref.type, ref.blob, why)
    return [swanlab.Text(f"{ref.type} `{ref.media_type}` in the tracklake store, not "
                         f"decoded ({why}): `{ref.blob}`", caption=ref.caption or ref.type)]


def _value(value: Any) -> Any:
    if isinstance(value, mapping.MediaRef):
        return _media(value)
    if isinstance(value, mapping.HistogramItem):
        chart = swanlab.echarts.Bar().add_xaxis(value.labels()).add_yaxis(
            "count", list(value.counts))
        return swanlab.ECharts(chart, caption=value.caption)
    if isinstance(value, list):
        return [swanlab.Text(item.content, caption=item.caption) for item in value]
    return value
