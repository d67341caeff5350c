"""Progress of long commands (export, compact, pack, unpack, backup, restore, fsck, retain).

The operations report through a plain callback, ``progress(done, total, note)``, in a
unit of their own (streams, runs, files, records); this module shows it on stderr, so
that what a command prints on stdout stays what it was:

- on a terminal, a rich progress bar: what is being done, done/total, rate, time left
  (`progress_bar`, fitted to the terminal's width);
- anywhere else (CI logs, ``nohup``, a pipe), a plain line every few seconds and one at
  the end, since a bar redrawn with escape codes makes an unreadable log;
- with ``--quiet``, nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # rich is imported when a command draws: every command starts fast
    from rich.console import Console
    from rich.progress import Progress

#: Seconds between two plain progress lines when stderr is not a terminal.
LINE_INTERVAL = 5.0

quiet_option = click.option(
    "-q", "--quiet", is_flag=True,
    help="Print nothing but errors and warnings (no progress, no summary).")


def stderr_console() -> Console:
    """The console progress is drawn on: stderr, whose terminal decides bar or lines."""
    from rich.console import Console

    return Console(stderr=True)


class OperationProgress:
    """Shows how far one operation is; call it as ``progress(done, total, note)``.

    `done` counts units from the start (it never goes back); `total` is None while
    unknown; `note` says what is being worked on now (a run, a file).
    """

    def __init__(self, what: str, unit: str, *, quiet: bool = False,
                 console: Console | None = None, interval: float = LINE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.unit = unit
        self.quiet = quiet
        self.console = console or stderr_console()
        self.interval = interval
        self.clock = clock
        self.done = 0
        self.total: int | None = None
        self.note = ""
        self._started = clock()
        self._last_line = self._started
        self._bar: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> OperationProgress:
        self._started = self._last_line = self.clock()
        if not self.quiet and self.console.is_terminal:
            from tracklake._cli.progress_bar import progress_bar

            self._bar = progress_bar(self.unit, self.console)
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=None, note="")
        return self

    def __call__(self, done: int, total: int | None = None, note: str = "") -> None:
        self.done, self.total, self.note = done, total, note
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total, note=note)
            return
        now = self.clock()
        if now - self._last_line >= self.interval:
            self._last_line = now
            self.console.print(self.line(now), markup=False, highlight=False,
                               soft_wrap=True)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
            return
        if not self.quiet and kind is None:
            self.console.print(self.line(self.clock(), final=True), markup=False,
                               highlight=False, soft_wrap=True)

    def line(self, now: float, final: bool = False) -> str:
        """The plain line for a log: done/total, percent, rate, time left, note."""
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        count = f"{self.done:,}" + (f"/{self.total:,}" if self.total is not None else "")
        text = f"tracklake {self.what}: {count} {self.unit}"
        if final:
            return f"{text} done in {elapsed:.1f} s"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        text += f", {rate:,.1f} {self.unit}/s"
        if self.total is not None and rate > 0 and self.done < self.total:
            text += f", about {(self.total - self.done) / rate:.0f} s left"
        return text + (f" - {self.note}" if self.note else "")
