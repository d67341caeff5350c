#!/usr/bin/env python
"""How much a tracker slows a verl user's training loop: tracklake against verl's own
in-process backends, each driven through verl's own `Tracking` and
`ValidationGenerationsLogger` (verl 0.9.1, with tracklake's ``verl.plugins`` entry point
installed, so ``tracklake`` is one more backend name).

The loop is real CPU training: a 2-layer torch MLP (512 -> 1024 -> 512, batch 64, Adam,
one torch thread). Every step logs 64 metrics under verl's names (``actor/pg_loss``,
``critic/score/mean``, ``timing_s/gen``, ``val-core/.../acc/mean@1``, ...) with
``tracking.log(data, step)``; every 100 steps 16 validation samples go through
``ValidationGenerationsLogger.log(loggers, samples, step)``, as verl's trainer does.

Contenders (each in a fresh interpreter, so that no SDK's global state leaks):

  none          the loop alone
  tracklake     trainer.logger=[tracklake]
  tracklake+2   the same while two exporters follow the live run in their own processes
                (``tracklake export tensorboard|wandb --run ID --follow``), as sidecars do;
                their CPU seconds per exported value are reported
  wandb         trainer.logger=[wandb], WANDB_MODE=offline
  swanlab       trainer.logger=[swanlab], SWANLAB_MODE=offline
  tensorboard   trainer.logger=[tensorboard] (torch's SummaryWriter, as verl uses it)
  mlflow        trainer.logger=[mlflow], MLFLOW_TRACKING_URI=sqlite:///... (verl's default
                kind of store), in a temporary directory

Reps are interleaved (every rep runs every contender once, in a shuffled order) and each
contender's loop time is compared with the ``none`` run of the same rep: overhead % =
loop / none - 1, reported as the median over reps with the lowest and highest. The loop
time is the training loop only (init and finish are reported apart). On a shared or
2-core machine the noise is large: read the spread, not only the median. The time spent
inside the logging calls themselves is measured too: ``log ms/step`` (their total over
the steps, which includes the generation steps and any preemption) and ``log us median``
(the median step's calls, robust to a loaded machine), with the mean as % of the
untracked step. It does not see work a tracker's threads or processes do meanwhile,
which the loop time does.

Usage (from the repository root)::

    python benchmarks/verl_overhead.py --steps 300 --reps 3        # short
    python benchmarks/verl_overhead.py --steps 2000 --reps 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDERS = ["none", "tracklake", "tracklake+2", "wandb", "swanlab", "tensorboard", "mlflow"]
BACKEND = {"tracklake+2": "tracklake"}
SIDECARS = ("tensorboard", "wandb")
VAL_EVERY = 100
SAMPLES_PER_VAL = 16

#: 64 metric names as verl's PPO trainer logs them (metric_utils, the trainer's timers).
VERL_METRICS = [
    *(f"actor/{k}" for k in ("entropy", "pg_loss", "pg_clipfrac", "pg_clipfrac_lower",
                             "ppo_kl", "grad_norm", "lr", "kl_loss", "kl_coef")),
    *(f"critic/{k}" for k in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr",
                              "vf_explained_var")),
    *(f"critic/{group}/{stat}" for group in ("score", "rewards", "advantages", "returns",
                                             "values") for stat in ("mean", "max", "min")),
    *(f"{group}/{stat}" for group in ("response_length", "prompt_length")
      for stat in ("mean", "max", "min", "clip_ratio")),
    *(f"timing_s/{k}" for k in ("gen", "reward", "old_log_prob", "ref", "values", "adv",
                                "update_critic", "update_actor", "step")),
    *(f"timing_per_token_ms/{k}" for k in ("gen", "ref", "values", "adv", "update_critic",
                                           "update_actor")),
    *(f"perf/{k}" for k in ("total_num_tokens", "time_per_step", "throughput",
                            "max_memory_allocated_gb", "max_memory_reserved_gb",
                            "mfu/actor")),
    "training/global_step", "training/epoch",
    "val-core/openai/gsm8k/acc/mean@1", "val-aux/openai/gsm8k/reward/mean@1",
    "val-core/openai/gsm8k/acc/best@4/mean",
]
assert len(VERL_METRICS) == 64, len(VERL_METRICS)


# -- one contender, in its own interpreter ---------------------------------------------

def child(contender: str, steps: int, work: Path) -> dict[str, Any]:
    """Train `steps` steps logging through verl's Tracking for `contender`; timings."""
    import torch
    from verl.utils.tracking import Tracking, ValidationGenerationsLogger

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    backend = BACKEND.get(contender, contender)
    project, experiment = "bench", f"verl-overhead-{contender}"
    t0 = time.perf_counter()
    tracking = val_logger = None
    if contender != "none":
        tracking = Tracking(project_name=project, experiment_name=experiment,
                            default_backend=[backend], config={"trainer": {"total_steps": steps}})
        val_logger = ValidationGenerationsLogger(project, experiment)
    sidecars = _start_sidecars(work) if contender == "tracklake+2" else []
    init_s = time.perf_counter() - t0
    prompt, answer = "Q: " + "how many apples? " * 18, "A: " + "let me think. " * 60
    loop_s = 0.0
    log_us: list[float] = []
    for step in range(1, steps + 1):
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = float(loss.item())
        t_log = time.perf_counter()
        if tracking is not None:
            tracking.log(data={k: value * (i + 1) for i, k in enumerate(VERL_METRICS)},
                         step=step)
            if step % VAL_EVERY == 0:
                samples = [(f"{prompt}{i}", f"{answer}{step}", float(i % 2))
                           for i in range(SAMPLES_PER_VAL)]
                val_logger.log([backend], samples, step)  # type: ignore[union-attr]
        done = time.perf_counter()
        log_us.append((done - t_log) * 1e6)
        loop_s += done - t
    t = time.perf_counter()
    if tracking is not None:
        tracking.finish(exit_code=0)
    finish_s = time.perf_counter() - t
    result: dict[str, Any] = {"contender": contender, "steps": steps, "init_s": init_s,
                              "loop_s": loop_s, "log_s": sum(log_us) / 1e6,
                              "log_us_median": statistics.median(log_us),
                              "finish_s": finish_s}
    if sidecars:
        result.update(_wait_sidecars(sidecars, steps))
    return result


def _start_sidecars(work: Path) -> list[subprocess.Popen[bytes]]:
    exe = Path(sys.executable).with_name("tracklake")
    run_id = os.environ["TRACKLAKE_RUN_ID"]
    common = ["--root", os.environ["TRACKLAKE_ROOT"], "--run", run_id, "--follow",
              "--state-dir", str(work / "state")]
    options = {"tensorboard": ["--logdir", str(work / "tb-export")],
               "wandb": ["--dir", str(work / "wandb-export"), "--mode", "offline"]}
    return [subprocess.Popen([str(exe), "export", dest, *common, *options[dest]],
                             stdout=subprocess.DEVNULL,
                             stderr=open(work / f"{dest}.log", "wb"))
            for dest in SIDECARS]


def _wait_sidecars(procs: list[subprocess.Popen[bytes]], steps: int) -> dict[str, Any]:
    """Wait for the followers to drain the finished run; their CPU seconds."""
    t = time.perf_counter()
    codes = [p.wait(timeout=600) for p in procs]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # only the sidecars are children
    cpu = usage.ru_utime + usage.ru_stime
    values = steps * len(VERL_METRICS) * len(procs)
    return {"sidecar_exit_codes": codes, "sidecar_drain_s": time.perf_counter() - t,
            "sidecar_cpu_s": cpu, "sidecar_cpu_us_per_value": cpu / values * 1e6}


# -- the driver ----------------------------------------------------------------------

def run_one(contender: str, steps: int, rep: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"verl-overhead-{contender}-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "TRACKLAKE_ROOT": str(work / "store"),
               "TRACKLAKE_RUN_ID": f"bench-{contender.replace('+', '-')}-{rep}",
               "WANDB_MODE": "offline", "WANDB_DIR": str(work), "WANDB_SILENT": "true",
               "WANDB_DISABLE_GIT": "true", "SWANLAB_MODE": "offline",
               "SWANLAB_LOG_DIR": str(work / "swanlog"), "TENSORBOARD_DIR": str(work / "tb"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
               "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1",
               "TRACKLAKE_BENCH_CHILD": "1"}
        out = subprocess.run([sys.executable, __file__, "--child", contender,
                              "--steps", str(steps), "--work", str(work)],
                             env=env, cwd=work, capture_output=True, text=True)
        if out.returncode != 0:
            return {"contender": contender, "error": out.stderr.strip().splitlines()[-3:]}
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.work)))
        return
    contenders = [c for c in args.contenders.split(",") if c]
    if "none" not in contenders:
        contenders.insert(0, "none")
    results: list[dict[str, Any]] = []
    rng = random.Random(0)
    for rep in range(args.reps):
        order = contenders[:]
        rng.shuffle(order)
        for contender in order:
            result = run_one(contender, args.steps, rep) | {"rep": rep}
            results.append(result)
            print(f"rep {rep} {contender:12s} "
                  + (f"loop {result['loop_s']:.2f} s" if "loop_s" in result
                     else f"FAILED {result['error']}"), file=sys.stderr, flush=True)
    report(results, contenders, args.steps)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def report(results: list[dict[str, Any]], contenders: list[str], steps: int) -> None:
    base = {r["rep"]: r["loop_s"] for r in results if r["contender"] == "none" and "loop_s" in r}
    step_ms = statistics.median(base.values()) / steps * 1000 if base else float("nan")
    print(f"\n{steps} steps x 64 verl metrics, generations every {VAL_EVERY} steps; "
          f"median step without a tracker: {step_ms:.2f} ms\n")
    print(f"{'contender':13s} {'overhead %':>11s} {'(min .. max)':>18s} "
          f"{'log ms/step':>12s} {'log %':>7s} {'log us median':>14s} {'init s':>8s} "
          f"{'finish s':>9s}  "
          "sidecar CPU us/value")
    for contender in contenders:
        rows = [r for r in results if r["contender"] == contender and "loop_s" in r
                and r["rep"] in base]
        if not rows:
            print(f"{contender:13s} failed: "
                  f"{next(r.get('error') for r in results if r['contender'] == contender)}")
            continue
        over = [(r["loop_s"] / base[r["rep"]] - 1) * 100 for r in rows]
        side = [r["sidecar_cpu_us_per_value"] for r in rows if "sidecar_cpu_us_per_value" in r]
        log_ms = statistics.median(r["log_s"] for r in rows) / steps * 1000
        print(f"{contender:13s} {statistics.median(over):11.2f} "
              f"{f'({min(over):.2f} .. {max(over):.2f})':>18s} "
              f"{log_ms:12.3f} {log_ms / step_ms * 100:7.2f} "
              f"{statistics.median(r['log_us_median'] for r in rows):14.1f} "
              f"{statistics.median(r['init_s'] for r in rows):8.2f} "
              f"{statistics.median(r['finish_s'] for r in rows):9.2f}  "
              + (f"{statistics.median(side):.1f}" if side else "-"))


if __name__ == "__main__":
    main()
