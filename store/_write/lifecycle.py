"""Process exit: flush and finish live runs at exit, on an uncaught exception and on SIGTERM.

The SIGTERM handler takes no lock and waits for nothing: it may interrupt the main thread
anywhere, including inside a `RankWriter` lock or in `finish()`. It only wakes the
finisher thread (one byte down a pipe) and returns. That thread finishes every live run
(status `killed`) and then signals the main thread again; the second time, the handler
does what SIGTERM would have done without tracklake: the previous handler, or the default
action (the process ends, killed by SIGTERM). Between the two, a call on a finishing run
waits for that instead of raising into the training loop.

The kernel may deliver a process's SIGTERM to any of its threads. Python runs the handler
on the main thread only, once that thread runs Python code again: a main thread blocked
in a read (stdin, a socket, a queue) would never run it, and the process would neither
finish its runs nor end. So the pipe is also Python's wakeup fd (`signal.set_wakeup_fd`),
to which the interpreter's C handler writes the signal's number from whichever thread
took it: the finisher wakes on that byte too, finishes the runs and then signals the main
thread itself, which interrupts the read. If the program already has a wakeup fd (an
asyncio loop's), it is left in place, and only the handler wakes the finisher.
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
_wakeup_read: int | None = None  # its read end
_is_wakeup_fd = False  # the write end is Python's wakeup fd (set by this module)
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
    global _previous_sigterm, _pid, _wakeup, _wakeup_read, _is_wakeup_fd
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # as a wakeup fd must be: a signal never blocks
    threading.Thread(target=_finisher, args=(read_end,), name="tracklake-sigterm",
                     daemon=True).start()
    _previous_sigterm, _pid, _wakeup, _wakeup_read = previous, os.getpid(), write_end, read_end
    signal.signal(signal.SIGTERM, _on_sigterm)
    _is_wakeup_fd = _take_wakeup_fd(write_end)


def _take_wakeup_fd(fd: int) -> bool:
    """Make `fd` Python's wakeup fd unless the program has one; True if it now is."""
    theirs = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    if theirs == -1:
        return True
    signal.set_wakeup_fd(theirs)  # back, with the default warning (as asyncio sets it)
    return False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """No lock, no waiting: hand the work to the finisher thread, or, once it is done (or
    in a forked child, whose runs belong to its parent), act as if we were not here."""
    global _signalled
    if _pid != os.getpid() or _finished_for_signal.is_set() or _wakeup is None:
        _previous_action(signum, frame)
    elif not _signalled:
        _signalled = True
        with contextlib.suppress(OSError):  # full: the finisher has bytes to wake on
            os.write(_wakeup, b"\x00")


def _previous_action(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    else:  # the default action: terminate, as if we had not been here
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


def _finisher(read_end: int) -> None:
    """Wait for the handler's byte (or the wakeup fd's SIGTERM), finish every live run,
    then signal the main thread."""
    global _signalled
    while not _woken_for_sigterm(read_end):
        pass
    _signalled = True
    try:
        finish_all("killed", timeout=SIGTERM_FINISH_SECONDS)
    finally:
        _finished_for_signal.set()
        try:  # to the main thread, so that a blocking call there is interrupted
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        except (OSError, ValueError):
            os.kill(os.getpid(), signal.SIGTERM)


def _woken_for_sigterm(read_end: int) -> bool:
    """Read what is in the pipe: True if it says SIGTERM reached a handler of ours (the
    handler's zero byte, or the signal's number while our handler is the one installed;
    a program may have replaced it after `init()`, and then SIGTERM is its business), or
    if the pipe is gone. Other signals' numbers, written to the wakeup fd, are dropped."""
    try:
        got = os.read(read_end, 512)
    except InterruptedError:
        return False
    except OSError:
        return True
    if not got or 0 in got:
        return True
    return signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) is _on_sigterm


def _after_fork_in_child() -> None:
    """A forked child has no finisher thread and does not own its parent's runs: a signal
    it takes must not write to the parent's pipe (they share it)."""
    global _installed, _live, _signalled, _finished_for_signal, _wakeup, _wakeup_read
    global _is_wakeup_fd
    try:
        if _is_wakeup_fd:
            signal.set_wakeup_fd(-1)
    except ValueError:  # not this process's main thread: the fd stays, open, never reused
        pass
    else:
        for fd in (_wakeup, _wakeup_read):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
    _live = weakref.WeakSet()
    _installed = _signalled = _is_wakeup_fd = False
    _wakeup = _wakeup_read = None
    _finished_for_signal = threading.Event()


os.register_at_fork(after_in_child=_after_fork_in_child)
