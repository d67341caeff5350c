"""Catalogued runs known unchanged without a `stat` of each of their paths.

A question checks each catalogued run's watched paths against the mtimes the catalog
recorded (`RunCatalog.settled`): 70,000 `stat`s at 10,000 runs, about 0.1 s of every
question. A process that asks again (a notebook, the dashboard) can instead be told of
changes: inotify watches on each of those paths report any entry made, removed or
renamed in the run's directories (`DIR_MASK`), and any write to, mtime or link count
set on, removal or rename of its part and attempt files (`FILE_MASK`; watched as files,
so that a write through a hard link from elsewhere is heard too). A run whose paths all
matched after they were watched, and that reported nothing since, is as the catalog
says: it is not `stat`ed again.

Used only where inotify hears every change: a local file system (`LOCAL_FILE_SYSTEMS`;
on NFS, Lustre and the like another host's change makes no event here), from the second
question of a process on a catalog (a command that asks once never pays to watch), with
the watches added in a background thread, never beyond `max_watches()` per process. A
run some of whose paths are not watched (absent, a link, past the limit, removed or
moved since) is `stat`ed by every question as before; an overflow of the event queue
makes every run `stat`ed again once. A forked child starts with no watches: it must not
read its parent's queue.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from tracklake._format.switches import switched_on

try:
    from inotify_simple import INotify, flags
except (ImportError, OSError):  # not Linux, or no inotify in this libc
    INotify = None

#: File systems whose changes, from any process that can make one, reach inotify here.
LOCAL_FILE_SYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "f2fs", "zfs", "bcachefs",
    "jfs", "reiserfs", "overlay"})
#: Watches one process adds at most (each keeps its file's inode in the kernel's memory,
#: about 1 KB, and they count against the user's `fs.inotify.max_user_watches`, shared
#: with editors and tools: at most half of that).
MAX_WATCHES = 131_072

if INotify is not None:
    FILE_MASK = (flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE | flags.DELETE_SELF
                 | flags.MOVE_SELF | flags.DONT_FOLLOW)
    DIR_MASK = (FILE_MASK | flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO
                | flags.ONLYDIR)
    _GONE = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED | flags.UNMOUNT


def max_watches() -> int:
    """`MAX_WATCHES`, or half the user's `fs.inotify.max_user_watches` if less."""
    try:
        with open("/proc/sys/fs/inotify/max_user_watches", encoding="ascii") as f:
            return min(MAX_WATCHES, int(f.read(32)) // 2)
    except (OSError, ValueError):
        return MAX_WATCHES


#: Paths watched between two updates of `QuietRows.ready` (a lock each time).
_READY_EVERY = 512

#: Set to 0 to `stat` every catalogued run's paths at every question, as where no
#: watch can be made.
WATCH_ENV = "TRACKLAKE_WATCH_DIRS"


def dir_watch_wanted() -> bool:
    """Whether questions may be told of changes instead of looking (`WATCH_ENV`, on by
    default)."""
    return switched_on(WATCH_ENV)


def file_system_of(path: str, mountinfo: Sequence[str] | None = None) -> str | None:
    """The type of the file system `path` (absolute, links resolved) is on, by the
    longest mount point above it in `/proc/self/mountinfo`; None if unknown."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                mountinfo = f.read(1 << 22).splitlines()
        except OSError:
            return None
    best, kind = -1, None
    for line in mountinfo:
        fields = line.split()
        if "-" not in fields[6:] or len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        after = fields[fields.index("-", 6) + 1:]
        if not after:
            continue
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), after[0]
    return kind


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of what `path` is now; None if nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class QuietRows:
    """Which rows (runs) of one catalog table are known unchanged: every path matched
    the catalog at a look made once all the run's directories were watched, and none
    of them reported an event since (that look may have been made on an earlier table
    of the same store, for a run recorded there with the same paths and mtimes)."""

    def __init__(self, watch: DirWatch, paths: list[str], owner: np.ndarray,
                 runs: list[tuple[str, str]], recorded: list[object]) -> None:
        self.watch = watch
        self.row_of = dict(zip(paths, owner.tolist(), strict=True))
        self.runs = runs  # (project, run) of each row
        self.recorded = recorded  # what the table records of each row's paths
        self.quiet = np.zeros(len(runs), dtype=bool)
        self.epoch = np.zeros(len(runs), dtype=np.int64)  # bumped by each event of the row
        self.watched = np.ones(len(runs), dtype=bool)  # every path of the row watched
        #: rows before this one have had all their paths watched (or found unwatchable):
        #: the watches are added in the background, row after row
        self.ready = 0

    def look(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(quiet, epochs) as of now (events so far taken in); None if this process may
        not trust them (a forked child, or the watch closed). A row whose watches were
        not all in place yet has the epoch -1, which no row reaches: a look that began
        before its watches never makes it quiet (a change between that look and its
        watch would go unheard)."""
        if not self.watch.drain():
            return None
        with self.watch.lock:
            epochs = self.epoch.copy()
            epochs[self.ready:] = -1
            return self.quiet.copy(), epochs

    def settle(self, matched: np.ndarray, epochs: np.ndarray) -> None:
        """Rows `matched` (indices) had every path as recorded at a look that started
        after `look` gave `epochs`: quiet, unless an event came for one since."""
        with self.watch.lock:
            same = (self.epoch[matched] == epochs[matched]) & self.watched[matched]
            for row in matched[same].tolist():
                self.quiet[row] = True
                self.watch.settled[self.runs[row]] = self.recorded[row]

    def touched(self, path: str | None) -> None:
        row = None if path is None else self.row_of.get(path)
        if path is None:  # the queue overflowed: anything may have changed
            self.quiet[:] = False
            self.epoch += 1
        elif row is not None:
            self.quiet[row] = False
            self.epoch[row] += 1

    def unwatched(self, path: str) -> None:
        row = self.row_of.get(path)
        if row is not None:
            self.watched[row] = False
            self.touched(path)


class DirWatch:
    """This process's inotify instance for one store."""

    def __init__(self) -> None:
        assert INotify is not None
        self.pid = os.getpid()
        self.lock = threading.Lock()
        #: runs found as recorded since their directories were watched: what was recorded
        self.settled: dict[tuple[str, str], object] = {}
        self._inotify = INotify(nonblocking=True)
        self._path_of: dict[int, str] = {}
        self._wd_of: dict[str, int] = {}
        self._run_of: dict[str, tuple[str, str]] = {}
        self._rows: weakref.WeakSet[QuietRows] = weakref.WeakSet()
        self._full = False
        #: the directories above the watched ones (the store, its kinds, their projects)
        #: and what each was when first watched below: one moved away and another put
        #: in its place (a restore) leaves every watch below on the old one
        self._anchors: dict[str, tuple[int, int] | None] = {}

    def rows_for(self, paths: list[str], is_dir: np.ndarray, owner: np.ndarray,
                 runs: list[tuple[str, str]], recorded: list[object],
                 anchors: list[str],
                 published: Callable[[QuietRows], None] | None = None) -> QuietRows:
        """Watch `paths` (absolute; directories where `is_dir`; row `owner[i]`, run
        `runs[owner[i]]`, holds `paths[i]`) of a table recording `recorded[row]` of each
        row's paths, below the directories `anchors`, and the table's `QuietRows`. Rows
        with a path that could not be watched are never quiet; rows recorded as a run
        was when found settled, and not changed since, are. `published` is given the
        `QuietRows` before the first watch is added: with `owner` ascending, its rows
        become usable one after the other (`QuietRows.ready`), not all at the end (70,000
        paths take a second, over which a notebook asks several questions)."""
        quiet = QuietRows(self, paths, owner, runs, recorded)
        with self.lock:
            self._rows.add(quiet)
            for anchor in anchors:
                if anchor not in self._anchors:  # taken before anything below is watched
                    self._anchors[anchor] = _identity(anchor)
        if published is not None:
            published(quiet)
        in_order = bool(np.all(np.diff(owner) >= 0))
        rows = owner.tolist()
        limit = max_watches()
        for i, (path, directory, row) in enumerate(zip(paths, is_dir.tolist(), rows,
                                                       strict=True)):
            if in_order and i % _READY_EVERY == 0 and row > quiet.ready:
                self._ready(quiet, row)  # every path of the rows before `row` is watched
            if path in self._wd_of:
                continue
            if self._full or len(self._wd_of) >= limit:
                quiet.watched[row] = False
                continue
            try:
                wd = self._inotify.add_watch(path, DIR_MASK if directory else FILE_MASK)
            except OSError as exc:  # absent, a link, not what it should be, or no watch left
                self._full = self._full or exc.errno == errno.ENOSPC
                quiet.watched[row] = False
                continue
            except ValueError:  # closed meanwhile (another store's watch took its place)
                quiet.watched[:] = False
                break
            with self.lock:
                self._path_of[wd] = path
                self._wd_of[path] = wd
                self._run_of[path] = runs[row]
        self.drain()
        self._ready(quiet, len(runs))
        return quiet

    def _ready(self, quiet: QuietRows, upto: int) -> None:
        """Rows up to `upto` have all their paths watched: those recorded as their run was
        when found settled, and not changed since, are quiet at once."""
        with self.lock:
            for row in range(quiet.ready, upto):
                if quiet.watched[row] and self.settled.get(quiet.runs[row]) == \
                        quiet.recorded[row]:
                    quiet.quiet[row] = True
            quiet.ready = max(quiet.ready, upto)

    def drain(self) -> bool:
        """Take in the events so far; False if this watch may not be used here."""
        if os.getpid() != self.pid:
            return False
        with self.lock:
            if any(_identity(a) != known for a, known in self._anchors.items()):
                with contextlib.suppress(OSError):
                    self._inotify.close()  # replaced above the watches: watched anew
                return False
            try:
                events = self._inotify.read(timeout=0)
            except ValueError:  # closed: another store's watch took its place
                return False
            except OSError:
                events = [None]  # unreadable: treated as an overflow
            for event in events:
                if event is None or event.mask & flags.Q_OVERFLOW:
                    self.settled.clear()
                    for quiet in self._rows:
                        quiet.touched(None)
                    continue
                path = self._path_of.get(event.wd)
                if path is None:
                    continue
                self.settled.pop(self._run_of.get(path), None)  # type: ignore[arg-type]
                gone = event.mask & _GONE
                if gone:
                    self._path_of.pop(event.wd, None)
                    self._wd_of.pop(path, None)
                for quiet in self._rows:
                    if gone:
                        quiet.unwatched(path)
                    else:
                        quiet.touched(path)
        return True

    def usable(self) -> bool:
        """Whether this process may go on with this watch (not a forked child's, not
        closed for another store's or after what is above it was replaced)."""
        return os.getpid() == self.pid and not self._inotify.closed

    def close(self) -> None:
        with self.lock, contextlib.suppress(OSError):
            self._inotify.close()


_watches: dict[str, DirWatch] = {}
_watches_lock = threading.Lock()
#: Stores watched at once by a process (as many as it keeps catalogs of).
_WATCHED_ROOTS = 2


def watch_for(root: Path) -> DirWatch | None:
    """This process's watch of the store at `root`; None where inotify would miss
    changes (not a local file system) or is not available."""
    if INotify is None:
        return None
    key = os.path.realpath(root)
    with _watches_lock:
        known = _watches.get(key)
        if known is not None and known.usable():
            return known
    if file_system_of(key) not in LOCAL_FILE_SYSTEMS:
        return None
    try:
        made = DirWatch()
    except OSError:  # no inotify instance left for this user
        return None
    with _watches_lock:
        known = _watches.get(key)
        if known is not None and known.usable():  # made meanwhile
            made.close()
            return known
        _watches.pop(key, None)
        while len(_watches) >= _WATCHED_ROOTS:
            _watches.pop(next(iter(_watches))).close()
        _watches[key] = made
    return made


def watching(root: Path) -> DirWatch | None:
    """The watch this process made of the store at `root` already, if any."""
    with _watches_lock:
        known = _watches.get(os.path.realpath(root))
    return known if known is not None and known.usable() else None


def start_watching(root: Path, what: Callable[[], tuple[list[str], np.ndarray, np.ndarray,
                                                       list[tuple[str, str]], list[object],
                                                       list[str]]],
                   done: dict[str, object]) -> None:
    """In a background thread, watch the paths `what()` gives (`DirWatch.rows_for`'s
    arguments, made there too: 70,000 paths take a question 20 ms) and leave their
    `QuietRows` in `done["quiet"]` as soon as it is made, its rows usable as their
    watches are in place (nothing where `watch_for` gives no watch)."""
    def run() -> None:
        watch = watch_for(root)
        if watch is not None:
            watch.rows_for(*what(), published=partial(done.__setitem__, "quiet"))

    threading.Thread(target=run, name="tracklake-dir-watch", daemon=True).start()


def _forget_watches() -> None:
    """In a forked child: the parent's watches are its own (reading their queue here
    would take events from it)."""
    _watches.clear()


def _close_watches() -> None:
    """At exit: this process's inotify instances go with it anyway, but closed here none
    is left to the garbage collector to find open (a `ResourceWarning`)."""
    with _watches_lock:
        for watch in _watches.values():
            if watch.pid == os.getpid():
                watch.close()
        _watches.clear()


os.register_at_fork(after_in_child=_forget_watches)
atexit.register(_close_watches)
