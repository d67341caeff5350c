"""Which runs an exporter exports: a project, run ids, tags, everything, or those since."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path

from tracklake.exporters._protocol import RunInfo
from tracklake.read import RunRecord, effective_status, list_runs


@dataclass(frozen=True)
class Selection:
    """Runs to export. With nothing set, nothing is selected (`all_runs` must be explicit)."""

    project: str | None = None
    runs: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    all_runs: bool = False
    since: _dt.datetime | None = None  # runs started at or after this moment

    def is_empty(self) -> bool:
        return not (self.project or self.runs or self.tags or self.all_runs or self.since)

    def matches(self, record: RunRecord) -> bool:
        if self.project and record.project != self.project:
            return False
        if self.runs and record.run not in self.runs:
            return False
        first = record.attempts[0]
        if self.tags and not set(self.tags) <= set(first.get("tags") or ()):
            return False
        if self.since is not None:
            started = _dt.datetime.fromisoformat(first["started_at"])
            since = self.since if self.since.tzinfo else self.since.replace(
                tzinfo=_dt.timezone.utc)
            if started < since:
                return False
        return True

    def describe(self) -> str:
        """The selection as command-line options."""
        parts = [f"--project {self.project}"] if self.project else []
        parts += [f"--run {r}" for r in self.runs] + [f"--tag {t}" for t in self.tags]
        if self.since is not None:
            parts.append(f"--since {self.since.isoformat()}")
        return " ".join(parts) or ("--all" if self.all_runs else "(nothing)")

    def unmatched(self, root: Path) -> str | None:
        """What of this selection matches no run of the store at `root`, in words (None
        when every run id asked for exists and at least one run matches)."""
        chosen = [r for r in list_runs(root, self.project) if self.matches(r)]
        missing = [r for r in self.runs if r not in {c.run for c in chosen}]
        if missing:
            where = f" in project {self.project}" if self.project else ""
            return f"no run {', '.join(missing)}{where} (matching {self.describe()})"
        return None if chosen else f"no run matches {self.describe()}"


def run_info(record: RunRecord, now: float | None = None) -> RunInfo:
    """A destination's view of a run, from its attempt files."""
    now = time.time() if now is None else now
    latest = max(record.attempt_numbers)
    current = [a for a in record.attempts if a["attempt"] == latest]
    statuses = {effective_status(a, latest, now) for a in current}
    status = next((s for s in ("running", "crashed", "failed", "killed") if s in statuses),
                  "finished")
    rank0 = min(current, key=lambda a: a["rank"])
    return RunInfo(
        project=record.project, run=record.run, name=rank0.get("name"), status=status,
        attempts=latest, ranks=tuple(record.ranks), tags=tuple(rank0.get("tags") or ()),
        started_at=record.attempts[0].get("started_at"),
        config=dict(rank0.get("config") or {}), identity=dict(rank0.get("identity") or {}))


def select_runs(root: Path, selection: Selection) -> list[RunInfo]:
    """The selected runs as they are now; with run ids, only their directories are
    listed (a follower of one run must not walk the whole store on every pass)."""
    now = time.time()
    if selection.runs:
        records = [r for run in dict.fromkeys(selection.runs)
                   for r in list_runs(root, selection.project, run)]
        records.sort(key=lambda r: (r.project, r.run))
    else:
        records = list_runs(root, selection.project)
    return [run_info(r, now) for r in records if selection.matches(r)]
