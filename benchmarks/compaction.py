#!/usr/bin/env python
"""Compaction benchmark: throughput and peak memory of compacting one long metrics stream,
beside pyarrow's own `parquet.write_table` of the same table as the floor.

For each size (values; 1 M and 10 M by default, 60 M with ``--full``) the benchmark
writes one stream of sealed segments as a rank's writer does (32 verl-like keys per
step, one record group per step, random float64 values from a fixed seed, 64 MiB
segments, no fsync), then measures, each in a fresh process so peak RSS is its own:

1. tracklake  ``tracklake.compact(root=...)``: read the segments, sort by (key, step,
              seq) in bounded memory, write zstd Parquet with checksums, fsync, rename,
              delete the segments. Wall time from the call to its return.
2. floor      the same records already in memory as one Arrow table (read before the
              clock starts), then ``pyarrow.parquet.write_table(table, path,
              compression="zstd")``: what writing Parquet costs at all, without reading,
              sorting, checksums or fsync.

Reported per size: values/s of each, tracklake's throughput over the floor's (goal
>= 0.5), the same ratio by CPU time (``time.process_time()``, every thread of the
process: on a machine shared with other jobs, wall time mostly measures the others),
peak RSS of each process (ru_maxrss, whole process including the interpreter;
goal <= 512 MiB for tracklake at 60 M, independent of the size), and bytes on disk
(segments before, the part after, the floor's file).

Usage (from the repository root)::

    python benchmarks/compaction.py                 # 1 M and 10 M values
    python benchmarks/compaction.py --full          # and 60 M (several minutes, ~2 GB disk)
    python benchmarks/compaction.py --sizes 200000  # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = [f"{group}/{name}" for group in ("actor", "critic", "rollout", "timing")
        for name in ("loss", "kl", "entropy", "grad_norm", "lr", "reward", "len", "clip")]
SEED = 20261201
SEGMENT_BYTES = 64 << 20
STEPS_PER_BATCH = 2048  # 65,536 values per batch, as the writer's default batch_values


def build(root: Path, values: int) -> int:
    """One stream of sealed segments holding `values` metric values; their total bytes."""
    import numpy as np
    import pyarrow as pa

    from tracklake._format import SCHEMAS, StreamId, segment_name, stream_dir
    from tracklake._format.segment import SegmentWriter, stream_schema

    ident = StreamId("bench", "long", 0, 1, "metrics")
    directory = stream_dir(root, ident)
    directory.mkdir(parents=True)
    schema = stream_schema(SCHEMAS["metrics"], ident)
    rng = np.random.default_rng(SEED)
    steps = values // len(KEYS)
    keys = pa.array(KEYS * STEPS_PER_BATCH)
    number, seg, total = 0, None, 0
    for start in range(0, steps, STEPS_PER_BATCH):
        n = min(STEPS_PER_BATCH, steps - start)
        step = np.repeat(np.arange(start, start + n, dtype=np.int64), len(KEYS))
        batch = pa.record_batch({
            "seq": step, "time": pa.array(1_700_000_000_000_000 + step * 1000,
                                          pa.timestamp("us", tz="UTC")),
            "step": step, "key": keys.slice(0, n * len(KEYS)),
            "value": rng.standard_normal(n * len(KEYS))}, schema=schema)
        if seg is None or seg.size >= SEGMENT_BYTES:
            if seg is not None:
                seg.seal()
                total += seg.size
            seg = SegmentWriter(directory / segment_name(number, start), schema, fsync=False)
            number += 1
        seg.append(batch)
    if seg is not None:
        seg.seal()
        total += seg.size
    return sum(p.stat().st_size for p in directory.iterdir())


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, root: Path) -> dict[str, float]:
    """Run one contender in this (fresh) process."""
    import pyarrow as pa

    import tracklake

    if mode == "tracklake":
        import pyarrow.parquet

        import tracklake._ops.compact
        import tracklake._ops.metric_sort

        started, cpu = time.perf_counter(), time.process_time()
        report = tracklake.compact(root=root)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert not report.skipped, report.skipped
        return {"seconds": seconds, "cpu_s": cpu, "values": report.records,
                "peak_mib": _peak_mib(),
                "bytes_after": report.bytes_after, "parts": len(report.parts_written)}
    import pyarrow.parquet as pq

    from tracklake._format import StreamId
    from tracklake._read.reader import read_stream

    ident = StreamId("bench", "long", 0, 1, "metrics")
    table = pa.Table.from_batches(list(read_stream(root, ident)))
    out = root / "floor.parquet"
    started, cpu = time.perf_counter(), time.process_time()
    pq.write_table(table, out, compression="zstd")
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "values": table.num_rows,
            "peak_mib": _peak_mib(),
            "bytes_after": out.stat().st_size, "parts": 1}


def measure(values: int, base: Path) -> dict[str, object]:
    root = base / f"store-{values}"
    started = time.perf_counter()
    segment_bytes = build(root, values)
    built = time.perf_counter() - started
    results: dict[str, object] = {"values": values, "segment_bytes": segment_bytes,
                                  "build_s": round(built, 1)}
    for mode in ("floor", "tracklake"):  # the floor first: it only reads the segments
        out = subprocess.run([sys.executable, __file__, "--child", mode, str(root)],
                             capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    floor, ours = results["floor"], results["tracklake"]
    assert isinstance(floor, dict) and isinstance(ours, dict)
    results["throughput_ratio"] = round((ours["values"] / ours["seconds"])
                                        / (floor["values"] / floor["seconds"]), 2)
    results["cpu_ratio"] = round(floor["cpu_s"] / ours["cpu_s"], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000_000, 10_000_000])
    parser.add_argument("--full", action="store_true", help="also 60 M values")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]))))
        return
    sizes = args.sizes + ([60_000_000] if args.full else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="tracklake-compaction-") as tmp:
        for values in sizes:
            r = measure(values, Path(tmp))
            rows.append(r)
            f, t = r["floor"], r["tracklake"]
            assert isinstance(f, dict) and isinstance(t, dict)
            print(f"{values:>11,} values  segments {r['segment_bytes'] / 2**20:8.1f} MiB | "
                  f"floor {f['values'] / f['seconds'] / 1e6:6.2f} M values/s "
                  f"peak {f['peak_mib']:7.0f} MiB {f['bytes_after'] / 2**20:7.1f} MiB | "
                  f"tracklake {t['values'] / t['seconds'] / 1e6:6.2f} M values/s "
                  f"peak {t['peak_mib']:7.0f} MiB {t['bytes_after'] / 2**20:7.1f} MiB "
                  f"in {t['parts']} part(s) | throughput ratio {r['throughput_ratio']} "
                  f"(by CPU time {t['cpu_s']:.2f} s vs the floor's {f['cpu_s']:.2f} s: "
                  f"{r['cpu_ratio']})",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
