"""Walking a store's `name=value` directories: streams per kind, rank directories of runs.

Only real directories are walked: a symbolic link by a `name=value` name (or a kind's
directory that is one) is never followed, so no read, write or delete leaves the store
through it; fsck reports it. Paths stay relative POSIX strings while walking and are
joined to the root only to list a directory, because a `Path` per directory walked
costs more than listing it; the same walk serves a local directory and a store in an
object store (`location.listdir_at`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tracklake._format import KINDS, StreamId
from tracklake._read.location import listdir_at, subdirs_at, through_no_link


def names_in(root: Path, rel: str) -> list[str]:
    """The names in directory `rel` of `root`; none if it is gone (pruned since it was
    listed) or is not a directory."""
    try:
        return listdir_at(root, rel)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subdirs(root: Path, rel: str, name: str, value: str | None) -> list[tuple[str, str]]:
    """(value, relative path) of the `name=value` directories in `rel` (only `value` if
    given); none if `rel` does not exist. Paths stay strings while walking: a `Path` per
    directory would cost more than listing it."""
    if value is not None:
        named = f"{rel}/{name}={value}"
        return [(value, named)] if through_no_link(root, named) else []
    prefix = f"{name}="
    try:
        names = subdirs_at(root, rel)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [(n[len(prefix):], f"{rel}/{n}") for n in names if n.startswith(prefix)]


#: The store's own directories beside the kinds (some hold ``project=`` directories too).
_NOT_KINDS = frozenset({"runs", "pins", "blobs", "exports", "backups", "trash",
                        "quarantine"})


def _real_subdirs(root: Path, rel: str) -> list[str]:
    try:
        return subdirs_at(root, rel)
    except (FileNotFoundError, NotADirectoryError):
        return []


def unknown_kinds(root: Path) -> list[str]:
    """The directories at the top of the store that hold streams (``project=`` below
    them) of a record kind this tracklake does not know: a newer format's kind, which it
    neither reads nor copies (docs/format.md, "Versioning")."""
    found = []
    try:
        names = subdirs_at(root, ".")
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        if name not in KINDS and name not in _NOT_KINDS and not name.startswith((".", "_")) \
                and any(n.startswith("project=") for n in _real_subdirs(root, name)):
            found.append(name)
    return sorted(found)


def refuse_unknown_kinds(root: Path, what: str) -> None:
    """Raise StoreError if the store holds a kind this tracklake does not know: `what`
    (a backup, a pack) would leave its records out without a word."""
    from tracklake._errors import StoreError
    from tracklake._format import FORMAT_VERSION

    unknown = unknown_kinds(root)
    if unknown:
        raise StoreError(
            f"{root} holds records of kind {', '.join(map(repr, unknown))}, which this "
            f"tracklake (store format {FORMAT_VERSION}) does not know: a newer tracklake "
            f"wrote them, and {what} would leave them out; upgrade tracklake")


def rank_dirs(root: Path, base: str, project: str | None, run: str | None,
              skip_runs: frozenset[tuple[str, str]] = frozenset(),
              runs: frozenset[tuple[str, str]] | None = None
              ) -> Iterator[tuple[str, str, int, str]]:
    """(project, run, rank, relative path) of each `project=/run=/rank=` directory under
    directory `base` of `root`, but of no run in `skip_runs` (their directories are not
    listed); with `runs`, of those (project, run) alone, whose directories are looked up
    by name (a project of a million runs is not listed)."""
    if runs is not None:
        for p, r in sorted(runs):
            if project not in (None, p) or run not in (None, r) or (p, r) in skip_runs:
                continue
            for _, pdir in _subdirs(root, base, "project", p):
                for _, rdir in _subdirs(root, pdir, "run", r):
                    for rank, rankdir in _subdirs(root, rdir, "rank", None):
                        if rank.isdigit():
                            yield p, r, int(rank), rankdir
        return
    for p, pdir in _subdirs(root, base, "project", project):
        left = _subdirs(root, pdir, "run", run) if run is not None or not skip_runs else \
            _runs_left(root, pdir, p, skip_runs)
        for r, rdir in left:
            if (p, r) in skip_runs:
                continue
            for rank, rankdir in _subdirs(root, rdir, "rank", None):
                if rank.isdigit():
                    yield p, r, int(rank), rankdir


#: `_runs_left` of the last project directories listed: their names, the runs skipped,
#: and what was left (a 10,000-run project: 5 ms a question to find none left; as many
#: as listings are kept, for a store of many projects).
_left_before: dict[tuple[str, str], tuple[list[str], frozenset[tuple[str, str]],
                                          list[tuple[str, str]]]] = {}
_LEFT_BEFORE = 8192


def _runs_left(root: Path, pdir: str, project: str,
               skip_runs: frozenset[tuple[str, str]]) -> list[tuple[str, str]]:
    """`_subdirs(root, pdir, "run", None)` but for the runs of `project` in
    `skip_runs`; the answer kept while the directory lists the same names (a kept
    listing gives the very same strings, so comparing them costs little) and
    `skip_runs` is the same object."""
    try:
        names = subdirs_at(root, pdir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    key = (str(root), pdir)
    known = _left_before.get(key)
    if known is not None and known[1] is skip_runs and known[0] == names:
        return known[2]
    left = [(n[4:], f"{pdir}/{n}") for n in names
            if n.startswith("run=") and (project, n[4:]) not in skip_runs]
    if len(_left_before) >= _LEFT_BEFORE:
        _left_before.pop(next(iter(_left_before)))
    _left_before[key] = (names, skip_runs, left)
    return left


def list_streams(root: Path, project: str | None = None, run: str | None = None,
                 kinds: tuple[str, ...] = KINDS,
                 runs: frozenset[tuple[str, str]] | None = None) -> list[StreamId]:
    """Every stream in the store (optionally of one project / run, or of `runs`)."""
    return list(stream_dirs(root, project, run, kinds, runs=runs))


def stream_dirs(root: Path, project: str | None = None, run: str | None = None,
                kinds: tuple[str, ...] = KINDS,
                skip_runs: frozenset[tuple[str, str]] = frozenset(),
                runs: frozenset[tuple[str, str]] | None = None) -> dict[StreamId, str]:
    """Every stream in the store (optionally of one project / run, or of `runs`; none of
    `skip_runs`), sorted, with its directory relative to `root` as walked (so that nobody
    joins it again)."""
    found: list[tuple[StreamId, str]] = []
    for kind in kinds:
        for p, r, rank, rankdir in rank_dirs(root, kind, project, run, skip_runs, runs):
            for attempt, directory in _subdirs(root, rankdir, "attempt", None):
                if attempt.isdigit():
                    found.append((StreamId(p, r, rank, int(attempt), kind), directory))
    found.sort(key=lambda f: (f[0].project, f[0].run, f[0].rank, f[0].attempt, f[0].kind))
    return dict(found)
