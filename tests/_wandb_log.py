"""Reading W&B's offline transaction logs (``.wandb`` files) back with W&B's own
`Record` protobuf, for tests that compare what a W&B export holds with the store."""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from wandb.proto import wandb_internal_pb2

# -- reading ------------------------------------------------------------------

BLOCK = 32768


def records(path: Path) -> Iterator[Any]:
    """wandb's transaction log: a 7-byte header (":W&B", magic, version), then LevelDB
    log records (CRC-32 seeded with the type, length, type FULL/FIRST/MIDDLE/LAST) in
    32 KiB blocks; each complete record is a serialised `Record`."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:
            pos += room  # the block's zero trailer
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        payload = data[pos + 7:pos + 7 + length]
        assert len(payload) == length, "a torn record"
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pos += 7 + length
        chunks += payload
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record
            chunks = b""


def history(files: list[Path]) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for f in files:
        for r in records(f):
            if r.WhichOneof("record_type") == "history":
                values: dict[str, Any] = {}
                for item in r.history.item:  # dict values come as items with nested keys
                    *parents, last = [item.key] if item.key else list(item.nested_key)
                    node = values
                    for part in parents:
                        node = node.setdefault(part, {})
                    node[last] = json.loads(item.value_json)
                rows.append((r.history.step.num,
                             {k: v for k, v in values.items() if not k.startswith("_")}))
    return rows


def same(value: float) -> object:
    """Comparable: NaN equals NaN; W&B's history JSON writes -0.0 as 0."""
    return "nan" if math.isnan(value) else value + 0.0


def points(history: list[tuple[int, dict[str, Any]]]) -> Counter[tuple[int, str, object]]:
    return Counter((step, k, same(float(v))) for step, values in history
                   for k, v in values.items() if not isinstance(v, dict))


def expected(metrics: pa.Table) -> Counter[tuple[int, str, object]]:
    return Counter((s, k, same(v)) for s, k, v in zip(
        metrics.column("step").to_pylist(), metrics.column("key").to_pylist(),
        metrics.column("value").to_pylist(), strict=True))


def config(files: list[Path]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for f in files:
        for r in records(f):
            if r.WhichOneof("record_type") == "config":
                config.update((i.key, json.loads(i.value_json)) for i in r.config.update)
    return config
