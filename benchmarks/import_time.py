"""What `import tracklake` costs beyond `import pyarrow`.

    python benchmarks/import_time.py [--runs 21]

Each candidate is imported in a fresh interpreter, alternating, and timed with
`-X importtime` (the cumulative microseconds of the top-level import); medians are
printed with the ratio to pyarrow. Also lists the heavy modules tracklake must not load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CANDIDATES = ("pyarrow", "tracklake")
HEAVY = ("duckdb", "torch", "wandb", "mlflow", "swanlab", "tensorboard", "pyarrow.parquet",
         "pyarrow.compute")


def import_us(module: str) -> int:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                         capture_output=True, text=True, check=True).stderr
    for line in reversed(out.splitlines()):
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise RuntimeError(f"no importtime line for {module}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    times: dict[str, list[int]] = {c: [] for c in CANDIDATES}
    for _ in range(args.runs):
        for c in CANDIDATES:
            times[c].append(import_us(c))
    med = {c: statistics.median(v) for c, v in times.items()}
    for c in CANDIDATES:
        print(f"import {c:<10} median {med[c] / 1000:7.1f} ms  (min {min(times[c]) / 1000:.1f})")
    print(f"tracklake / pyarrow: {med['tracklake'] / med['pyarrow']:.2f}x; "
          f"extra {(med['tracklake'] - med['pyarrow']) / 1000:.1f} ms")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, tracklake; print(' '.join(m for m in "
         f"{HEAVY!r} if m in sys.modules))"], capture_output=True, text=True, check=True)
    print(f"heavy modules loaded by import tracklake: {loaded.stdout.strip() or 'none'}")


if __name__ == "__main__":
    main()
