"""Process exit: flush and finish live runs at exit, on an uncaught exception and on SIGTERM.

The SIGTERM handler takes no lock and waits for nothing: it may interrupt the main thread
anywhere, including inside a `RankWriter` lock or in `finish()`. It only wakes the
finisher thread (one byte down a pipe) and returns. That thread finishes every live run
(status `killed`) and then signals the main thread again; the second time, the handler
does what SIGTERM would have done without tracklake: the previous handler, or the default
action (the process ends, killed by SIGTERM). Between the two, a call on a finishing run
waits for that instead of raising into the training loop.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracklake._write.finish import RunHandle

_live: weakref.WeakSet[RunHandle] = weakref.WeakSet()
_installed = False
_uncaught = False
_previous_excepthook = sys.excepthook
_previous_sigterm: Any = None
_pid = 0  # the process the handler and the finisher thread belong to
_wakeup: int | None = None  # write end of the finisher thread's pipe
_signalled = False  # a SIGTERM arrived: the finisher thread is finishing the runs
_finished_for_signal = threading.Event()  # ... and is done
#: How long finishing may take after SIGTERM: well within the 30 s that Slurm (KillWait) and
#: Kubernetes (terminationGracePeriodSeconds) wait by default before SIGKILL.
SIGTERM_FINISH_SECONDS = 20.0


def track(run: RunHandle) -> None:
    global _installed
    _live.add(run)
    if not _installed:
        _installed = True
        atexit.register(_at_exit)
        sys.excepthook = _excepthook
        _install_sigterm()


def live_runs() -> list[RunHandle]:
    """The runs of this process that are not finished."""
    return [run for run in _live if not run.finished]


def forget(run: RunHandle) -> None:
    _live.discard(run)


def finish_all(status: str, timeout: float = 30.0) -> None:
    for run in list(_live):
        run.finish(status, timeout=timeout)


def wait_if_terminating(timeout: float = 60.0) -> None:
    """After SIGTERM, block a call on a finishing run until the signal's action has run
    (which usually ends the process) instead of raising into the training loop."""
    if _signalled and _pid == os.getpid():
        _finished_for_signal.wait(timeout)


def _at_exit() -> None:
    finish_all("failed" if _uncaught else "finished")


def _excepthook(exc_type: type[BaseException], exc: BaseException,
                tb: TracebackType | None) -> None:
    global _uncaught
    _uncaught = True
    _previous_excepthook(exc_type, exc, tb)


def _install_sigterm() -> None:
    global _previous_sigterm, _pid, _wakeup
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return
    read_end, write_end = os.pipe()
    threading.Thread(target=_finisher, args=(read_end,), name="tracklake-sigterm",
                     daemon=True).start()
    _previous_sigterm, _pid, _wakeup = previous, os.getpid(), write_end
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """No lock, no waiting: hand the work to the finisher thread, or, once it is done (or
    in a forked child, whose runs belong to its parent), act as if we were not here."""
    global _signalled
    if _pid != os.getpid() or _finished_for_signal.is_set() or _wakeup is None:
        _previous_action(signum, frame)
    elif not _signalled:
        _signalled = True
        os.write(_wakeup, b"\x00")


def _previous_action(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    else:  # the default action: terminate, as if we had not been here
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


def _finisher(read_end: int) -> None:
    """Wait for the handler's byte, finish every live run, then signal the main thread."""
    with contextlib.suppress(OSError):
        os.read(read_end, 1)
    try:
        finish_all("killed", timeout=SIGTERM_FINISH_SECONDS)
    finally:
        _finished_for_signal.set()
        try:  # to the main thread, so that a blocking call there is interrupted
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        except (OSError, ValueError):
            os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    """A forked child has no finisher thread and does not own its parent's runs."""
    global _installed, _live, _signalled, _finished_for_signal
    _live = weakref.WeakSet()
    _installed = _signalled = False
    _finished_for_signal = threading.Event()


os.register_at_fork(after_in_child=_after_fork_in_child)
