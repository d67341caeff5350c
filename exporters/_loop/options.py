"""How an export runs (`ExportOptions`) and what it did (`ExportSummary`, `RunOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tracklake.read import KINDS, ReadProblems


@dataclass
class ExportOptions:
    """How the loop runs; every field has the default the CLI uses."""

    ranks: str = "0"  # a rank number, "all", "mean", "min" or "max"
    kinds: tuple[str, ...] = KINDS
    batch_rows: int = 50_000
    follow: bool = False
    poll_interval: float = 2.0  # seconds between polls while following (events wake sooner)
    #: while following, seconds at least from the end of one pass to the start of the next
    #: (at most `poll_interval`): file events in between are coalesced into one pass
    pass_gap: float = 0.25
    retry_initial: float = 1.0
    retry_max: float = 60.0
    give_up_after: float | None = 600.0  # seconds of retrying a run before giving up; None: never
    state_dir: Path | None = None  # default: ROOT/exports/<destination>
    #: while following, seconds at least between two deliveries to a live run (None: the
    #: destination's `commit_interval`, else 0); a finished run is delivered at once
    commit_interval: float | None = None
    #: while following, the process the run is followed for (a trainer that started this
    #: exporter): once it has exited, deliver what the store holds and stop, even if the
    #: run was not finished (a SIGKILLed trainer never writes its final status)
    while_pid: int | None = None
    #: forget what was exported of the selected runs (their export states) once, before
    #: their first delivery, and export them again from their start
    from_start: bool = False


@dataclass(frozen=True)
class ExportProgress:
    """Where an export is, handed to the `progress` callback after every commit and at
    the end of every delivery of a run (also when nothing was new)."""

    run: str  # project/run
    index: int  # this run's place in the current pass over the selected runs (from 1)
    runs: int  # runs selected in the current pass
    records: int  # records of this run delivered and committed so far, all exports
    sent: int  # records delivered by the current delivery so far: what was waiting
    delivered: bool  # the current delivery is over (everything read is committed)
    newest_us: int | None  # time of the newest record delivered (µs since the epoch)
    finished: bool  # the run ended and its end was delivered
    following: bool


@dataclass
class RunOutcome:
    run: str  # project/run
    records: int = 0
    finished: bool = False
    error: str | None = None


@dataclass
class ExportSummary:
    destination: str
    runs: dict[str, RunOutcome] = field(default_factory=dict)
    problems: ReadProblems = field(default_factory=ReadProblems)
    #: runs (project/run) left unfinished at the destination because the process they were
    #: followed for (`ExportOptions.while_pid`) exited without finishing them
    abandoned: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(o.records for o in self.runs.values())

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.runs.values() if o.error]

    def __str__(self) -> str:
        lines = [f"{self.destination}: {self.records} records from {len(self.runs)} runs"]
        for o in self.runs.values():
            state = "error: " + o.error if o.error else ("finished" if o.finished else "live")
            lines.append(f"  {o.run}: {o.records} records, {state}")
        for key in self.abandoned:
            lines.append(f"  {key}: the process writing it exited without finishing it; "
                         "the run stays unfinished at the destination "
                         "until an export sees it ended (crashed, or a new attempt)")
        for path, nbytes in self.problems.torn:
            lines.append(f"  note: {path}: a torn tail of {nbytes} bytes was skipped")
        for path, why in self.problems.damaged:
            lines.append(f"  warning: {path}: {why}; the rest of that segment was not "
                         "exported (later segments were)")
        for path in self.problems.foreign:
            lines.append(f"  warning: {path}: not a tracklake file; ignored")
        return "\n".join(lines)
