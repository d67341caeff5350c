#!/usr/bin/env python
"""The run catalog's bytes per run and the cost of decoding it, plain and compressed.

Reads a store's run catalog files, ``.cache/runs-v3/*.catalog`` (as any reader left
them), writes their rows again as one Arrow IPC stream without compression, with lz4 and
with zstd, and prints for each the bytes per run and the best of ``--repeat`` decodes
(``pa.ipc.open_stream(...).read_all()``, what a new process pays once per catalog file).
The columns' share of the plain table's bytes per run is printed too, as that is what a
smaller format would cut.

Usage (a store built by ``benchmarks/read_cost.py``, after one question)::

    python benchmarks/catalog_size.py --root /tmp/tracklake-read-cost/runs-10000-steps-200/store
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pyarrow as pa

from tracklake._read.catalog_shards import CATALOG_DIR


def encoded(table: pa.Table, compression: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def best_decode(data: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        pa.ipc.open_stream(data).read_all()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    files = sorted((args.root / CATALOG_DIR).glob("*.catalog"))
    table = pa.concat_tables(
        pa.ipc.open_stream(path.read_bytes().partition(b"\n")[2]).read_all()
        for path in files).combine_chunks()
    runs = table.num_rows
    print(f"{runs} runs catalogued in {len(files)} files in {args.root / CATALOG_DIR}")
    print("column shares of the plain table, bytes a run: " + ", ".join(
        f"{name} {table.column(name).nbytes / runs:.0f}" for name in table.column_names))
    print(f"{'encoding':<10}{'bytes a run':>12}{'decode, ms':>12}")
    for compression in (None, "lz4", "zstd"):
        data = encoded(table, compression)
        print(f"{compression or 'plain':<10}{len(data) / runs:>12.0f}"
              f"{best_decode(data, args.repeat) * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
