"""Every rank mode delivers every value to every destination whatever the batch size:
a finished 3-rank run exported 100 rows a commit, counted by each destination's reader."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _optional import optional

import tracklake
from tracklake.exporters import ExportOptions, Selection, export

RANKS, STEPS = 3, 120
MODES = ["all", "0", "2", "mean", "max"]


def _value(rank: int, step: int) -> float:
    return rank * 1000.0 + step


def _log(root: Path, project: str) -> None:
    for rank in range(RANKS):
        with tracklake.init(project=project, run_id="r", root=root, rank=rank,
                            capture_identity=False) as run:
            for step in range(STEPS):
                run.log({"loss": _value(rank, step), "acc": step / 8}, step=step)


def _want(mode: str) -> Counter[tuple[int, str, float]]:
    def one(rank: int, prefix: str = "") -> Counter[tuple[int, str, float]]:
        return Counter((s, f"{prefix}{k}", v) for s in range(STEPS)
                       for k, v in (("loss", _value(rank, s)), ("acc", s / 8)))
    if mode == "all":
        return sum((one(r, f"rank{r}/") for r in range(RANKS)), Counter())
    if mode == "mean":
        return Counter((s, k, v) for s in range(STEPS)
                       for k, v in (("loss", 1000.0 + s), ("acc", s / 8)))
    if mode == "max":
        return one(RANKS - 1)
    return one(int(mode))


def _export(dest: Any, root: Path, mode: str) -> None:
    export(dest, root=root, selection=Selection(all_runs=True),
           options=ExportOptions(ranks=mode, batch_rows=100), log=lambda _: None)


@pytest.mark.parametrize("mode", MODES)
def test_tensorboard(root: Path, tmp_path: Path, mode: str) -> None:
    destination = optional("tracklake.exporters.tensorboard")
    accumulator = optional("tensorboard.backend.event_processing.event_accumulator")
    _log(root, "p")
    _export(destination.TensorBoardDestination(logdir=tmp_path / "tb"), root, mode)
    acc = accumulator.EventAccumulator(str(tmp_path / "tb" / "p" / "r"),
                                       size_guidance={"scalars": 0})
    acc.Reload()
    got = Counter((e.step, tag, e.value) for tag in acc.Tags()["scalars"]
                  for e in acc.Scalars(tag))
    assert got == Counter({(s, k, float(_f32(v))): n for (s, k, v), n in _want(mode).items()})


def _f32(value: float) -> float:
    import struct
    return float(struct.unpack("f", struct.pack("f", value))[0])


@pytest.mark.parametrize("mode", MODES)
def test_mlflow(root: Path, mlflow_server: str, tmp_path: Path, mode: str) -> None:
    destination = optional("tracklake.exporters.mlflow")
    client = optional("mlflow.tracking").MlflowClient(tracking_uri=mlflow_server)
    project = f"rank-modes-{mode}-{tmp_path.name}"[:60]
    _log(root, project)
    _export(destination.MlflowDestination(tracking_uri=mlflow_server), root, mode)
    experiment = client.get_experiment_by_name(project)
    (mlrun,) = client.search_runs([experiment.experiment_id])
    got: Counter[tuple[int, str, float]] = Counter()
    for key in mlrun.data.metrics:
        got.update((m.step, key, m.value) for m in client.get_metric_history(
            mlrun.info.run_id, key))
    assert got == _want(mode)


@pytest.mark.parametrize("mode", MODES)
def test_swanlab(root: Path, tmp_path: Path, mode: str) -> None:
    destination = optional("tracklake.exporters.swanlab")
    import _swanlab_log as slog
    _log(root, "p")
    out = tmp_path / "swanlab"
    _export(destination.SwanlabDestination(mode="offline", logdir=str(out)), root, mode)
    got = slog.points(sorted(out.glob("run-*")))
    assert got == Counter({(s, k, slog.same(v)): n for (s, k, v), n in _want(mode).items()})
