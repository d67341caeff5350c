"""A drop-in for verl's `Tracking`: one object, several backends, tracklake writing locally."""

from __future__ import annotations

import json
import numbers
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tracklake._write.coerce import flatten, jsonable, to_float
from tracklake._write.finish import FinishReport
from tracklake._write.run import Run, init
from tracklake._write.skips import Skips

#: Backends that verl runs in-process and tracklake replaces with exporters.
EXPORTED_BACKENDS = frozenset({"wandb", "mlflow", "swanlab", "tensorboard"})
#: verl backends with no tracklake exporter yet: refused, rather than accepted and ignored.
UNSERVED_BACKENDS = frozenset({"clearml", "trackio", "vemlp_wandb"})
#: Backends served in the training process, as verl does.
LOCAL_BACKENDS = frozenset({"tracklake", "console", "file", "rl_insight"})
#: verl's deprecated alias: ``tracking`` means ``wandb``.
ALIASES = {"tracking": "wandb"}
SUPPORTED_BACKENDS = LOCAL_BACKENDS | EXPORTED_BACKENDS | frozenset(ALIASES)
#: verl's switch that turns its ``rl_insight`` backend on (off: the backend does nothing).
RL_INSIGHT_ENV = "VERL_RL_INSIGHT_ENABLE"


class Tracking:
    """``Tracking(project_name, experiment_name, default_backend, config)`` as in verl.

    ``"tracklake"`` writes the run to the local store. ``"console"`` prints each step
    like verl's console logger, ``"file"`` appends verl's JSONL lines. wandb, mlflow, swanlab
    and tensorboard are not run in the training process: the run is written to the store
    (as if ``"tracklake"`` were listed) and, from global rank 0, one sidecar exporter process
    per destination follows it live (``sidecars=False``: none; ``tracklake export <dest>``
    replays it later). Values that are not metrics (None, lists, DataFrames) are skipped and
    counted per key in `skipped`, as verl's console skips them.
    """

    def __init__(self, project_name: str, experiment_name: str,
                 default_backend: str | Sequence[str] = "console", config: Any = None,
                 *, root: str | os.PathLike[str] | None = None, sidecars: bool = True,
                 **init_options: Any) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else [
            str(b) for b in default_backend]
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS | UNSERVED_BACKENDS]
        if unknown:
            raise ValueError(f"unknown logger backend(s) {unknown}; supported: "
                             f"{sorted(SUPPORTED_BACKENDS)}")
        unserved = sorted(UNSERVED_BACKENDS.intersection(backends))
        if unserved:
            raise ValueError(
                f"logger backend(s) {unserved} have no tracklake exporter yet, so "
                "tracklake.Tracking cannot serve them; use verl's own Tracking (with tracklake "
                "installed, 'tracklake' in trainer.logger adds the store and verl keeps "
                "serving them), or drop them from the list")
        if rl_insight_enabled() and "rl_insight" in backends:
            raise ValueError(
                f"logger backend 'rl_insight' with {RL_INSIGHT_ENV}=1 reports live gauges from "
                "the training process, which tracklake.Tracking does not do; use verl's own "
                "Tracking with tracklake installed (docs/verl.md), or unset the variable")
        for alias, target in ALIASES.items():
            if alias in backends:
                warnings.warn(f"`{alias}` logger is deprecated. use `{target}` instead.",
                              DeprecationWarning, stacklevel=2)
        self.backends = [ALIASES.get(b, b) for b in backends]
        self.console = "console" in self.backends
        self.run: Run | None = None
        self.store: StoreBackend | None = None
        self.file: JsonlFile | None = None
        if any(b in EXPORTED_BACKENDS or b == "tracklake" for b in self.backends):
            exported = list(dict.fromkeys(b for b in self.backends if b in EXPORTED_BACKENDS))
            self.run = init(project=project_name, name=experiment_name, config=config,
                            root=root, export=exported if exported and sidecars else None,
                            **init_options)
            self.store = StoreBackend(self.run)
            if exported and not sidecars:
                print(f"tracklake: {', '.join(exported)} not run in this process; run "
                      f"{self.run.id!r} is in the store {str(self.run.root)!r}: replay it with "
                      f"`tracklake export DEST --run {self.run.id} --root {self.run.root}`",
                      file=sys.stderr, flush=True)
        if "file" in self.backends:
            self.file = JsonlFile(project_name, experiment_name)

    @property
    def skipped(self) -> dict[str, int]:
        """Values skipped because they are not metrics, counted per key."""
        return dict(self.store.skipped) if self.store is not None else {}

    def log(self, data: Mapping[str, Any], step: int, backend: str | Sequence[str] | None = None
            ) -> None:
        """Log `data` at `step` to every backend (or only to `backend`)."""
        chosen = self.backends if backend is None else [
            ALIASES.get(b, b) for b in ([backend] if isinstance(backend, str) else backend)]
        if self.store is not None and any(b != "console" and b != "file" for b in chosen):
            self.store.log(data, step)
        if self.console and "console" in chosen:
            print(format_console_line(data, step), flush=True)
        if self.file is not None and "file" in chosen:
            self.file.log(data, step)

    def finish(self, status: str | int | None = None, *, exit_code: int | None = None
               ) -> FinishReport | None:
        """Finish the run: `status` as in `Run.finish`, or verl's `exit_code` (0 is
        ``finished``, anything else ``failed``). Idempotent."""
        if isinstance(status, int):  # verl's finish(exit_code) called positionally
            status, exit_code = None, status
        if self.file is not None:
            self.file.close()
        if self.run is None:
            return None
        assert self.store is not None
        return self.store.finish(status or status_for_exit_code(exit_code))

    def __del__(self) -> None:
        run = getattr(self, "run", None)
        if run is not None and not run.finished:
            run.finish()


def rl_insight_enabled() -> bool:
    """verl's rl_insight backend does something only with this switch on."""
    return os.environ.get(RL_INSIGHT_ENV) == "1"


def status_for_exit_code(exit_code: int | None) -> str:
    """verl's `finish(exit_code=...)` as a run status: 0 (or none) is finished, else failed."""
    if exit_code is None or exit_code == 0:
        return "finished"
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise TypeError(f"exit_code must be an int, not {type(exit_code).__name__}")
    return "failed"


class StoreBackend:
    """The ``tracklake`` backend of a `Tracking`: writes `log()` calls to one run.

    A value that is not a metric (None, a list, a DataFrame, an array) is skipped, as
    verl's console skips it, instead of raising in the training loop: counted per key in
    `skipped`, named once on stderr, and summed up at `finish()`.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self._skips = Skips(f"tracklake: run {run.id!r}",
                            "not a metric; skipped (as verl's console skips it)",
                            "skipped values that are not metrics")
        self.skipped: dict[str, int] = self._skips.counts

    def log(self, data: Mapping[str, Any], step: int | None) -> None:
        """Log `data` at `step` (None: the step after the last), metrics only."""
        try:
            self.run.log(data, step=step)
        except TypeError:
            kept = self._metrics_only(data)  # a key that is not a str still raises here
            if kept:
                self.run.log(kept, step=step)

    def _metrics_only(self, data: Mapping[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in flatten(data):
            try:
                to_float(key, value)
            except TypeError:
                self._skips.add(key, value)
                continue
            kept[key] = value
        return kept

    def finish(self, status: str) -> FinishReport:
        report = self._skips.report()
        if report is not None and not self.run.finished:
            print(report, file=sys.stderr, flush=True)
        return self.run.finish(status)


class JsonlFile:
    """verl's ``file`` backend: one ``{"step": N, "data": {...}}`` line per `log()`, at
    $VERL_FILE_LOGGER_PATH, else $VERL_FILE_LOGGER_ROOT (default .)/PROJECT/EXPERIMENT.jsonl."""

    def __init__(self, project_name: str, experiment_name: str) -> None:
        path = os.environ.get("VERL_FILE_LOGGER_PATH")
        if path is None:
            directory = os.path.join(
                os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", ".")), project_name)
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"{experiment_name}.jsonl")
        self.path = path
        self._fp: IO[bytes] | None = open(path, "wb", buffering=0)  # noqa: SIM115  # closed in finish()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        if self._fp is not None:
            line = json.dumps({"step": step, "data": data}, default=jsonable, allow_nan=True)
            self._fp.write(line.encode() + b"\n")

    def close(self) -> None:
        if self._fp is not None:
            self._fp.close()
            self._fp = None


def format_console_line(data: Mapping[str, Any], step: int) -> str:
    """verl's console format: ``step:N - key:value - key:value`` (values that are neither
    numbers nor text are left out, as verl's console leaves them out)."""
    parts = [f"step:{step}"]
    for key, value in data.items():
        if isinstance(value, float):
            parts.append(f"{key}:{value:.3f}")
        elif isinstance(value, (numbers.Number, str)):
            parts.append(f"{key}:{value}")
    return " - ".join(parts)
