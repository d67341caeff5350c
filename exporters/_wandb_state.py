"""The W&B destination's commit state of one run: its W&B runs (`_attempt_routes`: a
resumed attempt that logs steps again gets ``<id>-a<attempt>``), what was dropped, and
what ``--ranks all`` holds back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracklake._errors import ExportError
from tracklake.exporters._attempt_routes import Routes
from tracklake.exporters._protocol import RunInfo


def wandb_run_id(run: RunInfo) -> str:
    """The W&B run id of a tracklake run (its attempts' runs add ``-a<attempt>``)."""
    return run.export_id


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class RunState(Routes):
    """The commit state of one run (JSON in the loop's cursor file)."""

    def __init__(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        base = wandb_run_id(run)
        try:
            if state and state.get("id") != base:
                raise ValueError("another run's id")
            super().__init__(base, state.get("targets"), state.get("attempts"))
            self.dropped_steps: int = state.get("dropped_steps", 0)
            self.dropped_records: int = state.get("dropped_records", 0)
            # --ranks all: the latest metric step of each rank, and metric values above
            # the lowest of them, held per attempt ("-" for none) and step until it passes
            self.reach: dict[str, int] = dict(state.get("reach", {}))
            self.held: dict[str, dict[str, dict[str, float]]] = dict(state.get("held", {}))
            valid = (_count(self.dropped_steps) and _count(self.dropped_records)
                     and all(isinstance(v, int) for v in self.reach.values())
                     and all(isinstance(v, dict) for v in self.held.values()))
        except (TypeError, ValueError, AttributeError):
            valid = False
        if not valid:
            raise ExportError(f"run {run.key}: the W&B export state {dict(state)!r} is not one "
                              "this exporter wrote; delete the run's export state to export it "
                              "again from its start", retryable=False)

    def dump(self) -> dict[str, Any]:
        return {"id": self.base, **super().dump(),
                "dropped_steps": self.dropped_steps, "dropped_records": self.dropped_records,
                "reach": dict(sorted(self.reach.items())), "held": self.held}
