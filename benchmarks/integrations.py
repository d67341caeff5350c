#!/usr/bin/env python
"""What a tracker's transformers callback costs the training loop: steps/s of one tiny
Trainer (CPU, one process) with no tracker, with tracklake's `TracklakeCallback`, with
transformers' own `WandbCallback` (W&B offline) and with its `TrackioCallback` (trackio's
local store), side by side in one run.

The model is a one-layer GPT-2 of 8 dimensions built here (no hub download), trained for
``--steps`` optimizer steps (default 400) with ``logging_steps=1``, so every step goes
through the callback's ``on_log`` (loss, grad_norm, learning_rate, epoch). Each contender
runs in a fresh interpreter (its own temporary HOME, store and offline directories), the
contenders alternate for ``--repeats`` rounds (default 3), and the time measured is
``trainer.train()`` alone: imports, model building and the process's exit are left out.
Reported: median steps/s per contender and its ratio to no tracker (1.0 costs nothing).

Usage (from the repository root)::

    python benchmarks/integrations.py [--steps 400] [--repeats 3] [--json out.json]

Needs ``.[transformers,bench]`` and torch; a contender whose package is missing is skipped
with a printed reason. Nothing touches the network (W&B offline, HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDERS = ("none", "tracklake", "wandb", "trackio")
NEEDS = {"tracklake": "tracklake", "wandb": "wandb", "trackio": "trackio"}


def child(contender: str, steps: int, workdir: Path) -> dict[str, float]:
    """One contender's Trainer, timed around `train()`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.ids = torch.randint(0, 64, (256, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    callbacks: list[Any] = []
    report_to = "none"
    if contender == "tracklake":
        from tracklake.integrations.transformers import TracklakeCallback

        callbacks.append(TracklakeCallback(project="bench", root=str(workdir / "store")))
    elif contender in ("wandb", "trackio"):
        report_to = contender
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=64,
                                       n_positions=16))
    args = TrainingArguments(output_dir=str(workdir / "out"), max_steps=steps,
                             per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                             use_cpu=True, report_to=report_to, disable_tqdm=True,
                             dataloader_num_workers=0, run_name="bench", project="bench")
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps_per_s": steps / seconds}


def run_child(contender: str, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{contender}-") as d:
        workdir = Path(d)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TRACKLAKE_", "WANDB_", "TRACKIO_"))}
        env |= {"HOME": str(workdir), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
                "WANDB_DIR": str(workdir), "WANDB_SILENT": "true", "WANDB_PROJECT": "bench",
                "TRACKIO_DIR": str(workdir / "trackio"), "OMP_NUM_THREADS": "1",
                "TRACKLAKE_COMPACT": "0", "DISABLE_MLFLOW_INTEGRATION": "TRUE"}
        proc = subprocess.run(
            [sys.executable, __file__, "--child", contender, "--steps", str(steps),
             "--workdir", str(workdir)], env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{contender} failed:\n{proc.stderr[-3000:]}")
        last = proc.stdout.strip().splitlines()[-1]
        result: dict[str, float] = json.loads(last)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts.steps, opts.workdir)))
        return
    contenders = []
    for name in CONTENDERS:
        module = NEEDS.get(name)
        if module and importlib.util.find_spec(module) is None:
            print(f"{name}: skipped, {module} is not installed")
            continue
        contenders.append(name)
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(opts.repeats):
        for name in contenders:
            rates[name].append(run_child(name, opts.steps)["steps_per_s"])
            print(f"round {round_ + 1}: {name:<10} {rates[name][-1]:8.1f} steps/s", flush=True)
    base = statistics.median(rates["none"])
    summary = {name: {"median_steps_per_s": statistics.median(r),
                      "ratio_to_none": statistics.median(r) / base, "rounds": r}
               for name, r in rates.items()}
    print(f"\n{opts.steps} steps, logging every step, median of {opts.repeats} rounds")
    print(f"{'contender':<10} {'steps/s':>9} {'x no tracker':>13}")
    for name, s in summary.items():
        print(f"{name:<10} {s['median_steps_per_s']:9.1f} {s['ratio_to_none']:13.3f}")
    if opts.json:
        opts.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
