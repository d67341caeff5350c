"""A drop-in for verl's `Tracking`: one object, several backends, tracklake writing locally."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tracklake._write.run import Run, init

#: Backends that verl runs in-process and tracklake replaces with exporters.
EXPORTED_BACKENDS = frozenset({"wandb", "mlflow", "swanlab", "tensorboard", "vemlp_wandb",
                               "clearml", "trackio"})
SUPPORTED_BACKENDS = frozenset({"tracklake", "console"}) | EXPORTED_BACKENDS


class Tracking:
    """``Tracking(project_name, experiment_name, default_backend, config)`` as in verl.

    ``"tracklake"`` writes the run to the local store. ``"console"`` prints each step
    like verl's console logger. wandb, mlflow, swanlab and tensorboard are not run in the
    training process: the run is written to the store (as if ``"tracklake"`` were listed)
    and ``tracklake export <dest>`` replays it, now or later.
    """

    def __init__(self, project_name: str, experiment_name: str,
                 default_backend: str | Sequence[str] = "console", config: Any = None,
                 *, root: str | os.PathLike[str] | None = None, **init_options: Any) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else list(
            default_backend)
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"unknown logger backend(s) {unknown}; supported: "
                             f"{sorted(SUPPORTED_BACKENDS)}")
        self.backends = backends
        self.console = "console" in backends
        self.run: Run | None = None
        if any(b != "console" for b in backends):
            self.run = init(project=project_name, name=experiment_name, config=config,
                            root=root, **init_options)

    def log(self, data: Mapping[str, Any], step: int, backend: str | Sequence[str] | None = None
            ) -> None:
        """Log `data` at `step` to every backend (or only to `backend`)."""
        chosen = self.backends if backend is None else (
            [backend] if isinstance(backend, str) else list(backend))
        if self.run is not None and any(b != "console" for b in chosen):
            self.run.log(data, step=step)
        if self.console and "console" in chosen:
            print(format_console_line(data, step), flush=True)

    def finish(self, status: str = "finished") -> None:
        if self.run is not None:
            self.run.finish(status)

    def __del__(self) -> None:
        run = getattr(self, "run", None)
        if run is not None and not run.finished:
            run.finish()


def format_console_line(data: Mapping[str, Any], step: int) -> str:
    """verl's console format: ``step:N - key:value - key:value``."""
    parts = [f"step:{step}"]
    for key, value in data.items():
        if isinstance(value, float):
            parts.append(f"{key}:{value:.3f}")
        else:
            parts.append(f"{key}:{value}")
    return " - ".join(parts)
