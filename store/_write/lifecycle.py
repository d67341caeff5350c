"""Process exit: flush and finish live runs at exit, on an uncaught exception and on SIGTERM."""

from __future__ import annotations

import atexit
import signal
import sys
import threading
import weakref
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracklake._write.run import Run

_live: weakref.WeakSet[Run] = weakref.WeakSet()
_installed = False
_uncaught = False
_previous_excepthook = sys.excepthook
_previous_sigterm: Any = None


def track(run: Run) -> None:
    global _installed
    _live.add(run)
    if not _installed:
        _installed = True
        atexit.register(_at_exit)
        sys.excepthook = _excepthook
        _install_sigterm()


def forget(run: Run) -> None:
    _live.discard(run)


def finish_all(status: str) -> None:
    for run in list(_live):
        run.finish(status)


def _at_exit() -> None:
    finish_all("failed" if _uncaught else "finished")


def _excepthook(exc_type: type[BaseException], exc: BaseException,
                tb: TracebackType | None) -> None:
    global _uncaught
    _uncaught = True
    _previous_excepthook(exc_type, exc, tb)


def _install_sigterm() -> None:
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    _previous_sigterm = signal.getsignal(signal.SIGTERM)
    if _previous_sigterm is signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    finish_all("killed")
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    else:  # the default action: terminate, as if we had not been here
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
