#!/usr/bin/env python
"""One pass of the bundle builder over an existing store: what the deriver a finished
run's compactor starts does in the background (once every `BUILD_EVERY_SECONDS` while
runs keep settling), what a reader's builder and `tracklake compact` over a store do.

Each pass runs in a fresh process (``python -c``, tracklake from the same place as this
one's), as the deriver does: printed are its wall seconds, its peak resident memory
(MiB) and that per run of the store.

- warm: the store as it is, asked ``--repeat`` times (after the first, nothing is new:
  the cost of a pass that finds nothing to do, every pass in a long sweep but the few
  that bundle);
- ``--cold DIR``: first on a copy of the store without its catalog and bundles (hard
  links to its files, their times kept): a store restored from a backup, unpacked or
  written with bundles off, whose every run the pass catalogs and bundles.

    python benchmarks/builder_pass.py --root /tmp/tiny-1m/grown/store --repeat 2
    python benchmarks/builder_pass.py --root STORE --cold /tmp/cold-copy --cold-runs 50000
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

_PASS = """
import json, resource, sys, time
from pathlib import Path
from tracklake._ops.bundle import build_bundles
began = time.perf_counter()
report = build_bundles(Path(sys.argv[1]))
print(json.dumps({"seconds": time.perf_counter() - began, "runs": report.runs,
                  "written": len(report.written), "removed": len(report.removed),
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def one_pass(root: Path) -> dict[str, float]:
    """A builder pass over `root` in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _PASS, str(root)], check=True,
                         capture_output=True, text=True, env={**os.environ,
                                                              "TRACKLAKE_BUNDLES": "1"})
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def cold_copy(root: Path, to: Path, runs: int | None = None) -> None:
    """`root` at `to` without `.cache` (with `runs`, only the first that many runs of
    each project, by name): its files hard-linked, every time kept (a directory made now
    would be too fresh to catalog)."""
    shutil.rmtree(to, ignore_errors=True)
    if runs is None:
        shutil.copytree(root, to, copy_function=os.link,
                        ignore=shutil.ignore_patterns(".cache"))
        return
    for kind in ("runs", "metrics"):
        for project in sorted(os.listdir(root / kind)):
            names = sorted(n for n in os.listdir(root / kind / project)
                           if n.startswith("run="))[:runs]
            for name in names:
                shutil.copytree(root / kind / project / name, to / kind / project / name,
                                copy_function=os.link)
            shutil.copystat(root / kind / project, to / kind / project)
        shutil.copystat(root / kind, to / kind)
    shutil.copystat(root, to)


def count_runs(root: Path) -> int:
    return sum(len([n for n in os.listdir(root / "runs" / p) if n.startswith("run=")])
               for p in os.listdir(root / "runs") if p.startswith("project="))


def _line(what: str, runs: int, r: dict[str, float]) -> str:
    return (f"{what:<34} {r['seconds']:8.2f} s {r['peak_mib']:8.0f} MiB "
            f"{r['peak_mib'] * 2**20 / max(runs, 1):8.0f} B/run   bundled {r['runs']:.0f} "
            f"runs in {r['written']:.0f} bundles, {r['removed']:.0f} removed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cold", type=Path, help="Also pass over a copy made here "
                        "without catalog or bundles (removed after).")
    parser.add_argument("--cold-runs", type=int, help="Only this many runs of each "
                        "project in the copy.")
    args = parser.parse_args()
    runs = count_runs(args.root)
    print(f"{args.root}: {runs:,} runs")
    if args.cold is not None:
        began = time.perf_counter()
        cold_copy(args.root, args.cold, args.cold_runs)
        copied = count_runs(args.cold)
        print(f"(copy of {copied:,} runs made in {time.perf_counter() - began:.1f} s)")
        print(_line("cold: no catalog, no bundle", copied, one_pass(args.cold)))
        print(_line("the next pass: nothing new", copied, one_pass(args.cold)))
        shutil.rmtree(args.cold, ignore_errors=True)
    for i in range(args.repeat):
        print(_line(f"warm pass {i + 1}", runs, one_pass(args.root)))


if __name__ == "__main__":
    main()
