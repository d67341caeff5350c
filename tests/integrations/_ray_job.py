"""Ray jobs run by the tests, each in its own driver process with a local Ray of 2 CPUs:
``_ray_job.py ROOT STORAGE RAY_TMP {tune|tune-restore|train}``.

tune: a grid of 3 trials reporting 3 iterations each with a checkpoint per iteration; the
trial with ``lr`` 0.5 fails at iteration 2 the first time. tune-restore: `Tuner.restore`
with ``resume_errored``, which runs that trial again from its checkpoint. train: Ray Train
with 2 workers, each reporting 3 times."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import ray
from ray import tune

from tracklake.integrations.ray import TracklakeLoggerCallback, TracklakeTrainCallback


def trainable(config: dict[str, Any]) -> None:
    checkpoint = tune.get_checkpoint()
    start = 1
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int(Path(d, "iteration").read_text()) + 1
    for i in range(start, 4):
        if config["lr"] == 0.5 and i == 2 and not Path(config["marker"]).exists():
            Path(config["marker"]).write_text("failed once")
            raise RuntimeError("trial fails at iteration 2")
        with tempfile.TemporaryDirectory() as d:
            Path(d, "iteration").write_text(str(i))
            tune.report({"score": config["lr"] * i, "nested": {"i": i}},
                        checkpoint=tune.Checkpoint.from_directory(d))


def train_loop(config: dict[str, Any]) -> None:
    from ray import train

    rank = train.get_context().get_world_rank()
    for i in range(3):
        train.report({"loss": 1.0 / (i + 1) + rank, "epoch": i})


def main() -> None:
    root, storage, ray_tmp, mode = sys.argv[1:5]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_tmp,
                 object_store_memory=80 << 20, log_to_driver=False, configure_logging=False)
    if mode == "train":
        os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
        from ray.train import RunConfig, ScalingConfig
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        callback = TracklakeTrainCallback(root=root, step_key="epoch")
        DataParallelTrainer(
            train_loop, scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="train-job", storage_path=storage,
                                 callbacks=callback.callbacks())).fit()
        return
    callback = TracklakeLoggerCallback(project="tune", root=root)
    if mode == "tune-restore":
        tuner = tune.Tuner.restore(os.path.join(storage, "exp"), trainable,
                                   resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={"lr": tune.grid_search([0.1, 0.01, 0.5]),
                         "marker": os.path.join(storage, "failed-once")},
            run_config=tune.RunConfig(name="exp", storage_path=storage, callbacks=[callback]))
    tuner.fit()


if __name__ == "__main__":
    main()
