"""Exporter state: per destination and run, the cursor and the destination's own state,
written atomically so that a killed exporter resumes exactly where its last commit was."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake import CursorError, ExportError
from tracklake.files import write_atomic
from tracklake.read import FORMAT_VERSION, Cursor, read_exporter_state


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def destination_dir(root: Path, name: str, description: str) -> Path:
    """Where one destination's state lives: ``ROOT/exports/<name>-<hash of description>``."""
    digest = hashlib.sha256(description.encode()).hexdigest()[:12]
    return root / "exports" / f"{name}-{digest}"


@dataclass
class ExportState:
    """What one exporter has delivered of one run."""

    path: Path
    cursor: Cursor
    ranks: str = "0"  # the rank mode the cursor was made with
    destination: dict[str, Any] = field(default_factory=dict)  # from Destination.commit()
    held: dict[str, Any] = field(default_factory=dict)  # aggregates waiting for all ranks
    records: int = 0  # records delivered so far
    last_time_us: int | None = None  # time of the newest record delivered
    finished: bool = False
    last_success: str | None = None
    last_error: str | None = None
    last_error_at: str | None = None

    def positions_mode_differs(self, mode: str) -> bool:
        """True if this state was made with another rank mode (its cursor would not fit)."""
        return bool(self.cursor.positions) and self.ranks != mode

    def save(self) -> None:
        refuse_linked_directory(self.path)
        data = {
            "format": FORMAT_VERSION, "project": self.cursor.project, "run": self.cursor.run,
            "positions": self.cursor.positions, "ranks": self.ranks,
            "destination": self.destination,
            "held": self.held, "records": self.records, "last_time_us": self.last_time_us,
            "finished": self.finished, "last_success": self.last_success,
            "last_error": self.last_error, "last_error_at": self.last_error_at,
        }
        write_atomic(self.path, json.dumps(data, indent=1, allow_nan=True).encode())


def state_path(directory: Path, project: str, run: str) -> Path:
    return directory / f"project={project}" / f"run={run}.json"


def refuse_linked_directory(path: Path) -> None:
    """ExportError (not retryable) if the directory holding the state file `path` is a
    symbolic link: planted there (a restored backup, another user), it would lead the
    exporter's reads and writes out of its state directory."""
    if path.parent.is_symlink():
        raise ExportError(f"{path.parent} is a symbolic link; an exporter's state is never "
                          "read or written through one. Remove it (the exporter then "
                          "starts that project's runs anew, as with no state)",
                          retryable=False)


def forget_state(directory: Path, project: str, run: str) -> None:
    """Delete the saved state of a run (it is exported again from its start)."""
    path = state_path(directory, project, run)
    refuse_linked_directory(path)
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
    except FileNotFoundError:
        pass


def load_state(directory: Path, project: str, run: str) -> ExportState:
    """The saved state of a run, or a fresh one; ExportError (not retryable) if corrupt."""
    path = state_path(directory, project, run)
    refuse_linked_directory(path)
    try:
        cursor, data = read_exporter_state(path, project, run)
    except FileNotFoundError:
        return ExportState(path, Cursor(project, run))
    except CursorError as exc:
        raise ExportError(
            f"exporter state {path} is corrupt ({exc}); nothing of run {project}/{run} was "
            "exported by this exporter now. Restore the file from a backup, or pass "
            "--from-start to export the run again from its start (a destination may then "
            "hold what it already had twice).", retryable=False) from exc
    except OSError as exc:
        raise ExportError(f"exporter state {path} cannot be read: {exc.strerror or exc}; "
                          f"nothing of run {project}/{run} was exported by this exporter "
                          "now", retryable=False) from exc
    return ExportState(
        path, cursor, ranks=data.get("ranks") or "0", destination=data.get("destination") or {},
        held=data.get("held") or {}, records=data.get("records") or 0,
        last_time_us=data.get("last_time_us"), finished=bool(data.get("finished")),
        last_success=data.get("last_success"), last_error=data.get("last_error"),
        last_error_at=data.get("last_error_at"))


def list_states(directory: Path) -> list[Path]:
    return sorted(directory.glob("project=*/run=*.json"))
