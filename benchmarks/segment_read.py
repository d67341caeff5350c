"""What reading a segment costs, and the share of it that validating each batch in full
takes (offsets within their data, UTF-8 strings: what a crafted batch with its checksum
right could otherwise get past).

    python benchmarks/segment_read.py [--batches 200] [--rows 3200] [--rounds 5]

A metrics segment of BATCHES batches of ROWS rows (32 keys a step, zstd, as a run
writes them) is written once; `read_segment` reads it ROUNDS times, and the batches it
returned are validated ROUNDS times on their own. Minimum of the rounds, per batch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from tracklake._format import SCHEMAS, StreamId
from tracklake._format.segment import SegmentWriter, read_segment, stream_schema

KEYS = [f"group{i // 8}/metric_{i}" for i in range(32)]


def _batch(first_seq: int, rows: int) -> pa.RecordBatch:
    now = dt.datetime.now(dt.timezone.utc)
    return pa.RecordBatch.from_pydict({
        "seq": [first_seq + i // len(KEYS) for i in range(rows)],
        "time": [now] * rows,
        "step": [first_seq + i // len(KEYS) for i in range(rows)],
        "key": [KEYS[i % len(KEYS)] for i in range(rows)],
        "value": [i * 0.5 for i in range(rows)]}, schema=SCHEMAS["metrics"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rows", type=int, default=3200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    stream = StreamId("bench", "r", 0, 1, "metrics")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "_seg-000000-000000000000.arrows"
        writer = SegmentWriter(path, stream_schema(SCHEMAS["metrics"], stream), fsync=False)
        for b in range(args.batches):
            writer.append(_batch(b * args.rows, args.rows))
        writer.seal()
        reads, validations = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            batches = read_segment(path).batches
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            for batch in batches:
                batch.validate(full=True)
            validations.append(time.perf_counter() - started)
        assert len(batches) == args.batches
        size = path.stat().st_size
    read, check = min(reads) / args.batches, min(validations) / args.batches
    print(f"segment: {args.batches} batches of {args.rows} rows, {size / 2**20:.1f} MiB")
    print(f"read_segment, per batch:      {read * 1e6:8.1f} µs (validation included)")
    print(f"validate(full=True) per batch: {check * 1e6:7.1f} µs "
          f"({check / read:.0%} of the read)")


if __name__ == "__main__":
    main()
