"""Which W&B run a tracklake run's records go to, kept in the commit state.

A tracklake run is one W&B run (its *base*) until a later attempt logs a step again that
the W&B run already holds: a job resumed from a checkpoint. W&B takes only increasing
steps, so that attempt's records go to a W&B run of their own, ``<base>-a<attempt>``, in
the same group; the attempts after it follow it while their steps keep increasing. Each
W&B run ("target") counts its committed sessions and the last step it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracklake._errors import ExportError
from tracklake.exporters._protocol import RunInfo


def wandb_run_id(run: RunInfo) -> str:
    """The W&B run id of a tracklake run (its attempts' runs add ``-a<attempt>``)."""
    return run.export_id


@dataclass
class Target:
    """One W&B run written for a tracklake run."""

    id: str
    attempt: int | None = None  # the attempt that branched it off; None for the base
    sessions: int = 0  # committed sessions (session directories numbered from 0)
    last_step: int | None = None

    def dump(self) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, "sessions": self.sessions,
                "last_step": self.last_step}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _step(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


class RunState:
    """The commit state of one run (JSON in the loop's cursor file)."""

    def __init__(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        self.base = wandb_run_id(run)
        try:
            self.targets = [Target(**t) for t in state.get("targets", [])] or [
                Target(self.base, None, state.get("sessions", 0), state.get("last_step"))]
            self.attempts = {int(a): int(i) for a, i in state.get("attempts", {}).items()}
            self.dropped_steps: int = state.get("dropped_steps", 0)
            self.dropped_records: int = state.get("dropped_records", 0)
            # --ranks all: the latest metric step of each rank, and metric values above
            # the lowest of them, held per attempt ("-" for none) and step until it passes
            self.reach: dict[str, int] = dict(state.get("reach", {}))
            self.held: dict[str, dict[str, dict[str, float]]] = dict(state.get("held", {}))
            valid = (
                (not state or state.get("id") == self.base)
                and self.targets[0].id == self.base
                and all(t.id == f"{self.base}-a{t.attempt}" for t in self.targets[1:])
                and all(_count(t.sessions) and _step(t.last_step) for t in self.targets)
                and all(0 <= i < len(self.targets) for i in self.attempts.values())
                and _count(self.dropped_steps) and _count(self.dropped_records)
                and all(isinstance(v, int) for v in self.reach.values())
                and all(isinstance(v, dict) for v in self.held.values()))
        except (TypeError, ValueError, AttributeError):
            valid = False
        if not valid:
            raise ExportError(f"run {run.key}: the W&B export state {dict(state)!r} is not one "
                              "this exporter wrote; delete the run's export state to export it "
                              "again from its start", retryable=False)

    def dump(self) -> dict[str, Any]:
        return {"id": self.base, "targets": [t.dump() for t in self.targets],
                "attempts": {str(a): i for a, i in sorted(self.attempts.items())},
                "dropped_steps": self.dropped_steps, "dropped_records": self.dropped_records,
                "reach": dict(sorted(self.reach.items())), "held": self.held}

    def committed_sessions(self, wandb_id: str) -> int:
        """Sessions of `wandb_id` that a commit counted (0 for a run no commit knows)."""
        return next((t.sessions for t in self.targets if t.id == wandb_id), 0)

    def current(self) -> Target:
        """Where records of no particular attempt go: the latest attempt's target."""
        return self.targets[self.attempts[max(self.attempts)]] if self.attempts else (
            self.targets[0])

    def route(self, attempt: int | None, first_step: int | None,
              last_step: int | None) -> Target:
        """The target for `attempt`'s records, whose lowest metric step in this commit is
        `first_step`; `last_step` is the current target's last step counting what this
        commit already routed to it. An attempt is bound to a target by its first metric."""
        if attempt is None:
            return self.current()
        if attempt in self.attempts:
            return self.targets[self.attempts[attempt]]
        current = self.current()
        if first_step is None:
            return current
        if last_step is None or first_step > last_step:
            self.attempts[attempt] = self.targets.index(current)
            return current
        branch = Target(f"{self.base}-a{attempt}", attempt)
        self.targets.append(branch)
        self.attempts[attempt] = len(self.targets) - 1
        return branch
