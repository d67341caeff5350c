"""Which files of a store a backup or restore takes: every file worth keeping, or those of
the selected projects and runs plus the blobs their artifact records name."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tracklake._format.segment import EOS
from tracklake._ops.backup.manifest import MANIFEST, run_of
from tracklake._ops.backup.paths import backed_up

#: Top-level folders never backed up: retention's trash, fsck's quarantine, and the
#: store's own record of its backups (it changes with every backup).
SKIPPED_DIRS = frozenset({"trash", "quarantine", "backups"})


@dataclass(frozen=True)
class Selection:
    """Projects and runs (``RUN`` or ``PROJECT/RUN``) to take; empty means everything."""

    projects: frozenset[str] = frozenset()
    runs: frozenset[str] = frozenset()

    @classmethod
    def of(cls, projects: Iterable[str] = (), runs: Iterable[str] = ()) -> Selection:
        return cls(frozenset(projects), frozenset(runs))

    @property
    def everything(self) -> bool:
        return not self.projects and not self.runs

    def takes_run(self, key: str) -> bool:
        """True if the run ``project/run`` is selected."""
        project, _, run = key.partition("/")
        if self.projects and project not in self.projects:
            return False
        return not self.runs or key in self.runs or run in self.runs

    def takes(self, rel: str, blob_runs: Iterable[str] | None = None) -> bool:
        """True if the store file `rel` is selected; a blob is when one of `blob_runs`
        (the runs naming it; None if unknown) is."""
        if self.everything:
            return True
        key = run_of(rel)
        if key is not None:
            return self.takes_run(key)
        if rel.startswith("blobs/"):
            return blob_runs is None or any(self.takes_run(k) for k in blob_runs)
        return "/" not in rel  # the store's own files (its policy), whatever the selection


def store_files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file of the store worth keeping (the
    allow-list of `paths.backed_up`), in path order; links, FIFOs and devices are never
    followed or read (fsck reports them)."""
    base = os.fspath(root)
    for dirpath, dirnames, names in os.walk(base):
        rel_dir = dirpath[len(base) + 1:]
        top = not rel_dir
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and not (top and d in SKIPPED_DIRS))
        for name in sorted(names):
            if name.startswith(".") or (top and name == MANIFEST):
                continue  # temporaries and claims of writers, compaction, retention
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not backed_up(rel):
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue  # compacted or removed since the listing
            if stat.S_ISREG(st.st_mode):
                yield rel, st


def is_unsealed_segment(path: Path, size: int) -> bool:
    """True for a segment a writer may still append to (no end-of-stream marker yet)."""
    if not path.name.endswith(".arrows"):
        return False
    try:
        with open(path, "rb") as f:
            f.seek(max(0, size - len(EOS)))
            return f.read(len(EOS)) != EOS
    except FileNotFoundError:
        return False


#: The selection of the whole store.
EVERYTHING = Selection()
