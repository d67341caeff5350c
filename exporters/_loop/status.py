"""`tracklake export status`: how far behind each exporter is, per run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracklake import ExportError
from tracklake.exporters._loop.ranks import ranks_to_read
from tracklake.exporters._loop.state import list_states, load_state
from tracklake.read import read_run, resolve_root


def export_status(root: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per exporter and run: records exported and still behind, how many seconds
    the newest unexported record is ahead of the newest exported one, last error."""
    root_path = resolve_root(root)
    rows: list[dict[str, Any]] = []
    for directory in sorted((root_path / "exports").glob("*/")):
        try:
            description = json.loads((directory / "destination.json").read_text())[
                "description"]
        except (OSError, ValueError, KeyError):
            description = directory.name
        for path in list_states(directory):
            project = path.parent.name.split("=", 1)[1]
            run = path.stem.split("=", 1)[1]
            row: dict[str, Any] = {"destination": description, "run": f"{project}/{run}"}
            try:
                state = load_state(directory, project, run)
            except ExportError as exc:
                rows.append(row | {"error": str(exc)})
                continue
            behind = 0
            newest = state.last_time_us or 0
            for _, batch in read_run(root_path, state.cursor, ranks=ranks_to_read(state.ranks)):
                behind += batch.num_rows
                newest = max(newest, max(batch.column("time").cast("int64").to_pylist()))
            lag = (newest - (state.last_time_us or newest)) / 1e6
            rows.append(row | {
                "exported": state.records, "behind": behind,
                "seconds_behind": round(lag, 3) if behind else 0.0,
                "finished": state.finished, "last_success": state.last_success,
                "last_error": state.last_error, "last_error_at": state.last_error_at,
            })
    return rows
