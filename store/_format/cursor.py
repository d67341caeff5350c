"""Exporter cursors: the last `seq` delivered per stream, small and serialisable."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklake._errors import CursorError, FormatError, NewerFormatError
from tracklake._format import KINDS, StreamId, bounded_json, checks
from tracklake._format.bounded import bounded
from tracklake._format.files import read_regular
from tracklake._format.schema import check_version

#: The most of an exporter's state file (its cursor and held aggregates) anyone reads.
MAX_STATE_BYTES = 64 << 20

_KEY = re.compile(r"(0|[1-9][0-9]*)/(0|[1-9][0-9]*)/([a-z]+)\Z")


@dataclass
class Cursor:
    """Position of a reader in one run: for each stream (``rank/attempt/kind``) the last
    `seq` already delivered. `seq` is stored in every record, so a cursor stays valid when
    segments are compacted into Parquet."""

    project: str
    run: str
    positions: dict[str, int] = field(default_factory=dict)

    def after(self, stream: StreamId) -> int:
        """The last seq delivered for `stream`, or -1 if none."""
        return self.positions.get(stream.key(), -1)

    def advance(self, stream: StreamId, seq: int) -> None:
        key = stream.key()
        if seq < self.positions.get(key, -1):
            raise CursorError(f"cursor for {self.run}/{key} cannot move back from "
                              f"{self.positions[key]} to {seq}")
        self.positions[key] = seq

    def streams(self) -> Iterator[tuple[int, int, str, int]]:
        for key, seq in self.positions.items():
            m = _KEY.match(key)
            assert m is not None
            yield int(m.group(1)), int(m.group(2)), m.group(3), seq

    def to_json(self) -> str:
        return json.dumps({"project": self.project, "run": self.run,
                           "positions": dict(sorted(self.positions.items()))})

    @classmethod
    def from_json(cls, text: str | bytes) -> Cursor:
        try:
            data = bounded_json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8, nesting too deep
            raise CursorError(f"cursor is not valid JSON: {exc}") from exc
        if not isinstance(data, Mapping) or not isinstance(data.get("positions"), Mapping):
            raise CursorError("cursor must be an object with project, run and positions")
        project, run, positions = data.get("project"), data.get("run"), data["positions"]
        if not isinstance(project, str) or not isinstance(run, str):
            raise CursorError("cursor project and run must be strings")
        checked: dict[str, int] = {}
        for key, seq in positions.items():
            m = _KEY.match(key) if isinstance(key, str) else None
            if (m is None or m.group(3) not in KINDS or int(m.group(1)) > checks.MAX_INT32
                    or int(m.group(2)) > checks.MAX_INT32):
                raise CursorError(f"cursor stream key {key!r} is not rank/attempt/kind "
                                  "(rank and attempt up to 2**31-1)")
            if (isinstance(seq, bool) or not isinstance(seq, int)
                    or not -1 <= seq <= checks.MAX_INT64):
                raise CursorError(f"cursor position for {key!r} must be an int >= -1 "
                                  f"(and < 2**63), not {seq!r}")
            checked[key] = seq
        return cls(project, run, checked)


def read_state(path: Path, project: str, run: str) -> tuple[Cursor, dict[str, Any]]:
    """An exporter's state file of run `project`/`run`: its cursor, checked, and the whole
    object (for the fields the exporter keeps beside it). Read only as a regular file of
    at most `MAX_STATE_BYTES`; `FileNotFoundError` if there is none, `OSError` if it
    cannot be read, `CursorError` naming the file if it is not a state tracklake wrote
    (`NewerFormatError` if a newer tracklake did); `NoAnswerError` if its file system
    gives no answer within the read timeout."""
    raw = bounded(lambda: read_regular(path, MAX_STATE_BYTES), path)
    try:
        data = bounded_json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8, nesting too deep
        raise CursorError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CursorError(f"{path}: not a JSON object")
    try:
        check_version(data.get("format"), path)
    except NewerFormatError:
        raise
    except FormatError as exc:
        raise CursorError(str(exc)) from exc
    for name, types in _STATE_FIELDS.items():
        if data.get(name) is not None and not isinstance(data[name], types):
            raise CursorError(f"{path}: its field {name!r} is {data[name]!r}")
    try:
        cursor = Cursor.from_json(json.dumps({"project": project, "run": run,
                                              "positions": data.get("positions")}))
    except CursorError as exc:
        raise CursorError(f"{path}: {exc}") from exc
    return cursor, data


#: The fields of a state file besides its cursor, and the JSON types each may have.
_STATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "ranks": str, "destination": dict, "held": dict, "records": int,
    "last_time_us": int, "finished": bool, "last_success": str, "last_error": str,
    "last_error_at": str,
}
