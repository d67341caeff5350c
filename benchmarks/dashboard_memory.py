#!/usr/bin/env python
"""The memory of a `tracklake ui` server asked for whole pages of charts, page after page.

Starts ``python -m tracklake._cli.main ui --root ROOT`` on a free loopback port, then asks
``--pages`` times for the data of a page of every key's chart of every run, as the page
asks (``GET /api/series_batch`` in batches of up to 16 keys and about a million points,
six requests at a time; `dashboard.py` describes them), and prints after each page its
seconds, the server's resident memory (``VmRSS``, with any children) and the most it
held (``VmHWM``); then the resident memory again after ``--idle`` seconds without a
request. Extra ``NAME=VALUE`` arguments go into the server's environment (to compare
allocators, say ``ARROW_DEFAULT_MEMORY_POOL=mimalloc``).

Usage (from the repository root; a store such as ``dashboard.py --runs 1000 --keys 50
--steps 200`` logs)::

    python benchmarks/dashboard_memory.py --root STORE
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dashboard import (
    free_port,
    page_batches,
    peak_rss_bytes,
    request,
    rss_bytes,
    series_batch,
    start_server,
    stop,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("env", nargs="*", help="NAME=VALUE for the server's environment")
    args = parser.parse_args()
    env = dict(os.environ) | dict(kv.split("=", 1) for kv in args.env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server, started = start_server(
        [sys.executable, "-m", "tracklake._cli.main", "ui", "--root", str(args.root),
         "--port", str(port)], env, base + "/")
    mib = 1 << 20
    try:
        print(f"started in {started:.2f} s, RSS {rss_bytes(server.pid) / mib:.0f} MiB")
        runs = request(base + "/api/runs")["runs"]  # type: ignore[index]
        ids = [("run", f"{r['project']}/{r['run']}") for r in runs]
        keys: list[dict[str, int | str]] = request(base + "/api/keys")  # type: ignore[assignment]
        names = [str(k["key"]) for k in keys]
        points = max([int(k["points"]) for k in keys] or [1])
        batches = page_batches(names, len(runs), points)
        print(f"{len(runs)} runs, {len(names)} keys, {len(batches)} requests a page")
        for page in range(args.pages):
            start = time.perf_counter()
            with ThreadPoolExecutor(6) as pool:
                list(pool.map(lambda keys: series_batch(base, keys, ids), batches))
            print(f"page {page + 1}: {time.perf_counter() - start:.2f} s, "
                  f"RSS {rss_bytes(server.pid) / mib:.0f} MiB, "
                  f"peak {peak_rss_bytes(server.pid) / mib:.0f} MiB")
        time.sleep(args.idle)
        print(f"after {args.idle:.0f} s idle: RSS {rss_bytes(server.pid) / mib:.0f} MiB")
    finally:
        stop(server)


if __name__ == "__main__":
    main()
