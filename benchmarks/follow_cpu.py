#!/usr/bin/env python
"""What one following exporter costs in CPU while a trainer writes, per exported value.

A writer process logs 64 metrics every 10 ms for ``--seconds`` (default flush every
0.5 s, as a trainer does); ``tracklake export DEST --run ID --follow --while-pid WRITER``
follows it in its own process, as a sidecar does, and exits once the writer is gone and
everything is exported. Reported: the exporter's CPU seconds (user + system, from
``resource.getrusage(RUSAGE_CHILDREN)`` after it exited), the values it exported, and
CPU µs per value; the start (imports) is included, as a sidecar pays it too.

Usage (from the repository root)::

    python benchmarks/follow_cpu.py --seconds 30 [--dest tensorboard] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WRITER = textwrap.dedent("""
    import sys, time, tracklake
    root, seconds = sys.argv[1], float(sys.argv[2])
    run = tracklake.init(project="bench", root=root, capture_identity=False, compact=False)
    print(run.id, flush=True)
    end, step = time.time() + seconds, 0
    while time.time() < end:
        run.log({f"m{i}": float(step + i) for i in range(64)}, step=step)
        step += 1
        time.sleep(0.01)
    run.finish()
    print(step * 64, flush=True)
""")

OPTIONS = {"tensorboard": lambda tmp: ["--logdir", str(tmp / "tb")],
           "wandb": lambda tmp: ["--dir", str(tmp / "wandb"), "--mode", "offline"],
           "memory": lambda tmp: []}


def measure(dest: str, seconds: float) -> dict[str, float]:
    """CPU of one followed export of a run written for `seconds`."""
    exe = Path(sys.executable).with_name("tracklake")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        script = tmp / "writer.py"
        script.write_text(WRITER)
        writer = subprocess.Popen([sys.executable, str(script), str(tmp / "store"),
                                   str(seconds)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None
        run_id = writer.stdout.readline().strip()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        exporter = subprocess.run(
            [str(exe), "export", dest, "--root", str(tmp / "store"), "--project", "bench",
             "--run", run_id, "--follow", "--while-pid", str(writer.pid),
             *OPTIONS[dest](tmp)], capture_output=True, text=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        values = int(writer.stdout.readline())
        writer.wait()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if f"{values} records" not in exporter.stdout:
        raise SystemExit(f"the exporter did not export all {values} values:\n"
                         f"{exporter.stdout}{exporter.stderr}")
    return {"values": values, "exporter_cpu_s": cpu, "cpu_us_per_value": cpu / values * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--dest", default="tensorboard", choices=sorted(OPTIONS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = {"dest": args.dest, "seconds": args.seconds, **measure(args.dest, args.seconds)}
    print(f"{args.dest} follower: {result['values']:,} values in {args.seconds:.0f} s, "
          f"{result['exporter_cpu_s']:.2f} CPU s, "
          f"{result['cpu_us_per_value']:.1f} µs CPU per exported value")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
