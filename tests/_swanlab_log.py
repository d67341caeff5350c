"""Reading SwanLab's offline run files (``.swanlab``) back with SwanLab's own reader and
record types, for tests that compare what a SwanLab export holds with the store. The
reader and the record protobufs are SwanLab internals (0.10): only this module uses them."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def records(path: Path) -> Iterator[Any]:
    """Every record of a ``.swanlab`` file, read by SwanLab's own reader. The reader and
    the record protobufs are SwanLab internals (0.10)."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(path)
    try:
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            yield record
    finally:
        reader.close()


def points(directories: list[Path]) -> Counter[tuple[int, str, object]]:
    return Counter((r.scalar.step, r.scalar.key, same(r.scalar.value.number))
                   for d in directories for r in records(run_file(d))
                   if r.WhichOneof("record_type") == "scalar")


def run_file(directory: Path) -> Path:
    (path,) = directory.glob("run-*.swanlab")
    return path


def same(value: float) -> object:
    return "nan" if math.isnan(value) else value
