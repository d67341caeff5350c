#!/usr/bin/env python
"""What an open dashboard page costs the server while it polls.

Starts ``python -m tracklake._cli.main ui --root ROOT`` on a free loopback port and asks
``--repeat`` times for what the page's poll asks every second: the run list
(``/api/runs``), and, while a shown run is live, the keys (``/api/keys``). Prints, per
request, the first answer's seconds and the median of the others, the server's CPU
seconds for it (from ``/proc/PID/stat``, user + system) and the answer's size. The page
polls every second, but never sooner than twice as long as the last poll took after it
ended (`store/_ui/static/app.js`), so a run list answered in T seconds with C seconds of
CPU keeps about C / max(1, 3T) of a core busy while a page is open and in view.

Usage (from the repository root; a store such as ``read_cost.py --sizes 10000`` builds)::

    python benchmarks/dashboard_poll.py --root STORE
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dashboard import free_port, start_server, stop


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server, _ = start_server(
        [sys.executable, "-m", "tracklake._cli.main", "ui", "--root", str(args.root),
         "--port", str(port)], dict(os.environ), base + "/")
    try:
        for path in ("/api/runs", "/api/keys"):
            seconds, cpu, size = [], [], 0
            for _ in range(args.repeat):
                used, started = cpu_seconds(server.pid), time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=600) as answer:
                    size = len(answer.read())
                seconds.append(time.perf_counter() - started)
                cpu.append(cpu_seconds(server.pid) - used)
            print(f"{path}: first {seconds[0]:.3f} s, then median "
                  f"{statistics.median(seconds[1:]):.3f} s, server CPU "
                  f"{statistics.median(cpu[1:]):.2f} s, {size / 1024:.0f} KiB")
    finally:
        stop(server)


if __name__ == "__main__":
    main()
