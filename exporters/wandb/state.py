"""The W&B destination's commit state of one run: its W&B runs (`_shared.attempt_routes`: a
resumed attempt that logs steps again gets ``<id>-a<attempt>``), what was dropped, and
what ``--ranks all`` holds back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tracklake.exporters._protocol import RunInfo
from tracklake.exporters._shared.attempt_routes import Routes, is_count
from tracklake.exporters.wandb.axes import MAX_RULES, AxisRow, valid_rule

if TYPE_CHECKING:
    from tracklake.exporters.wandb.rows import Value


def wandb_run_id(run: RunInfo) -> str:
    """The W&B run id of a tracklake run (its attempts' runs add ``-a<attempt>``)."""
    return run.export_id


class WandbState(Routes):
    """The commit state of one run (JSON in the loop's cursor file)."""

    destination = "W&B"

    def __init__(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        super().__init__(run, wandb_run_id(run), state)

    def _load(self, state: Mapping[str, Any]) -> bool:
        self.dropped_steps: int = state.get("dropped_steps", 0)
        self.dropped_records: int = state.get("dropped_records", 0)
        # --ranks all: the latest metric step of each rank, and metric values above the
        # lowest of them, held per attempt ("-" for none) and step until it passes
        self.reach: dict[str, int] = dict(state.get("reach", {}))
        self.held: dict[str, dict[str, dict[str, Value]]] = dict(state.get("held", {}))
        self.seen: set[str] = set(state.get("seen", []))  # ranks seen on an axis of their own
        # a tracklake.wandb run's group, job type and notes, from its wandb.init event
        self.identity: dict[str, str] = dict(state.get("identity", {}))
        # define_metric rules so far, the highest step of W&B's own axis each target
        # holds, and the axis rows that wait for a later session (`axes.place`)
        self.rules: list[dict[str, Any]] = list(state.get("rules", []))
        self.tops: dict[str, int] = dict(state.get("tops", {}))
        self.waiting: dict[str, dict[tuple[str, int], AxisRow]] = {
            target: {(axis, value): AxisRow(time, values)
                     for axis, value, time, values in rows}
            for target, rows in dict(state.get("waiting", {})).items()}
        return (is_count(self.dropped_steps) and is_count(self.dropped_records)
                and len(self.rules) <= MAX_RULES
                and all(valid_rule(r) == r for r in self.rules)
                and all(isinstance(v, int) for v in self.tops.values())
                and all(isinstance(r, str) for r in self.seen)
                and all(isinstance(a, str) and isinstance(v, int) and isinstance(r.values, dict)
                        and (r.time is None or isinstance(r.time, int))
                        for rows in self.waiting.values() for (a, v), r in rows.items())
                and all(isinstance(v, str) for v in self.identity.values())
                and all(isinstance(v, int) for v in self.reach.values())
                and all(isinstance(v, dict) for v in self.held.values()))

    def dump(self) -> dict[str, Any]:
        return {**super().dump(),
                "dropped_steps": self.dropped_steps, "dropped_records": self.dropped_records,
                "reach": dict(sorted(self.reach.items())), "held": self.held,
                **({"identity": self.identity} if self.identity else {}),
                **({"rules": self.rules} if self.rules else {}),
                **({"seen": sorted(self.seen)} if self.seen else {}),
                **({"tops": self.tops} if self.tops else {}),
                **({"waiting": {target: [[axis, value, row.time, row.values]
                                         for (axis, value), row in rows.items()]
                                for target, rows in self.waiting.items() if rows}}
                   if any(self.waiting.values()) else {})}
