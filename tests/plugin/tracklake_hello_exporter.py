"""A third-party destination, written from the `Destination` contract alone: appends each
metric, and each artifact's size and first bytes, as JSON lines to a file."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import click
import pyarrow as pa

from tracklake.exporters import Destination, ExportContext, RunInfo
from tracklake.read import open_blob


class HelloDestination(Destination):
    """Writes metrics and artifacts as JSON lines (a plugin example)."""

    name = "hello"

    def __init__(self, *, out: str) -> None:
        self.out = out
        self.root: str | None = None

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
        return [click.Option(["--out"], required=True, help="File to append to.")]

    def describe(self) -> str:
        return f"hello:{os.path.abspath(self.out)}"

    def start(self, context: ExportContext) -> None:
        self.root = str(context.root)

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        # an append-only file: forget what was written after the last commit
        size = int(state.get("size", 0))
        with open(self.out, "a+b") as f:
            f.truncate(size)

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        lines = []
        if kind == "metrics":
            lines = [{"run": run.key, **row}
                     for row in records.select(["step", "key", "value"]).to_pylist()]
        elif kind == "artifacts":
            assert self.root is not None
            for row in records.select(["name", "digest"]).to_pylist():
                with open_blob(self.root, row["digest"]) as blob:
                    head = blob.read(8).decode(errors="replace")
                lines.append({"run": run.key, "artifact": row["name"], "head": head})
        with open(self.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        with open(self.out, "ab") as f:
            f.flush()
            os.fsync(f.fileno())
            return {"size": f.tell()}

    def finish_run(self, run: RunInfo) -> None:
        with open(self.out, "a") as f:
            f.write(json.dumps({"run": run.key, "finished": run.status}) + "\n")

    def close(self) -> None:
        self.root = None
