#!/usr/bin/env python
"""Wide runs: what 100,000 keys in one run cost per value, against 100 keys logged 1,000
times as often (the same number of values).

For each shape (``--keys`` x ``--steps``), a run is written through the real write path
(``init`` / one ``log`` of every key per step / ``finish``), then compacted
(``tracklake.compact``), then shown (``tracklake show``, the CLI's summary of a run),
each timed; best of ``--repeat`` fresh stores, in seconds. The ratio is wide / narrow,
each shape holding ``keys x steps`` values; the target is under 2 for compaction.

``--export tensorboard,mlflow,wandb,swanlab`` then exports each shape's keys, at
``--export-values`` values (the steps cut to fit), through tracklake's exporter as
``benchmarks/export.py`` does (MLflow into sqlite, W&B and SwanLab offline), once each,
and prints the seconds and the ratio wide / narrow per destination.

Usage (from the repository root)::

    python benchmarks/wide_runs.py                      # 100,000 x 10 against 100 x 10,000
    python benchmarks/wide_runs.py --wide 20000x10 --narrow 100x2000 --repeat 1
    python benchmarks/wide_runs.py --repeat 1 --export tensorboard,mlflow,wandb,swanlab
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _shape(text: str) -> tuple[int, int]:
    keys, steps = text.lower().split("x")
    return int(keys), int(steps)


def _write(root: Path, keys: int, steps: int) -> None:
    import tracklake

    names = [f"layer{k // 1000}/k{k}" for k in range(keys)]
    with tracklake.init(project="w", run_id="wide", root=root, capture_identity=False,
                        compact=False) as run:
        for step in range(steps):
            run.log({name: float(k + step) for k, name in enumerate(names)}, step=step)


def _one(root: Path, keys: int, steps: int) -> dict[str, float]:
    import tracklake

    started = time.perf_counter()
    _write(root, keys, steps)
    written = time.perf_counter()
    tracklake.compact(root=root)
    compacted = time.perf_counter()
    shown = subprocess.run([sys.executable, "-m", "tracklake._cli.main", "show", "wide",
                            "--root", str(root)], check=True, capture_output=True, text=True)
    done = time.perf_counter()
    got = tracklake.query("SELECT count(*) AS n, count(DISTINCT key) AS k FROM metrics",
                          root=root).to_pylist()[0]
    if got != {"n": keys * steps, "k": keys}:
        raise SystemExit(f"{keys} x {steps}: the store holds {got}")
    return {"log": written - started, "compact": compacted - written,
            "show": done - compacted, "show_lines": float(shown.stdout.count("\n"))}


def _export(destination: str, keys: int, values: int) -> float:
    """Seconds tracklake's exporter takes to export a compacted run of `keys` keys and
    `values` values in all into `destination` (export.py's `via_tracklake`)."""
    from export import via_tracklake

    import tracklake

    folder = Path(tempfile.mkdtemp(prefix="tracklake-wide-export-"))
    try:
        root = folder / "store"
        _write(root, keys, max(1, values // keys))
        tracklake.compact(root=root)
        options = {"tensorboard": {"logdir": folder / "tb"},
                   "mlflow": {"tracking_uri": f"sqlite:///{folder}/mlflow.db"},
                   "wandb": {"mode": "offline", "dir": str(folder / "wandb")},
                   "swanlab": {"mode": "offline", "logdir": str(folder / "swanlab")}}
        return via_tracklake(destination, root, **options[destination])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wide", type=_shape, default=(100_000, 10))
    parser.add_argument("--narrow", type=_shape, default=(100, 10_000))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--export", default="",
                        help="Destinations to export each shape's keys to, comma-separated.")
    parser.add_argument("--export-values", type=int, default=200_000)
    args = parser.parse_args()
    best: dict[str, dict[str, float]] = {}
    for label, (keys, steps) in (("wide", args.wide), ("narrow", args.narrow)):
        for _ in range(args.repeat):
            root = Path(tempfile.mkdtemp(prefix="tracklake-wide-"))
            try:
                got = _one(root / "store", keys, steps)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            best[label] = {k: min(v, best.get(label, {}).get(k, v)) for k, v in got.items()}
        print(f"{label:6} {keys:>7,} keys x {steps:>6,} steps: "
              + ", ".join(f"{k} {v:.2f}" + ("" if k == "show_lines" else " s")
                          for k, v in best[label].items()), flush=True)
    for measure in ("log", "compact", "show"):
        print(f"wide / narrow, {measure}: {best['wide'][measure] / best['narrow'][measure]:.1f}")
    for destination in filter(None, args.export.split(",")):
        took = {label: _export(destination, keys, args.export_values)
                for label, (keys, _) in (("wide", args.wide), ("narrow", args.narrow))}
        print(f"export to {destination}, {args.export_values:,} values: wide "
              f"{took['wide']:.2f} s, narrow {took['narrow']:.2f} s, wide / narrow "
              f"{took['wide'] / took['narrow']:.1f}", flush=True)


if __name__ == "__main__":
    main()
