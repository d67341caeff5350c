"""A run's records as the export loop hands them to a destination, for destination tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

import tracklake
from tracklake.exporters._ranks import with_rank


def records_by_kind(root: Path, project: str, run_id: str,
                    skip: Callable[[tracklake.StreamId], bool] | None = None
                    ) -> dict[str, pa.Table]:
    """Every record of the run per kind, with the `rank` and `attempt` columns the loop
    adds (keys unprefixed), leaving out the streams `skip` names."""
    tables: dict[str, list[pa.Table]] = {}
    for stream, batch in tracklake.read_run(root, tracklake.Cursor(project, run_id)):
        if skip is not None and skip(stream):
            continue
        table = with_rank(stream, batch, "0")
        assert table is not None  # only aggregate modes hold records back
        tables.setdefault(stream.kind, []).append(table)
    return {kind: pa.concat_tables(parts) for kind, parts in tables.items()}
