"""What `tracklake export DEST` shows while it works.

A one-off export is a long operation like the others: records delivered so far and their
rate (`OperationProgress`; the total is not known before the records are read). A
followed export never ends, so a bar means nothing there: it shows, per run, how far the
destination trails the training instead — the records the last poll found waiting, and
how old the newest delivered record was while records were arriving.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tracklake._cli.progress import LINE_INTERVAL, OperationProgress, stderr_console
from tracklake.exporters import ExportProgress


@dataclass
class RunLag:
    """How far one followed run's destination is behind."""

    exported: int = 0
    waiting: int = 0  # records the last (or current) delivery found waiting
    seconds: float = 0.0  # age of the newest delivered record while records arrived
    catching_up: bool = False  # a delivery is under way
    finished: bool = False

    def state(self) -> str:
        if self.finished:
            return "finished"
        return "catching up" if self.catching_up else "live"


class ExportDisplay:
    """The `progress` callback of the export loop, drawn on stderr."""

    def __init__(self, name: str, *, follow: bool, quiet: bool = False,
                 console: Console | None = None, interval: float = LINE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.what = f"export {name}" + (" --follow" if follow else "")
        self.follow = follow
        self.quiet = quiet
        self.console = console or stderr_console()
        self.interval = interval
        self.clock = clock
        self.wall = wall
        self.lags: dict[str, RunLag] = {}
        self._operation = OperationProgress(self.what, "records", quiet=quiet,
                                            console=self.console, interval=interval,
                                            clock=clock)
        self._delivered_before = 0  # records of the deliveries already over
        self._live: Live | None = None
        self._last_lines = clock()

    def __enter__(self) -> ExportDisplay:
        if not self.follow:
            self._operation.__enter__()
        elif not self.quiet and self.console.is_terminal:
            self._live = Live(self.table(), console=self.console, auto_refresh=False)
            self._live.start()
        self._last_lines = self.clock()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.follow:
            self._operation.__exit__(kind, exc, tb)
        elif self._live is not None:
            self._live.stop()

    def __call__(self, p: ExportProgress) -> None:
        if not self.follow:
            done = self._delivered_before + p.sent
            if p.delivered:
                self._delivered_before = done
            self._operation(done, None, f"{p.run} (run {p.index} of {p.runs})")
            return
        lag = self.lags.setdefault(p.run, RunLag())
        lag.exported, lag.waiting, lag.finished = p.records, p.sent, p.finished
        lag.catching_up = not p.delivered
        arriving = p.sent > 0 or not p.delivered
        lag.seconds = (max(self.wall() - p.newest_us / 1e6, 0.0)
                       if arriving and p.newest_us is not None else 0.0)
        if self.quiet:
            return
        if self._live is not None:
            self._live.update(self.table(), refresh=True)
            return
        now = self.clock()
        if now - self._last_lines >= self.interval or (p.finished and p.delivered):
            self._last_lines = now
            for line in self.lines():
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def lines(self) -> list[str]:
        """One plain line per followed run, for logs."""
        return [f"tracklake {self.what}: {run}: {lag.exported:,} records exported, "
                + ("finished, nothing behind" if lag.finished else
                   f"{lag.waiting:,} behind at the last poll, {lag.seconds:.1f} s behind, "
                   f"{lag.state()}") for run, lag in sorted(self.lags.items())]

    def table(self) -> Table:
        """The per-run lag table drawn on a terminal."""
        table = Table(title=f"tracklake {self.what}", title_justify="left")
        for column in ("run", "exported", "behind (records)", "behind (s)", "state"):
            table.add_column(column, justify="left" if column in ("run", "state")
                             else "right")
        for run, lag in sorted(self.lags.items()):
            behind = ("0", "-") if lag.finished else (f"{lag.waiting:,}",
                                                       f"{lag.seconds:.1f}")
            table.add_row(run, f"{lag.exported:,}", *behind, lag.state())
        return table
