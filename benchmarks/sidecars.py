#!/usr/bin/env python
"""What sidecar exporters cost a training loop: a real CPU torch loop, with and without them.

One process runs, interleaved over ``--reps`` rounds, the same loop under three setups:

1. none        no tracker: the loop computes its ~64 metrics and drops them
2. tracklake   ``run.log(metrics, step=i)`` and validation generations every 100 steps
3. +sidecars   the same, with ``init(export=...)``: by default TensorBoard and W&B
               offline (``--export``), two exporter processes following the run

The loop: an MLP (512 wide, batch 64, SGD) on fixed random data, one thread for torch,
``--steps`` steps; its 64 metrics are loss, per-parameter gradient and weight norms and a
few batch statistics (the shape of verl's per-step dict). Reported per setup: median step
time over the rounds, overhead versus ``none`` in % (median, with min..max over rounds),
and for ``+sidecars`` the CPU seconds the exporter processes used, per exported value
(from ``resource.getrusage(RUSAGE_CHILDREN)`` once they have exited). On a machine with
few cores the sidecars compete with training for CPU: that cost shows in the +sidecars
row, and the per-value CPU says how much of it there is to compete with.

Usage (from the repository root)::

    python benchmarks/sidecars.py --steps 600 --reps 3 [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_SILENT", "true")

import torch

import tracklake

SETUPS = ("none", "tracklake", "+sidecars")


def make_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 16))
    x, y = torch.randn(64, 512), torch.randint(0, 16, (64,))
    return model, x, y, torch.optim.SGD(model.parameters(), lr=1e-3)


def metrics_of(model: torch.nn.Module, loss: torch.Tensor, logits: torch.Tensor
               ) -> dict[str, float]:
    out = {"actor/loss": float(loss.detach())}
    for name, p in model.named_parameters():
        assert p.grad is not None
        out[f"actor/grad_norm/{name}"] = float(p.grad.norm())
        out[f"actor/weight_norm/{name}"] = float(p.norm())
        out[f"actor/grad_max/{name}"] = float(p.grad.abs().max())
    stats = torch.cat([logits.mean(0), logits.std(0)]).tolist()
    out.update({f"critic/logit_stat/{i}": v for i, v in enumerate(stats)})
    out.update({f"timing_s/phase{i}": 0.01 * i for i in range(64 - len(out))})
    return out


def train(steps: int, setup: str, tmp: Path, destinations: list[str]
          ) -> tuple[float, dict[str, Any]]:
    """Seconds per step of one run of the loop under `setup`, and what the sidecars cost."""
    model, x, y, opt = make_model()
    run = None
    if setup != "none":
        options = {"tensorboard": {"logdir": str(tmp / "tb")},
                   "wandb": {"mode": "offline", "dir": str(tmp / "wandb")},
                   "mlflow": {"tracking_uri": f"sqlite:///{tmp}/mlflow.db"}}
        export = ({d: options.get(d) for d in destinations} if setup == "+sidecars"
                  else None)
        run = tracklake.init(project="bench", root=tmp / "store", export=export,
                             capture_identity=False)
    sidecars = run._sidecars if run is not None else None  # to wait for them at the end
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for step in range(steps):
        opt.zero_grad()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        metrics = metrics_of(model, loss, logits)
        if run is not None:
            run.log(metrics, step=step)
            if step % 100 == 99:
                run.log_generations([(f"prompt {i}", f"answer {i} " * 20, 1.0)
                                     for i in range(8)], step=step, key="val/generations")
    elapsed = time.perf_counter() - start
    extra: dict[str, Any] = {}
    if run is not None:
        run.finish()
    if sidecars is not None:
        while any(s.process is None or s.process.poll() is None for s in sidecars.sidecars):
            time.sleep(0.2)  # the supervisor reaps them; their CPU is then in RUSAGE_CHILDREN
        sidecars.stop()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (children_before.ru_utime
                                                   + children_before.ru_stime)
        values = steps * 64 * len(sidecars.sidecars)
        extra = {"sidecar_cpu_s": cpu, "sidecar_cpu_us_per_value": cpu / values * 1e6}
    return elapsed / steps, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--export", default="tensorboard,wandb",
                        help="the sidecars' destinations (default: tensorboard,wandb)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {s: [] for s in SETUPS}
    cpu: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for setup in SETUPS if rep % 2 == 0 else SETUPS[::-1]:  # interleaved, alternating
            with tempfile.TemporaryDirectory() as tmp:
                per_step, extra = train(args.steps, setup, Path(tmp),
                                        args.export.split(","))
            times[setup].append(per_step)
            if extra:
                cpu.append(extra)
            print(f"round {rep + 1} {setup:10s} {per_step * 1e3:8.3f} ms/step", flush=True)
    base = times["none"]
    result: dict[str, Any] = {"steps": args.steps, "reps": args.reps, "cores": os.cpu_count(),
                              "export": args.export}
    print(f"\n{'setup':10s} {'ms/step':>8s}  overhead vs none (median, min..max over rounds)")
    for setup in SETUPS:
        over = [(t / b - 1) * 100 for t, b in zip(times[setup], base, strict=True)]
        result[setup] = {"ms_per_step": statistics.median(times[setup]) * 1e3,
                         "overhead_pct": statistics.median(over),
                         "overhead_pct_range": [min(over), max(over)]}
        print(f"{setup:10s} {statistics.median(times[setup]) * 1e3:8.3f}  "
              f"{statistics.median(over):+6.2f} % ({min(over):+.2f}..{max(over):+.2f})")
    if cpu:
        per_value = statistics.median(c["sidecar_cpu_us_per_value"] for c in cpu)
        result["sidecar_cpu_us_per_value"] = per_value
        result["sidecar_cpu_s"] = statistics.median(c["sidecar_cpu_s"] for c in cpu)
        print(f"sidecars: {result['sidecar_cpu_s']:.2f} CPU s per run, "
              f"{per_value:.1f} µs CPU per exported metric value ({args.export})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
