#!/usr/bin/env python
"""`tracklake runs` on a store whose run catalog is not written yet: a store restored
from a backup or unpacked, written with the deriver stopped or killed, or many runs
live at once. What the first listings cost, and how soon the builder the first one
starts in the background has catalogued the runs.

A copy of ``--root`` without ``.cache`` is made at ``--copy`` (hard links, times kept:
`builder_pass.cold_copy`; with ``--runs N`` only the first N runs of each project),
then, each in a fresh process (``python -m tracklake._cli.main runs``, its wall
seconds and peak resident memory from `os.wait4`):

1. the first listing, right after the copy;
2. the second, at once (the builder the first started, if any, still at work);
3. once that builder is done (its process gone, ``.cache/bundles/.checked`` written: its
   wall time from the first listing's end), the next listing.

``--pythonpath DIR`` runs the listings with tracklake from DIR (the code before a
change, say), ``--bundles off`` with ``TRACKLAKE_BUNDLES=0``.

    python benchmarks/cold_listing.py --root /tmp/nocat --copy /tmp/cold-copy
    python benchmarks/cold_listing.py --root STORE --copy /tmp/cold-copy --runs 50000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from builder_pass import cold_copy, count_runs

#: Longest wait for the builder a listing started.
_BUILDER_TIMEOUT = 4 * 3600.0


def listing(root: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak MiB of one `tracklake runs --root ROOT` in a fresh process."""
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tracklake._cli.main", "runs", "--root",
                             str(root)], stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"tracklake runs failed: exit status {proc.returncode}")
    return time.perf_counter() - began, usage.ru_maxrss / 1024


def builders(root: Path) -> list[int]:
    """The builders (``python -m tracklake._ops.bundle ROOT``) running for `root`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tracklake._ops.bundle" in argv and str(root).encode() in argv:
            found.append(int(pid))
    return found


def builder_done(root: Path, since: float) -> float | None:
    """Wall seconds from `since` until the builders running for `root` are gone and one
    marked its pass done (epoch time in ``.checked``); None if none ran."""
    while builders(root) and time.time() - since < _BUILDER_TIMEOUT:
        time.sleep(0.5)
    try:
        ended = json.loads((root / ".cache" / "bundles" / ".checked").read_bytes())["ended"]
    except (OSError, ValueError, KeyError):
        return None
    return float(ended) - since if ended >= since else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--copy", type=Path, required=True,
                        help="Where the copy without catalog is made (removed after).")
    parser.add_argument("--runs", type=int, help="Only this many runs of each project.")
    parser.add_argument("--pythonpath", help="tracklake from this directory.")
    parser.add_argument("--bundles", choices=("on", "off"), default="on")
    args = parser.parse_args()
    env = {**os.environ, "TRACKLAKE_BUNDLES": "1" if args.bundles == "on" else "0"}
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    cold_copy(args.root, args.copy, args.runs)
    print(f"{args.copy}: {count_runs(args.copy):,} runs, no catalog "
          f"(bundles {args.bundles}{', ' + args.pythonpath if args.pythonpath else ''})")
    try:
        seconds, mib = listing(args.copy, env)
        first_ended = time.time()
        print(f"first listing                 {seconds:8.2f} s {mib:7.0f} MiB")
        seconds, mib = listing(args.copy, env)
        print(f"second, at once               {seconds:8.2f} s {mib:7.0f} MiB")
        built = builder_done(args.copy, first_ended)
        print("builder started by the first  " + (
            f"{built:8.2f} s after it" if built is not None else "none, or not done"))
        seconds, mib = listing(args.copy, env)
        print(f"the next listing              {seconds:8.2f} s {mib:7.0f} MiB")
    finally:
        shutil.rmtree(args.copy, ignore_errors=True)


if __name__ == "__main__":
    main()
