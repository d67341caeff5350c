"""fsck of the files beside the streams: blobs, attempt files, exporter states and the
store's records of its backups."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from tracklake._errors import CursorError, FormatError
from tracklake._format import SCHEMAS, StreamId, blob_path
from tracklake._format.attempt import CRASHED_AFTER_SECONDS, check_attempt
from tracklake._format.bounded import touch
from tracklake._format.checks import is_digest
from tracklake._format.cursor import read_state
from tracklake._format.files import NotRegularFileError, is_regular_file, open_regular
from tracklake._format.store_clock import store_skew_ns
from tracklake._format.temporaries import left_over
from tracklake._ops.backup.ledger import load_record, record_paths
from tracklake._ops.claims import CLAIM_NAMES
from tracklake._ops.fsck.report import FsckReport, Problem
from tracklake._read.blob_refs import blob_refs
from tracklake._read.reader import ReadProblems, list_stream, positions_past_end


def check_special_files(root: Path, report: FsckReport) -> None:
    """Report every symbolic link, FIFO, socket and device inside the store: tracklake
    never follows or opens one (readers and operations skip them), so whatever it stands
    for is not part of the store, and someone put it there."""
    quarantine = root / "quarantine"
    skew = store_skew_ns(root) / 1e9  # temporaries' ages by the store's clock
    for path, mode in _walk(root):
        if stat.S_ISDIR(mode) and path.name in CLAIM_NAMES:
            report.problems.append(Problem(
                path, "a directory where the store keeps a claim file", "nothing, but the "
                "operation that claims this directory refuses to work until it is gone "
                "(tracklake never removes a directory it did not make)", "remove it",
                repairable=False))
            continue
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            if not path.is_relative_to(quarantine):  # moved there by a repair
                _check_temporary(path, report, time.time() + skew)
            continue
        what = "a symbolic link" if stat.S_ISLNK(mode) else (
            "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")
        target = f" to {os.readlink(path)}" if stat.S_ISLNK(mode) else ""
        report.problems.append(Problem(
            path, f"{what}{target} inside the store", "nothing: tracklake never follows "
            "or opens it (it is not part of the store)", "remove it",
            repairable=False))


def _walk(root: Path) -> Iterator[tuple[Path, int]]:
    """(path, mode as `lstat` gives it) of everything below `root`, each directory's
    entries by name, a directory before what it holds; links to directories are not
    descended. Each directory is named (`touch`) before it is listed, so that a listing
    that gives no answer is reported as that directory's."""
    stack = [root]
    while stack:
        directory = stack.pop()
        touch(directory)
        try:
            names = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed since its parent was listed
        below = []
        for name in names:
            path = directory / name
            touch(path)
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue
            yield path, mode
            if stat.S_ISDIR(mode):
                below.append(path)
        stack.extend(reversed(below))


def _check_temporary(path: Path, report: FsckReport, now: float) -> None:
    found = left_over(path, now)
    if found is None:
        return
    pid, age = found
    report.problems.append(Problem(
        path, f"a temporary left by a process that was killed (pid {pid}, "
        f"{age / 60:.0f} min old)", "nothing: it was never moved into place",
        "remove it (--repair moves it to quarantine/; the next run of the operation that "
        "made it removes its own)"))


def check_blobs(root: Path, report: FsckReport) -> None:
    base = root / "blobs" / "sha256"
    if not base.is_dir():
        return
    for path in sorted(base.glob("*/*")):
        if base.is_symlink() or path.parent.is_symlink():
            continue  # never followed: check_special_files reports the link
        if not report.count("blobs", path):
            continue
        digest = hashlib.sha256()
        try:
            with open_regular(path) as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        except FileNotFoundError:
            continue  # retention removed it meanwhile
        except NotRegularFileError as exc:
            report.problems.append(Problem(path, f"not a regular file: {exc.strerror}",
                                           "the artifact's bytes (never followed or read)",
                                           "remove it; log the artifact again",
                                           repairable=False))
            continue
        if digest.hexdigest() != path.name or path.parent.name != path.name[:2]:
            report.problems.append(Problem(path, "blob content does not match its digest",
                                           "the artifact's bytes",
                                           "quarantine it (--repair); log the artifact again"))


def check_referenced_blobs(root: Path, report: FsckReport) -> None:
    """Report each blob that artifact or media records name and the store does not hold
    as a regular file (removed by hand, or a store copied without its blobs), unless a
    repair moved its damaged copy to the quarantine."""
    for digest, users in sorted(blob_refs(root, ReadProblems()).items()):
        if not is_digest(digest):
            continue  # such a record is refused by readers, and reported as invalid
        path = blob_path(root, digest)
        if path.is_symlink() or path.parent.is_symlink():
            continue  # check_special_files reports the link
        try:
            mode: int | None = path.lstat().st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            report.problems.append(Problem(path, f"blob not readable: {exc.strerror}",
                                           "its bytes", "check the file system",
                                           repairable=False))
            continue
        if mode is not None and stat.S_ISREG(mode):
            continue
        if (root / "quarantine" / path.relative_to(root)).exists():
            continue  # a damaged copy a repair moved there, reported when it was found
        named = ", ".join(f"{kind} of {run}" for run, kind in sorted(users)[:3])
        more = f" and {len(users) - 3} more" if len(users) > 3 else ""
        report.problems.append(Problem(
            path, f"blob missing: named by {named}{more}",
            "the bytes of those records (readers and exporters leave them out)",
            "restore it from a backup or pack that holds it (tracklake restore, unpack)",
            repairable=False))


def check_attempts(root: Path, report: FsckReport) -> None:
    for path in sorted((root / "runs").glob("project=*/run=*/rank=*/attempt=*.json")):
        if not report.count("attempt files", path):
            continue
        parts = dict(p.split("=", 1) for p in path.relative_to(root / "runs").with_suffix(
            "").parts)
        try:  # every field checked, and that it names the attempt its path names
            record = check_attempt(path)
        except FileNotFoundError:
            continue  # its run was removed since it was listed
        except FormatError as exc:
            why: str | None = str(exc)
        else:
            why = _empty_attempt(root, path, parts) if record is None else None
        if why is not None:
            report.problems.append(Problem(
                path, f"damaged attempt file: {why}", "the run's identity, status and "
                "config for this rank and attempt (its records stay)",
                "quarantine it (--repair); the run then lists without this attempt"))


def _empty_attempt(root: Path, path: Path, parts: dict[str, str]) -> str | None:
    """Why an empty attempt file is damage rather than one being created right now: a
    later attempt of its rank exists, it has records, or it stayed empty for minutes."""
    if any(int(p.stem.split("=")[1]) > int(parts["attempt"])
           for p in path.parent.glob("attempt=*.json") if p.stem.split("=")[1].isdigit()):
        return "empty, and a later attempt of its rank exists"
    s = StreamId(parts["project"], parts["run"], int(parts["rank"]), int(parts["attempt"]),
                 "metrics")
    if any(list_stream(root, StreamId(s.project, s.run, s.rank, s.attempt, k)).parts
           or list_stream(root, StreamId(s.project, s.run, s.rank, s.attempt, k)).segments
           for k in SCHEMAS):
        return "empty, yet its attempt has records"
    age = _dt.datetime.now(_dt.timezone.utc).timestamp() - path.stat().st_mtime
    if age > CRASHED_AFTER_SECONDS:
        return f"empty for {age:.0f} s"
    return None


def check_exports(root: Path, report: FsckReport) -> None:
    for path in sorted((root / "exports").glob("*/project=*/run=*.json")):
        if not report.count("exporter states", path):
            continue
        project = path.parent.name.split("=", 1)[1]
        run = path.stem.split("=", 1)[1]
        todo = ("restore the file from a backup, or move it away to export the run again "
                "from the start (the destination may then get records twice)")
        try:
            cursor, _ = read_state(path, project, run)
        except FileNotFoundError:
            continue
        except (OSError, FormatError, CursorError) as exc:
            report.problems.append(Problem(
                path, f"damaged exporter state ({exc})", "where this exporter stands in the "
                "run", todo, repairable=False))
            continue
        for key, position, last in positions_past_end(root, cursor)[0]:
            report.problems.append(Problem(
                path, f"exporter state past the end: stream {key} delivered up to seq "
                f"{position}, but the store holds it only up to seq {last}",
                "nothing yet (the exporter refuses it, retention protects the run)", todo,
                repairable=False))


def check_backup_records(root: Path, report: FsckReport) -> None:
    for path in record_paths(root):
        if not is_regular_file(path):
            continue  # a link, FIFO or device: the walk of the store reports it
        if not report.count("backup records", path):
            continue
        try:
            load_record(root, path)
        except ValueError as exc:
            report.problems.append(Problem(
                path, f"damaged record of a backup ({exc})", "what that backup holds, as "
                "retention's require_backup counts it (the backup itself is untouched)",
                "quarantine it (--repair); the next `tracklake backup` to that destination "
                "writes it again"))
