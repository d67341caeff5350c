"""Which destination run a tracklake run's records go to, for destinations that hold one
value per step and key (W&B, SwanLab), kept in the commit state.

A tracklake run is one destination run (its *base*) until a later attempt logs a step
again that the destination run already holds: a job resumed from a checkpoint. Its
records then go to a destination run of their own, ``<base>-a<attempt>``, so that
neither attempt's values are lost; the attempts after it follow it while their steps
keep increasing. An attempt is bound to a destination run ("target") by its first
metrics. Each target counts its committed sessions and the last metric step it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc


class Collected(Protocol):
    """What a destination collected of one attempt since its last commit."""

    metrics: dict[int, dict[str, float]]  # step -> key -> value

    def merge(self, later: Any) -> None: ...  # `later`: the same type


P = TypeVar("P", bound=Collected)


@dataclass
class Target:
    """One destination run written for a tracklake run."""

    id: str
    attempt: int | None = None  # the attempt that branched it off; None for the base
    sessions: int = 0  # committed sessions (numbered from 0)
    last_step: int | None = None

    def dump(self) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, "sessions": self.sessions,
                "last_step": self.last_step}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Routes:
    """The targets of one run and the attempts bound to them."""

    def __init__(self, base: str, targets: Any, attempts: Any) -> None:
        """From the state's ``targets`` and ``attempts`` (None: a first export). Raises
        ValueError for anything this module did not write."""
        self.base = base
        try:
            self.targets = [Target(**t) for t in targets or []] or [Target(base)]
            self.attempts = {int(a): int(i) for a, i in (attempts or {}).items()}
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"unreadable targets: {exc}") from exc
        if not (self.targets[0].id == base and self.targets[0].attempt is None
                and all(t.id == f"{base}-a{t.attempt}" for t in self.targets[1:])
                and all(_count(t.sessions) and (t.last_step is None or (
                    isinstance(t.last_step, int) and not isinstance(t.last_step, bool)))
                        for t in self.targets)
                and all(0 <= i < len(self.targets) for i in self.attempts.values())):
            raise ValueError("targets or attempts this exporter did not write")

    def dump(self) -> dict[str, Any]:
        return {"targets": [t.dump() for t in self.targets],
                "attempts": {str(a): i for a, i in sorted(self.attempts.items())}}

    def committed_sessions(self, target_id: str) -> int:
        """Sessions of `target_id` that a commit counted (0 for a run no commit knows)."""
        return next((t.sessions for t in self.targets if t.id == target_id), 0)

    def current(self) -> Target:
        """Where records of no particular attempt go: the latest attempt's target."""
        return self.targets[self.attempts[max(self.attempts)]] if self.attempts else (
            self.targets[0])

    def route(self, attempt: int | None, first_step: int | None,
              last_step: int | None) -> Target:
        """The target for `attempt`'s records, whose lowest metric step in this commit is
        `first_step`; `last_step` is the current target's last step counting what this
        commit already routed to it."""
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

    def split(self, collected: Mapping[int | None, P], new: Callable[[], P]
              ) -> list[tuple[Target, P]]:
        """Each attempt's records merged into its target's, earlier attempts first;
        records of no attempt (rank aggregates) to the latest attempt's target."""
        merged: dict[str, tuple[Target, P]] = {}
        reach: dict[str, int | None] = {}  # last step per target counting this commit
        order = sorted(a for a in collected if a is not None) + (
            [None] if None in collected else [])
        for attempt in order:
            part = collected[attempt]
            now = self.current()
            target = self.route(attempt, min(part.metrics, default=None),
                                reach.get(now.id, now.last_step))
            _, into = merged.setdefault(target.id, (target, new()))
            into.merge(part)
            steps = [s for s in (reach.get(target.id, target.last_step),
                                 max(part.metrics, default=None)) if s is not None]
            reach[target.id] = max(steps) if steps else None
        return list(merged.values())


def by_attempt(records: pa.Table) -> list[tuple[int | None, pa.Table]]:
    """`records` split by their ``attempt`` column (None: records of no one attempt)."""
    if "attempt" not in records.column_names:
        return [(None, records)]
    column = records.column("attempt")
    attempts = column.unique().to_pylist()
    if len(attempts) == 1:
        return [(attempts[0], records)]
    return [(a, records.filter(pc.is_null(column) if a is None else pc.equal(column, a)))
            for a in attempts]
