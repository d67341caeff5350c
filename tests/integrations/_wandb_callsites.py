"""The W&B call sites of the RL codebases (docs/integrations.md lists them), as functions
of the `wandb` module they are given: the real wandb or `tracklake.wandb`. Each is the
codebase's own sequence of calls, with small synthetic values in place of training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

CONFIG = {"lr": 1e-6, "model": {"name": "qwen", "layers": 2}, "seed": 7,
          "env_vars": {"SLURM_JOB_ID": "42"}}


def slime(wandb: ModuleType) -> None:
    """slime's `init_wandb_primary` and `_init_wandb_common`: several x-axes
    (train/step, rollout/step, eval/step, and a float axis, sgl_engine/uptime_sec).
    (slime's `wandb.util.generate_id()` for a random group suffix is left out: wandb 0.31
    no longer has it; tracklake.wandb does.)"""
    group = "slime-exp"
    wandb.init(entity="team", project="slime", group=group, name=group, config=CONFIG,
               settings=wandb.Settings(mode="offline"))
    wandb.define_metric("train/step")
    wandb.define_metric("train/*", step_metric="train/step")
    wandb.define_metric("rollout/step")
    wandb.define_metric("rollout/*", step_metric="rollout/step")
    wandb.define_metric("multi_turn/*", step_metric="rollout/step")
    wandb.define_metric("passrate/*", step_metric="rollout/step")
    wandb.define_metric("eval/step")
    wandb.define_metric("eval/*", step_metric="eval/step")
    wandb.define_metric("perf/*", step_metric="rollout/step")
    wandb.define_metric("sgl_engine/uptime_sec")
    wandb.define_metric("sgl_engine/*", step_metric="sgl_engine/uptime_sec")
    assert wandb.run is not None
    train_step = 0
    for rollout in range(4):
        wandb.log({"rollout/step": rollout, "rollout/raw_reward": 0.1 * rollout,
                   "rollout/response_len": np.float32(100 + rollout),
                   "perf/rollout_time": 2.5 + rollout, "passrate/pass@1": rollout / 4})
        for _ in range(3):
            wandb.log({"train/step": train_step, "train/loss": 1.0 / (train_step + 1),
                       "train/grad_norm": np.float64(0.5 + train_step),
                       "train/lr-pg_0": 1e-6})
            train_step += 1
        if rollout % 2 == 1:
            wandb.log({"eval/step": rollout, "eval/gsm8k": 0.5 + rollout / 10})
        wandb.log({"sgl_engine/num_running_reqs": 3.0 + rollout,
                   "sgl_engine/uptime_sec": 30.25 * (rollout + 1)})
    wandb.finish()


def transformers_trainer(wandb: ModuleType) -> None:
    """transformers' `WandbCallback` (setup, on_log, on_train_end's summary): one axis
    for everything (``*`` on train/global_step, step_sync), scalars to the summary."""
    if wandb.run is None:
        wandb.init(project="huggingface", name="hf-run")
    wandb.config.update({"learning_rate": 5e-5, "id2label": {0: "NEG", 1: "POS"},
                         "output_dir": "out"}, allow_val_change=True)
    wandb.define_metric("train/global_step")
    wandb.define_metric("*", step_metric="train/global_step", step_sync=True)
    wandb.run._label(code="transformers_trainer")
    wandb.config["model/num_parameters"] = 1234
    for step in range(1, 9):
        if step % 2 == 0:
            wandb.log({"train/loss": 2.0 / step, "train/grad_norm": 0.25 * step,
                       "train/learning_rate": 5e-5 * (1 - step / 10), "train/epoch": step / 8,
                       "train/global_step": step})
        if step % 4 == 0:
            wandb.log({"eval/loss": 1.5 / step, "eval/runtime": 0.5,
                       "train/global_step": step})
    for key, value in {"train_runtime": 12.5, "train_loss": 0.75, "total_flos": 1e12}.items():
        wandb.run.summary[key] = value
    wandb.log({"train/epoch": 1.0, "train/global_step": 8})
    wandb.finish()


def nemo_rl(wandb: ModuleType) -> None:
    """NeMo-RL's `WandbLogger`: ``config.update(allow_val_change=True)``, then each
    step's metrics in several ``log(..., step=, commit=False)`` calls committed by the
    last; a histogram of the rewards."""
    run = wandb.init(project="nemo-rl", name="grpo", dir=None, config=None)
    run.config.update(CONFIG, allow_val_change=True)
    for step in range(5):
        wandb.log({"train/loss": 0.9 - step / 10, "train/reward": step / 5}, step=step,
                  commit=False)
        wandb.log({"timing/train/total_step_time": 1.5 + step}, step=step, commit=False)
        rewards = np.linspace(0.0, 1.0, 9) * (step + 1)
        wandb.log({"train/reward_hist": wandb.Histogram(rewards),
                   "validation/accuracy": 0.2 * step}, step=step)
    run.finish()


def openrlhf(wandb: ModuleType) -> None:
    """OpenRLHF's `WandbLogger` (and open-instruct's, prime-rl's): reinit, two axes with
    step_sync, train rows that carry their step, eval rows that carry theirs, a table of
    samples, and `finish(exit_code=)`."""
    wandb.init(entity="org", project="openrlhf", group="ppo", name="ppo-run", config=CONFIG,
               reinit=True, tags=["ppo", "7b"], notes="note", job_type="train",
               save_code=False)
    wandb.define_metric("train/global_step")
    wandb.define_metric("train/*", step_metric="train/global_step", step_sync=True)
    wandb.define_metric("eval/epoch")
    wandb.define_metric("eval/*", step_metric="eval/epoch", step_sync=True)
    for step in range(1, 7):
        logs: dict[str, Any] = {"train/policy_loss": 0.3 / step, "train/reward": 0.1 * step,
                                "train/kl": np.float32(0.01 * step), "train/global_step": step}
        wandb.log(logs)
        if step % 3 == 0:
            table = wandb.Table(columns=["prompt", "response", "reward"],
                                data=[[f"q{step}-{i}", f"a{step}-{i}", float(i)]
                                      for i in range(2)])
            wandb.log({"train/samples": table, "train/global_step": step})
            wandb.log({"eval/reward_mean": 0.5 * step, "eval/epoch": step // 3})
    wandb.finish(exit_code=0)


def trl_completions(wandb: ModuleType) -> None:
    """TRL's GRPOTrainer.log: the completions table (from a DataFrame, no step) logged
    after transformers' metrics of the step, behind ``wandb.run is not None``."""
    wandb.init(project="trl", name="grpo")
    wandb.define_metric("train/global_step")
    wandb.define_metric("*", step_metric="train/global_step", step_sync=True)
    for step in (5, 10):
        wandb.log({"train/reward": step / 10, "train/kl": 0.01, "train/global_step": step})
        if wandb.run is not None:
            df = pd.DataFrame({"step": [str(step)] * 2, "prompt": ["2+2?", "3+3?"],
                               "completion": ["4", "6"], "accuracy_reward": [1.0, 0.0],
                               "advantage": [0.5, -0.5]})
            wandb.log({"completions": wandb.Table(dataframe=df)})
    wandb.finish()


def verl_tracking(wandb: ModuleType) -> None:
    """verl's `Tracking` (wandb backend) and `ValidationGenerationsLogger`: ``log(data,
    step=step)`` with explicit steps, the growing wide table ``val/generations``, the DAPO
    INCREMENTAL table, and ``finish(exit_code=0)``."""
    wandb.init(project="verl", name="gsm8k", config=CONFIG, entity=None,
               settings=wandb.Settings(https_proxy=None))
    table = None
    for step in range(1, 5):
        wandb.log({"actor/entropy": 0.5 / step, "critic/score/mean": step / 4,
                   "response_length/mean": 100.0 + step}, step=step)
        if step % 2 == 0:
            samples = [(f"in{step}-{i}", f"out{step}-{i}", float(i)) for i in range(2)]
            columns = ["step", *(f"{c}_{i + 1}" for i in range(len(samples))
                                 for c in ("input", "output", "score"))]
            new = wandb.Table(columns=columns, data=table.data if table is not None else None)
            new.add_data(step, *[v for s in samples for v in s])
            wandb.log({"val/generations": new}, step=step)
            table = new
    wandb.finish(exit_code=0)


def edge_cases(wandb: ModuleType) -> None:
    """W&B's step rules at their edges, and values of every kind W&B takes as numbers:
    an empty row, a lower step (ignored), one step twice, ``commit=False`` then a step
    jump, NumPy scalars, an int beyond float64's exact range, nested dicts, odd keys,
    NaN and infinities, an array W&B makes a histogram of, and an open row that only
    `finish()` commits."""
    wandb.init(project="edge")
    wandb.log({})
    wandb.log({"a": 1}, step=0)
    wandb.log({"a": 1}, step=1)
    wandb.log({"b": 2}, step=1)
    wandb.log({"c": 3}, commit=False)
    wandb.log({"d": 4}, step=4)
    wandb.log({"e": np.int64(5), "f": np.float16(0.5), "g": 2**70, "t": True,
               "h": {"x": 1, "y": {"z": 2.5}}, "odd key.with dots": 1, "sp ace": 2,
               "/lead": 3, "ünï": 4})
    wandb.log({"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf"),
               "weights": np.arange(40, dtype=np.float64)})  # W&B: a histogram
    wandb.log({"a": 0}, step=0)
    wandb.log({"last": 1}, commit=False)
    wandb.finish()


def slime_shared(wandb: ModuleType) -> None:
    """slime's shared mode: the primary (the trainer's rank 0) creates the run, then a
    secondary process (a Ray actor without a rank: here a child process) joins it by id
    with ``resume="allow", reinit=True`` and ``Settings(mode=..., x_primary=False)``.
    $FIXTURE_WANDB_MODE is the mode (``shared``; ``offline`` for the real wandb, where
    slime too makes each process an offline run); $FIXTURE_WANDB_MODULE is the module the
    child imports; $FIXTURE_SECONDARY_ENV holds variables only the child gets (JSON)."""
    mode = os.environ.get("FIXTURE_WANDB_MODE", "shared")
    wandb.init(entity="team", project="slime", group="exp", name="exp", config=CONFIG,
               settings=wandb.Settings(mode=mode, x_primary=True))
    _slime_axes(wandb)
    for rollout in range(3):
        wandb.log({"rollout/step": rollout, "rollout/raw_reward": 0.25 * rollout})
    code = (f"import importlib, _wandb_callsites as c; "
            f"c.slime_secondary(importlib.import_module({os.environ['FIXTURE_WANDB_MODULE']!r}),"
            f" {wandb.run.id!r})")
    # a process of its own, as a Ray actor is: not wandb's service of this one
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(json.loads(os.environ.get("FIXTURE_SECONDARY_ENV", "{}")))
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    wandb.log({"rollout/step": 3, "rollout/raw_reward": 0.75})
    wandb.finish()


def slime_secondary(wandb: ModuleType, run_id: str) -> None:
    """slime's `init_wandb_secondary`, then the train steps it logs."""
    mode = os.environ.get("FIXTURE_WANDB_MODE", "shared")
    settings = dict(mode=mode) if mode == "offline" else dict(
        mode=mode, x_primary=False, x_update_finish_state=False)
    wandb.init(id=run_id, entity="team", project="slime", config=CONFIG, resume="allow",
               reinit=True, settings=wandb.Settings(**settings))
    _slime_axes(wandb)
    for step in range(4):
        wandb.log({"train/step": step, "train/loss": 1.0 / (step + 1)})
    wandb.finish()


def axes_live(wandb: ModuleType, between: Any = None) -> None:
    """Keys on W&B's own step beside three axes of their own: one behind it (eval), one far
    ahead of it (seconds), one whose keys come in rows without their axis (step_sync), a
    histogram and a table on an axis. `between` is called now and then while the run is
    live (an export, for `tracklake.wandb`)."""
    wandb.init(project="axes", name="live", config={"lr": 0.5})
    wandb.define_metric("eval/step")
    wandb.define_metric("eval/*", step_metric="eval/step")
    wandb.define_metric("clock/*", step_metric="clock/sec")
    wandb.define_metric("rollout/*", step_metric="rollout/step")
    for step in range(40):
        wandb.log({"loss": 1.0 / (step + 1), "lr": 0.5 - step / 100})
        if step % 6 == 5:
            wandb.log({"eval/acc": step / 40, "eval/step": step // 6,
                       "eval/hist": wandb.Histogram(np.arange(step + 2.0))})
        if step % 4 == 0:
            wandb.log({"clock/sec": 1000 * (step + 1), "clock/tokens_per_sec": 10.0 + step})
            wandb.log({"rollout/step": step // 4, "rollout/reward": step / 7})
            wandb.log({"rollout/length": 100.0 + step})  # at rollout/step's last value
        if step % 13 == 12:
            table = wandb.Table(columns=["prompt", "response"], data=[[f"q{step}", f"a{step}"]])
            wandb.log({"eval/samples": table, "eval/step": step // 6})
        if between is not None and step % 9 == 8:
            between()
    wandb.finish()


def _slime_axes(wandb: ModuleType) -> None:
    wandb.define_metric("train/step")
    wandb.define_metric("train/*", step_metric="train/step")
    wandb.define_metric("rollout/step")
    wandb.define_metric("rollout/*", step_metric="rollout/step")


CALLSITES = {f.__name__: f for f in (slime, transformers_trainer, nemo_rl, openrlhf,
                                     trl_completions, verl_tracking, edge_cases, axes_live)}
