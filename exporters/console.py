"""The console destination: prints steps as they arrive, like verl's console logger
(``step:N - key:value - ...``), for watching a run with ``--follow``."""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping
from typing import Any, ClassVar, TextIO

import click
import pyarrow as pa

from tracklake.exporters._protocol import Destination, RunInfo


class ConsoleDestination(Destination):
    """Prints metrics (keys matching `keys`), texts and alerts on a stream."""

    name: ClassVar[str] = "console"
    keeps_state: ClassVar[bool] = False  # printed again each time, from the start

    def __init__(self, *, keys: str = "*", stream: TextIO | None = None) -> None:
        self.keys = keys
        self.stream = stream or sys.stdout

    @classmethod
    def cli_options(cls) -> list[click.Parameter]:
        return [click.Option(["--keys"], default="*", show_default=True,
                             help="Glob of metric keys to print.")]

    def describe(self) -> str:
        return f"console:{self.keys}"

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def open_run(self, run: RunInfo, state: Mapping[str, Any]) -> None:
        self._print(f"== {run.key} ({run.status}, {len(run.ranks)} ranks)")

    def write(self, run: RunInfo, kind: str, records: pa.Table) -> None:
        if kind == "metrics":
            by_step: dict[int, list[str]] = {}
            for step, key, value in zip(records.column("step").to_pylist(),
                                        records.column("key").to_pylist(),
                                        records.column("value").to_pylist(), strict=True):
                if fnmatch.fnmatchcase(key, self.keys):
                    by_step.setdefault(step, []).append(f"{key}:{value:.6g}")
            for step in sorted(by_step):
                self._print(" - ".join([f"step:{step}", *by_step[step]]))
        elif kind == "texts":
            for row in records.to_pylist():
                self._print(f"step:{row['step']} - {row['key']}: {row['text']}")
        elif kind == "events":
            for row in records.to_pylist():
                self._print(f"[{row['level']}] {row['title']}: {row['text']}")

    def commit(self, run: RunInfo) -> Mapping[str, Any]:
        return {}  # what was printed cannot be taken back

    def finish_run(self, run: RunInfo) -> None:
        self._print(f"== {run.key} {run.status}")

    def close(self) -> None:
        self.stream.flush()
