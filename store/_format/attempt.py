"""The per-rank, per-attempt JSON file: a run's identity and lifecycle status."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from tracklake._errors import FormatError
from tracklake._format import FORMAT_VERSION, attempt_file, check_version, write_atomic

STATUSES = ("running", "finished", "failed", "killed", "crashed")
#: Statuses after which an attempt's writer will not write again.
TERMINAL_STATUSES = frozenset(STATUSES[1:])


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


#: A "running" attempt whose heartbeat is older than this shows as "crashed" (writers
#: heartbeat every 30 s).
CRASHED_AFTER_SECONDS = 180.0


def effective_status(record: dict[str, Any], latest_attempt: int, now: float) -> str:
    """The status to show: "crashed" for a running attempt whose heartbeat stopped or that a
    later attempt of its rank replaced, else the recorded status."""
    status = str(record.get("status", "running"))
    if status != "running":
        return status
    beat = record.get("heartbeat_at")
    if record["attempt"] < latest_attempt or (
            beat and now - _dt.datetime.fromisoformat(beat).timestamp() > CRASHED_AFTER_SECONDS):
        return "crashed"
    return status


def attempt_numbers(rank_dir: Path) -> list[int]:
    """The attempt numbers that have files in one rank's directory of a run."""
    numbers = (p.stem.split("=", 1)[1] for p in rank_dir.glob("attempt=*.json"))
    return [int(n) for n in numbers if n.isdigit()]


def claim_attempt(root: Path, project: str, run: str, rank: int) -> tuple[int, Path]:
    """Create the next free attempt file of this rank exclusively; (attempt, path).

    Each rank counts its own earlier attempts, so all ranks of a restarted job agree on
    the attempt number without talking to each other.
    """
    rank_dir = attempt_file(root, project, run, rank, 1).parent
    rank_dir.mkdir(parents=True, exist_ok=True)
    attempt = max(attempt_numbers(rank_dir), default=0) + 1
    while True:
        path = attempt_file(root, project, run, rank, attempt)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            attempt += 1
            continue
        return attempt, path


def write_attempt(path: Path, record: dict[str, Any]) -> None:
    record = {"format": FORMAT_VERSION, **record}
    write_atomic(path, json.dumps(record, indent=1, default=str, allow_nan=True).encode())


def read_attempt(path: Path) -> dict[str, Any] | None:
    """The attempt record, or None if it was claimed but not yet written."""
    data = path.read_bytes()
    if not data:
        return None
    try:
        record = json.loads(data)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}: not a valid attempt record ({exc})") from exc
    if not isinstance(record, dict):
        raise FormatError(f"{path}: not a valid attempt record")
    check_version(record.get("format"), path)
    return record
