"""The per-rank, per-attempt JSON file: a run's identity and lifecycle status."""

from __future__ import annotations

import datetime as _dt
import errno
import itertools
import json
import os
import sys
import time as _time
from pathlib import Path
from typing import Any

from tracklake._errors import FormatError, InvalidNameError, NewerFormatError
from tracklake._format import (
    FORMAT_VERSION,
    attempt_file,
    bounded_json,
    check_version,
    write_atomic,
)
from tracklake._format import checks as c
from tracklake._format.files import NotRegularFileError, read_regular, store_dir
from tracklake._format.liveness import writer_known_gone

STATUSES = ("running", "finished", "failed", "killed", "crashed")
#: Statuses after which an attempt's writer will not write again.
TERMINAL_STATUSES = frozenset(STATUSES[1:])


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


#: A "running" attempt whose heartbeat is older than this shows as "crashed" (writers
#: heartbeat every 30 s).
CRASHED_AFTER_SECONDS = 180.0


def effective_status(record: dict[str, Any], latest_attempt: int | None = None,
                     now: float | None = None) -> str:
    """The status to show: "crashed" for a running attempt whose writer is known gone
    (`liveness.writer_known_gone`: its process ended, or its heartbeat stopped for
    `CRASHED_AFTER_SECONDS`), else the recorded status. A later attempt of the rank does
    not make it crashed (`latest_attempt` is accepted for compatibility and not used):
    an older attempt may still write beside it."""
    status = str(record.get("status", "running"))
    if status != "running":
        return status
    now = _time.time() if now is None else now
    return "crashed" if writer_known_gone(record, now, CRASHED_AFTER_SECONDS) else status


def attempt_numbers(rank_dir: Path) -> list[int]:
    """The attempt numbers that have files in one rank's directory of a run."""
    numbers = (p.stem.split("=", 1)[1] for p in rank_dir.glob("attempt=*.json"))
    return [int(n) for n in numbers if n.isdigit()]


#: Runs of a project looked at for the name it was given (the first that recorded one).
_NAMED_AMONG = 8


def check_project_name(root: Path, project: str, given: str) -> None:
    """Refuse `given`, a project name stored as `project`, if that directory already holds
    a project given under another name (``pé ü``, ``p!`` and ``p`` are all stored as
    ``p``): their runs would mix. The name is the one recorded by the first run the
    directory lists (of its first `_NAMED_AMONG`) that recorded one; not every run is
    listed (sorting them all made each `init` cost 1 µs a run of the project: 40 ms at
    42,000 runs). Attempts written before names were recorded tell nothing and are not
    held against it."""
    base = root / "runs" / f"project={project}"
    known = None
    try:
        with os.scandir(base) as entries:
            runs = (e.name for e in entries if e.name.startswith("run="))
            for name in itertools.islice(runs, _NAMED_AMONG):
                known = _given_before(base / name, "project_given")
                if known is not None:
                    break
    except (FileNotFoundError, NotADirectoryError):
        return
    if known is not None and known != given:
        raise InvalidNameError(
            f"project name {given!r} is stored as {project!r}, which already holds "
            f"the runs of project {known!r}: their runs would mix. Choose a name "
            "that differs in its letters, digits or ._+@- characters")


def check_run_name(root: Path, project: str, run: str, given: str | None) -> None:
    """Refuse `given`, a run id stored as `run`, if that run was started under another
    given id (``a b``, ``a/b`` and ``a_b`` are all stored as ``a_b``): the new job would
    become the next attempt of an unrelated run and hide its steps. An id that was not
    given (a launcher's job id, a new one) and attempts written before ids were recorded
    are not held against it."""
    if given is None:
        return
    known = _given_before(root / "runs" / f"project={project}" / f"run={run}", "run_given")
    if known is not None and known != given:
        raise InvalidNameError(
            f"run id {given!r} of project {project!r} is stored as {run!r}, which already "
            f"holds run {known!r}: this job would become its next attempt. Choose an id "
            "that differs in its letters, digits or ._+@- characters, or pass "
            f"run_id={known!r} to resume that run")


def _given_before(run_dir: Path, field: str) -> str | None:
    """`field` of the first attempt file of a run directory, if it is a str."""
    for path in sorted(run_dir.glob("rank=*/attempt=*.json"))[:1]:
        try:
            record = read_attempt(path)
        except (OSError, FormatError):
            return None
        known = record.get(field) if record else None
        return known if isinstance(known, str) else None
    return None


def claim_attempt(root: Path, project: str, run: str, rank: int) -> tuple[int, Path]:
    """Create the next free attempt file of this rank exclusively; (attempt, path).

    Each rank counts its own earlier attempts, so all ranks of a restarted job agree on
    the attempt number without talking to each other.
    """
    rank_dir = attempt_file(root, project, run, rank, 1).parent
    store_dir(root, rank_dir)
    attempt = max(attempt_numbers(rank_dir), default=0) + 1
    while True:
        path = attempt_file(root, project, run, rank, attempt)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            attempt += 1
            continue
        return attempt, path


def write_attempt(path: Path, record: dict[str, Any], *, root: Path | None = None) -> None:
    """Write the attempt file at `path`; given the store's `root`, never through a
    directory on the way that was replaced by a link (`store_dir`)."""
    record = {"format": FORMAT_VERSION, **record}
    write_atomic(path, json.dumps(record, indent=1, default=str, allow_nan=True).encode(),
                 root=root)


#: An attempt file is read whole; a larger one is refused as damaged or hostile.
MAX_ATTEMPT_BYTES = 64 << 20
#: The most parsing one attempt record may allocate (`bounded_json.parse_cost`): a
#: record of 64 MiB of config text takes little more than its size.
ATTEMPT_PARSE_BUDGET = 1 << 30


def _check_git(value: object, field: str) -> dict[str, Any]:
    git = dict(c.mapping(value, field))
    c.optional(c.text)(git.get("commit"), f"{field}.commit")
    c.optional(c.text)(git.get("branch"), f"{field}.branch")
    c.optional(c.boolean)(git.get("dirty"), f"{field}.dirty")
    c.optional(c.text)(git.get("remote"), f"{field}.remote")
    return git


def _check_identity(value: object, field: str) -> dict[str, Any]:
    ident = dict(c.mapping(value, field))
    c.optional(lambda v, f: c.list_of(v, f, c.text))(ident.get("command"), f"{field}.command")
    for key in ("cwd", "python", "platform", "host"):
        c.optional(c.text)(ident.get(key), f"{field}.{key}")
    c.optional(c.integer)(ident.get("pid"), f"{field}.pid")
    c.optional(_check_git)(ident.get("git"), f"{field}.git")
    c.optional(lambda v, f: c.list_of(v, f, c.strings))(ident.get("gpus"), f"{field}.gpus")
    c.optional(c.strings)(ident.get("packages"), f"{field}.packages")
    c.optional(c.strings)(ident.get("env"), f"{field}.env")
    return ident


def _check_write_report(value: object, field: str) -> dict[str, Any]:
    report = dict(c.mapping(value, field))
    c.optional(c.text)(report.get("status"), f"{field}.status")
    c.optional(c.boolean)(report.get("complete"), f"{field}.complete")
    for key in ("failed_writes", "dropped_values", "dropped_records", "unwritten_records",
                "segments_taken"):
        c.optional(c.integer)(report.get(key), f"{field}.{key}")
    c.optional(c.text)(report.get("last_error"), f"{field}.last_error")
    errnos = c.optional(c.mapping)(report.get("errors_by_errno"), f"{field}.errors_by_errno")
    for k, v in (errnos or {}).items():
        c.integer(v, f"{field}.errors_by_errno.{k}")
    return report


def validate_attempt(record: object, where: object) -> dict[str, Any]:
    """`record` if every field an attempt record may hold has the type and range its
    readers rely on; FormatError naming `where` and the field otherwise.

    Required: format, project, run, rank, attempt, status, started_at. Optional (absent
    or null): name, world_size, tags, heartbeat_at, finished_at, identity, config,
    write_report. Fields this version does not know are kept (a later minor version may
    add some).
    """
    if not isinstance(record, dict):
        raise FormatError(f"{where}: not a valid attempt record (not a JSON object)")
    check_version(record.get("format"), where)
    try:
        c.name(record.get("project"), "project")
        c.name(record.get("run"), "run")
        c.integer(record.get("rank"), "rank", 0, c.MAX_INT32)
        c.integer(record.get("attempt"), "attempt", 1, c.MAX_INT32)
        c.one_of(record.get("status"), "status", STATUSES)
        c.timestamp(record.get("started_at"), "started_at")
        c.optional(c.timestamp)(record.get("heartbeat_at"), "heartbeat_at")
        c.optional(c.timestamp)(record.get("finished_at"), "finished_at")
        c.optional(c.text)(record.get("name"), "name")
        c.optional(c.text)(record.get("project_given"), "project_given")
        c.optional(c.text)(record.get("run_given"), "run_given")
        c.optional(lambda v, f: c.integer(v, f, 1, c.MAX_INT32))(record.get("world_size"),
                                                                  "world_size")
        c.optional(lambda v, f: c.list_of(v, f, c.text))(record.get("tags"), "tags")
        c.optional(_check_identity)(record.get("identity"), "identity")
        c.optional(c.mapping)(record.get("config"), "config")
        c.optional(_check_write_report)(record.get("write_report"), "write_report")
    except c.FieldError as exc:
        raise FormatError(f"{where}: not a valid attempt record: {exc}") from exc
    return record


def parse_attempt(data: bytes, where: object) -> dict[str, Any] | None:
    """The validated attempt record in `data`, or None if it is empty (claimed but not
    yet written); FormatError naming `where` if it is not a valid record."""
    if not data:
        return None
    if len(data) > MAX_ATTEMPT_BYTES:
        raise FormatError(f"{where}: an attempt record of {len(data)} bytes; the limit is "
                          f"{MAX_ATTEMPT_BYTES}")
    try:
        record = bounded_json.loads(data, ATTEMPT_PARSE_BUDGET)
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8, nesting too deep
        raise FormatError(f"{where}: not a valid attempt record ({exc})") from exc
    return validate_attempt(record, where)


def _path_fields(path: Path) -> tuple[str, str, int, int] | None:
    """(project, run, rank, attempt) named by an attempt file's path, if it has that form."""
    parts = [*path.parent.parts[-3:], path.stem]
    prefixes = ("project=", "run=", "rank=", "attempt=")
    if len(parts) != 4 or not all(p.startswith(x) for p, x in zip(parts, prefixes,
                                                                    strict=True)):
        return None
    project, run, rank, attempt = (p.split("=", 1)[1] for p in parts)
    if not (rank.isdigit() and attempt.isdigit()):
        return None
    return project, run, int(rank), int(attempt)


def check_attempt(path: Path) -> dict[str, Any] | None:
    """The attempt record at `path`, validated and checked to name the attempt its path
    names; None if it was claimed but not yet written. FormatError naming the file and
    the field if it is damaged or invalid."""
    if isinstance(path, Path):  # a local file: never a link, FIFO or device
        try:
            data = read_regular(path, MAX_ATTEMPT_BYTES)
        except NotRegularFileError as exc:
            raise FormatError(f"{path}: not a valid attempt record: {exc.strerror}") from exc
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            raise FormatError(f"{path}: an attempt record of more than {MAX_ATTEMPT_BYTES} "
                              f"bytes; the limit is {MAX_ATTEMPT_BYTES}") from exc
    else:  # a path in an object store
        with path.open("rb") as f:
            data = f.read(MAX_ATTEMPT_BYTES + 1)
    record = parse_attempt(data, path)
    named = _path_fields(path)
    if record is not None and named is not None and named != (
            record["project"], record["run"], record["rank"], record["attempt"]):
        raise FormatError(f"{path}: not a valid attempt record: it names project "
                          f"{record['project']!r} run {record['run']!r} rank "
                          f"{record['rank']} attempt {record['attempt']}, not the attempt "
                          "its path names")
    return record


_reported: set[tuple[str, str]] = set()


def read_attempt(path: Path) -> dict[str, Any] | None:
    """The attempt record, or None if it was claimed but not yet written.

    A damaged or invalid file is one problem, not a failure of every reader of the
    store: it is reported once on stderr, naming the file and the field, and read as
    None (its attempt is left out of run listings, and compaction treats its writer as
    possibly alive). A file of a newer major format raises NewerFormatError.
    Use `check_attempt` to get the error instead.
    """
    try:
        return check_attempt(path)
    except NewerFormatError:
        raise
    except FormatError as exc:
        key = (str(path), str(exc))
        if key not in _reported:
            _reported.add(key)
            print(f"tracklake: warning: {exc}; this attempt file is ignored until it is "
                  "repaired or removed", file=sys.stderr, flush=True)
        return None
