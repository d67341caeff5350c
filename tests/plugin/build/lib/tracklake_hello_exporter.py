"""A third-party destination: appends each metric as a JSON line to a file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

import click
import pyarrow as pa


class HelloDestination:
    """Writes metrics as JSON lines (a plugin example)."""

    name: ClassVar[str] = "hello"

    def __init__(self, *, out: str) -> None:
        self.out = out

    @classmethod
    def cli_options(cls) -> list[click.Option]:
        return [click.Option(["--out"], required=True, help="File to append to.")]

    def describe(self) -> str:
        return f"hello:{self.out}"

    def open_run(self, run: Any, state: Mapping[str, Any]) -> None:
        self.run_key = run.key

    def write(self, run: Any, kind: str, records: pa.Table) -> None:
        if kind != "metrics":
            return
        with open(self.out, "a") as f:
            for row in records.select(["step", "key", "value"]).to_pylist():
                f.write(json.dumps({"run": run.key, **row}) + "\n")

    def commit(self, run: Any) -> Mapping[str, Any]:
        return {}

    def finish_run(self, run: Any) -> None:
        with open(self.out, "a") as f:
            f.write(json.dumps({"run": run.key, "finished": run.status}) + "\n")

    def close(self) -> None:
        pass
