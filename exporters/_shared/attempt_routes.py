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

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from tracklake import ExportError
from tracklake.exporters._protocol import RunInfo


class Collected(Protocol):
    """What a destination collected of one attempt since its last commit."""

    @property
    def metrics(self) -> Mapping[int, Any]: ...  # step -> key -> value (only steps are read)

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


def is_count(value: Any) -> bool:
    """A JSON value that is a count (an int, not a bool, at least 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Routes:
    """The commit state of one run at a destination: its targets and the attempts bound to
    them, under the key ``id`` (the base). A destination's state class adds its own
    fields with `_load` and `dump`."""

    #: the destination's name in the message refusing a state it did not write
    destination: ClassVar[str]

    def __init__(self, run: RunInfo, base: str, state: Mapping[str, Any]) -> None:
        self.base = base
        try:
            valid = self._load_routes(state) and self._load(state)
        except (TypeError, ValueError, AttributeError):
            valid = False
        if not valid:
            raise ExportError(f"run {run.key}: the {self.destination} export state "
                              f"{dict(state)!r} is not one this exporter wrote; pass "
                              "--from-start to export the run again from its start",
                              retryable=False)

    def _load_routes(self, state: Mapping[str, Any]) -> bool:
        base = self.base
        if state and state.get("id") != base:
            return False
        self.targets = [Target(**t) for t in state.get("targets") or []] or [Target(base)]
        self.attempts = {int(a): int(i) for a, i in (state.get("attempts") or {}).items()}
        return (self.targets[0].id == base and self.targets[0].attempt is None
                and all(t.id == f"{base}-a{t.attempt}" for t in self.targets[1:])
                and all(is_count(t.sessions) and (t.last_step is None or (
                    isinstance(t.last_step, int) and not isinstance(t.last_step, bool)))
                        for t in self.targets)
                and all(0 <= i < len(self.targets) for i in self.attempts.values()))

    def _load(self, state: Mapping[str, Any]) -> bool:
        """Read the destination's own fields of `state`; False if they are not its own."""
        return True

    def dump(self) -> dict[str, Any]:
        return {"id": self.base, "targets": [t.dump() for t in self.targets],
                "attempts": {str(a): i for a, i in sorted(self.attempts.items())}}

    def uncommitted_sessions(self, directory: Path,
                             session_of: Callable[[str], tuple[str, int] | None]
                             ) -> list[tuple[str, str, int]]:
        """(name, target id, its committed sessions) of each session in `directory` that
        no commit counts: of a target at or past its committed count, or of a target no
        commit knows. `session_of` reads (target id, session number) from a name."""
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ExportError(f"cannot list {directory}: {exc.strerror or exc}",
                              retryable=True) from exc
        found = []
        for name in names:
            session = session_of(name)
            if session is not None:
                committed = self.committed_sessions(session[0])
                if session[1] >= committed:
                    found.append((name, session[0], committed))
        return found

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


class Collecting(Generic[P]):
    """What each open run collected per attempt since its last commit (the loop sends
    it again after a reopening, so `open` starts empty)."""

    def __init__(self, new: Callable[[], P]) -> None:
        self._new = new
        self._runs: dict[str, dict[int | None, P]] = {}

    def open(self, key: str) -> None:
        self._runs[key] = {}

    def pending(self, key: str) -> dict[int | None, P]:
        """Per attempt (None: records of no one attempt) what run `key` collected."""
        pending = self._runs.get(key)
        if pending is None:
            raise RuntimeError(f"run {key} is not open: call open_run() first")
        return pending

    def add(self, key: str, records: pa.Table, add: Callable[[P, pa.Table], None]) -> None:
        pending = self.pending(key)
        for attempt, part in by_attempt(records):
            add(pending.setdefault(attempt, self._new()), part)

    def committed(self, key: str) -> None:
        self._runs[key] = {}

    def close(self, key: str | None = None) -> None:
        """Forget run `key`, or every run."""
        if key is None:
            self._runs.clear()
        else:
            self._runs.pop(key, None)


def attempt_label(run: RunInfo, target: Target) -> tuple[str, tuple[str, ...]]:
    """The destination run's display name and the tags it adds to the run's own: a
    resumed attempt's run is ``<name> (attempt N)``, tagged ``attempt-N``."""
    name = run.name or run.run
    if target.attempt is None:
        return name, ()
    return f"{name} (attempt {target.attempt})", (f"attempt-{target.attempt}",)


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
