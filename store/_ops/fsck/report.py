"""What fsck found: each problem with its path, what is lost and what to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tracklake._format import StreamId
from tracklake._format.bounded import touch


@dataclass
class Problem:
    path: Path
    what: str  # what is wrong
    lost: str  # what a reader does not get because of it
    todo: str  # what to do
    repairable: bool = True
    repaired: str | None = None  # what --repair did
    stream: StreamId | None = None  # the stream of a part repair can rebuild

    def line(self, root: Path) -> str:
        rel = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        done = f" -> repaired: {self.repaired}" if self.repaired else ""
        return f"{rel}: {self.what}; lost: {self.lost}; {self.todo}{done}"


@dataclass
class FsckReport:
    problems: list[Problem] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)  # kind of file -> count
    bytes: int = 0

    @property
    def clean(self) -> bool:
        return not self.problems

    def count(self, what: str, path: Path) -> bool:
        """Count a file checked; False if it vanished since it was listed (compaction or
        retention at work: nothing to check)."""
        touch(path)
        try:
            size = path.lstat().st_size
        except FileNotFoundError:
            return False
        self.checked[what] = self.checked.get(what, 0) + 1
        self.bytes += size
        return True

    def add(self, other: FsckReport) -> None:
        """Take in what another report of the same check found."""
        self.problems.extend(other.problems)
        for what, n in other.checked.items():
            self.checked[what] = self.checked.get(what, 0) + n
        self.bytes += other.bytes
