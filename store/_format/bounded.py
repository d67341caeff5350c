"""Reads of the store that give up on a file system that no longer answers (a hung
network mount), instead of waiting for it forever.

A thread blocked in a system call on a stuck mount cannot be stopped, so `bounded` runs
the work in a daemon worker thread and waits for it: it abandons the worker, raising
`NoAnswerError` naming the file or directory last asked for, once the work has made no
progress for `read_timeout()` seconds. Progress is a file or directory asked for
(`touch`, called by the low-level reads before each access that can block) or CPU time
used by the process (a long query computing); time spent where the work waits on
something else than the store (`elsewhere`: a destination, a pipe) does not count. The
bound is per operation, not per system call: a `touch` costs a context-variable lookup,
and one hand-off to a worker (tens of microseconds) serves a whole listing or file.

An abandoned worker stays blocked until the mount answers (or the process ends): it is
a daemon thread, which interpreter shutdown does not wait for, and the kernel ends it
with the process (NFS, FUSE and Lustre waits are killable).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tracklake._errors import NoAnswerError
from tracklake._format.seconds import seconds_from_env

T = TypeVar("T")

#: How long a read of the store may go without an answer, in seconds (0: no bound).
READ_TIMEOUT_ENV = "TRACKLAKE_READ_TIMEOUT"
READ_TIMEOUT_SECONDS = 30.0

#: CPU time the process must use per second waited for the work to count as computing.
_BUSY_SHARE = 0.05


def read_timeout() -> float | None:
    """Seconds a read may go without an answer (`READ_TIMEOUT_SECONDS`, or the setting);
    None where the setting is 0 (reads wait as long as the file system does)."""
    return seconds_from_env(READ_TIMEOUT_ENV, READ_TIMEOUT_SECONDS) or None


class _Watch:
    """What the watched work last asked of the file system, and how often it asked."""

    __slots__ = ("away", "path", "touches")

    def __init__(self, path: object) -> None:
        self.path = path
        self.touches = 0
        self.away = 0  # > 0 while the work waits on something else than the store


_current: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar(
    "tracklake_read_watch", default=None)


def touch(path: object) -> None:
    """Say that the work is about to ask the file system for `path` (a file or directory
    of the store): progress, and the path named if no answer comes."""
    watch = _current.get()
    if watch is not None:
        watch.path = path
        watch.touches += 1


@contextlib.contextmanager
def elsewhere() -> Iterator[None]:
    """Time spent in this block (waiting on a destination, a pipe, a user) is not a
    read of the store: it never counts against the bound."""
    watch = _current.get()
    if watch is None:
        yield
        return
    watch.away += 1
    try:
        yield
    finally:
        watch.away -= 1
        watch.touches += 1


class _Job:
    __slots__ = ("call", "context", "done", "error", "result")

    def __init__(self, call: Callable[[], Any], context: contextvars.Context) -> None:
        self.call = call
        self.context = context
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.context.run(self.call)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            self.error = exc
        finally:
            self.done.set()


class _Worker:
    """A daemon thread running one job at a time; kept for the next job unless
    abandoned (still blocked in its job)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tracklake-read", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            job.run()
            del job


#: Called when the thread waiting for bounded work is interrupted (`on_interrupt`), and
#: how long it then waits for the work to end.
_stoppers: list[Callable[[], None]] = []
STOP_WAIT_SECONDS = 10.0


def on_interrupt(stop: Callable[[], None]) -> None:
    """Have `stop()` called (from the interrupted thread) to end running work when the
    thread waiting for a `bounded` call is interrupted: a query stops at once."""
    if stop not in _stoppers:
        _stoppers.append(stop)


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _forget_workers() -> None:
    """In a forked child: none of the parent's threads run there, so its idle workers
    would never take a job (every read would wait out the bound), and a lock another
    thread held at the fork would stay held."""
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_workers)


def bounded(call: Callable[[], T], where: object) -> T:
    """`call()`, given up with `NoAnswerError` once it has made no progress (see the
    module) for `read_timeout()` seconds; it names the path last asked for (`where`,
    before any). Within a bounded call, just `call()`: the outer bound holds."""
    seconds = read_timeout()
    if seconds is None or _current.get() is not None:
        return call()
    watch = _Watch(where)
    context = contextvars.copy_context()
    context.run(_current.set, watch)
    job = _Job(call, context)
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
    worker.jobs.put(job)
    try:
        _wait(job, watch, seconds)
    except NoAnswerError:
        raise  # the worker is blocked in the file system: abandoned
    except BaseException:
        # Ctrl-C or an exit while the work computes: stop it and let it end before this
        # thread goes on, so that interpreter shutdown never meets the worker inside a
        # library's native code (a daemon thread ended there aborts the process)
        for stop in _stoppers:
            stop()
        job.done.wait(STOP_WAIT_SECONDS)
        raise
    with _idle_lock:
        _idle.append(worker)
    if job.error is not None:
        error, job.error = job.error, None
        raise error
    result: T = job.result
    return result


def _wait(job: _Job, watch: _Watch, seconds: float) -> None:
    """Return once `job` is done; NoAnswerError once it made no progress for `seconds`."""
    step = min(seconds / 4, 1.0)
    touches, cpu = watch.touches, time.process_time()
    idle_since = time.monotonic()
    while not job.done.wait(step):
        now, used = time.monotonic(), time.process_time()
        if watch.touches != touches or watch.away or used - cpu >= _BUSY_SHARE * step:
            idle_since = now
        elif now - idle_since >= seconds:
            raise NoAnswerError(watch.path, seconds)
        touches, cpu = watch.touches, used


def bounded_iter(items: Iterable[T], where: object) -> Iterator[T]:
    """The items of `items`, each one asked for as a `bounded` call."""
    iterator = iter(items)
    done = object()
    while True:
        item = bounded(lambda: next(iterator, done), where)
        if item is done:
            return
        yield item  # type: ignore[misc]  # not `done`
