"""What `import tracklake` and `init()` cost beyond `import pyarrow`.

    python benchmarks/import_time.py [--runs 21]

Each candidate is imported in a fresh interpreter, alternating, and timed with
`-X importtime` (the cumulative microseconds of the top-level import); medians are
printed with the ratio to pyarrow. Then, also in fresh interpreters, the wall time of
`import pyarrow` against `import tracklake` + `tracklake.init()` (into a temporary root,
with and without identity capture), which is what a training rank pays before its first
step; pandas, when installed, must not be imported by it (pyarrow's `pa.array()` would).
Also lists the heavy modules tracklake must not load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile

CANDIDATES = ("pyarrow", "tracklake")
HEAVY = ("duckdb", "torch", "wandb", "mlflow", "swanlab", "tensorboard", "pyarrow.parquet",
         "pyarrow.compute", "pandas")
#: Timed in a fresh interpreter each: (label, code). `{root}` is a fresh directory.
WALL = (
    ("import pyarrow", "import pyarrow"),
    ("import tracklake + init()", "import tracklake\n"
     "tracklake.init(project='bench', root={root!r}).finish()"),
    ("import tracklake + init(capture_identity=False)", "import tracklake\n"
     "tracklake.init(project='bench', root={root!r}, capture_identity=False).finish()"),
)


def import_us(module: str) -> int:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                         capture_output=True, text=True, check=True).stderr
    for line in reversed(out.splitlines()):
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise RuntimeError(f"no importtime line for {module}")


def wall_us(code: str) -> int:
    """Wall microseconds of `code` in a fresh interpreter (after interpreter start-up)."""
    with tempfile.TemporaryDirectory(prefix="tracklake-import-") as root:
        timed = ("import time as _t\n_t0 = _t.perf_counter()\n" + code.format(root=root)
                 + "\nprint(int((_t.perf_counter() - _t0) * 1e6))")
        out = subprocess.run([sys.executable, "-c", timed], capture_output=True, text=True,
                             check=True).stdout
    return int(out.split()[-1])


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
    walls: dict[str, list[int]] = {label: [] for label, _ in WALL}
    for _ in range(args.runs):
        for label, code in WALL:
            walls[label].append(wall_us(code))
    base = statistics.median(walls["import pyarrow"])
    for label, values in walls.items():
        m = statistics.median(values)
        print(f"{label:<48} median {m / 1000:7.1f} ms  (+{(m - base) / 1000:.1f} ms over "
              "import pyarrow)")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, tracklake; print(' '.join(m for m in "
         f"{HEAVY!r} if m in sys.modules))"], capture_output=True, text=True, check=True)
    print(f"heavy modules loaded by import tracklake: {loaded.stdout.strip() or 'none'}")
    with tempfile.TemporaryDirectory(prefix="tracklake-import-") as root:
        loaded = subprocess.run(
            [sys.executable, "-c", "import sys, tracklake\n"
             f"run = tracklake.init(project='bench', root={root!r})\n"
             "run.log({'x': 1.0}, step=0); run.finish()\n"
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
            capture_output=True, text=True, check=True)
    print("heavy modules loaded by init() + log() + finish(): "
          f"{loaded.stdout.strip() or 'none'}")


if __name__ == "__main__":
    main()
