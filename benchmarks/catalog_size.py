#!/usr/bin/env python
"""The run catalog's bytes per run and the cost of decoding it, plain and compressed.

Reads a store's run catalog files, ``.cache/runs-v3/*.catalog`` (as any reader left
them), writes their rows again as one Arrow IPC stream without compression, with lz4 and
with zstd, and prints for each the bytes per run and the best of ``--repeat`` decodes
(``pa.ipc.open_stream(...).read_all()``, what a new process pays once per catalog file).
The columns' share of the plain table's bytes per run is printed too, as that is what a
smaller format would cut, and each column's bytes a run written alone with lz4, beside the
watched paths written relative to their run's directories (``m/rank=0/...`` for
``metrics/project=P/run=R/rank=0/...``, ``r/...`` for ``runs/...``): what a format that
derives the paths' prefixes from the run's project and name would save.

Usage (a store built by ``benchmarks/read_cost.py``, after one question)::

    python benchmarks/catalog_size.py --root /tmp/tracklake-read-cost/runs-10000-steps-200/store
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

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


def relative_watched(table: pa.Table) -> pa.Array:
    """The `watched` column with each path's ``KIND/project=P/run=R`` written as ``m`` or
    ``r`` (kept whole where it is not its run's)."""
    watched = table.column("watched").combine_chunks()
    flat = watched.flatten()
    owner = pc.list_parent_indices(watched).to_pylist()
    projects, runs = table.column("project").to_pylist(), table.column("run").to_pylist()
    short = []
    for path, row in zip(flat.field("path").to_pylist(), owner, strict=True):
        for kind, mark in (("metrics", "m"), ("runs", "r")):
            prefix = f"{kind}/project={projects[row]}/run={runs[row]}"
            if path == prefix or path.startswith(prefix + "/"):
                path = mark + path[len(prefix):]
                break
        short.append(path)
    paths = pa.array(short, pa.string())
    items = pa.StructArray.from_arrays([paths, flat.field("mtime_ns")], ["path", "mtime_ns"])
    return pa.ListArray.from_arrays(watched.offsets, items)


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
    print("each column alone with lz4, bytes a run: " + ", ".join(
        f"{name} {len(encoded(table.select([name]), 'lz4')) / runs:.0f}"
        for name in table.column_names))
    relative = pa.table({"watched": relative_watched(table)})
    shorter = table.set_column(table.schema.get_field_index("watched"), "watched",
                               relative.column("watched"))
    print(f"watched paths relative to their run, lz4: "
          f"{len(encoded(relative, 'lz4')) / runs:.0f} bytes a run; the whole table then "
          f"{len(encoded(shorter, 'lz4')) / runs:.0f} against "
          f"{len(encoded(table, 'lz4')) / runs:.0f}")
    print(f"{'encoding':<10}{'bytes a run':>12}{'decode, ms':>12}")
    for compression in (None, "lz4", "zstd"):
        data = encoded(table, compression)
        print(f"{compression or 'plain':<10}{len(data) / runs:>12.0f}"
              f"{best_decode(data, args.repeat) * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
