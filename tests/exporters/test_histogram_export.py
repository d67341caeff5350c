"""Histograms reach every destination and read back with the destination's own reader:
TensorBoard's accumulators, W&B's offline transaction log, MLflow's client against a real
`mlflow server`, SwanLab's offline reader."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _optional import optional
from _records import mlflow_run_id

import tracklake
from tracklake.exporters import Destination, Selection, export

pytestmark = [pytest.mark.filterwarnings(
    "ignore:The ``noload`` loader strategy is deprecated")]  # MLflow's SQL store, as there

PROJECT = "hist"
STEPS = (0, 1, 2)


def _values(step: int) -> np.ndarray:
    return np.random.default_rng(step).normal(loc=step, size=500)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A finished run: histograms of `w` at steps 0..2 (8 bins), one of only NaN at step
    3, and a metric beside them."""
    root = tmp_path / "store"
    with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step in STEPS:
            run.log({"loss": 1.0 / (step + 1)}, step=step)
            run.log_histogram("w", _values(step), step=step, bins=8)
        run.log_histogram("w", [math.nan] * 3, step=3)
    return root


def _expected() -> dict[int, tuple[list[float], list[int]]]:
    out = {}
    for step in STEPS:
        counts, edges = np.histogram(_values(step), bins=8)
        out[step] = (edges.tolist(), counts.tolist())
    return out


def _export(dest: Destination, root: Path) -> None:
    export(dest, root=root, selection=Selection(runs=("r1",)), log=lambda _: None)


def test_tensorboard_histograms_read_back_with_tensorboards_accumulators(
        root: Path, tmp_path: Path) -> None:
    optional("tensorboard")
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    from tracklake.exporters.tensorboard.destination import TensorBoardDestination

    logdir = tmp_path / "tb"
    _export(TensorBoardDestination(logdir=logdir), root)
    [events] = [p.parent for p in logdir.rglob("events.out.tfevents.*")]
    acc = EventAccumulator(str(events), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    got = {e.step: ([e.histogram_value.min, *e.histogram_value.bucket_limit],
                    [int(c) for c in e.histogram_value.bucket]) for e in acc.Histograms("w")}
    assert got == _expected()  # the all-NaN histogram has no bins: only its statistics
    assert {e.step for e in acc.Scalars("w/count")} == {0, 1, 2, 3}
    # what TensorBoard's histogram dashboard reads: the same bins as [left, right, count]
    # (float32: TensorBoard converts them so)
    plugin = plugin_event_accumulator.EventAccumulator(str(events), size_guidance={
        "tensors": 0})
    plugin.Reload()
    seen = []
    for e in plugin.Tensors("w"):
        buckets = tensor_util.make_ndarray(e.tensor_proto)
        edges, counts = (np.array(a, np.float32) for a in _expected()[e.step])
        assert buckets.tolist() == np.stack([edges[:-1], edges[1:], counts], 1).tolist()
        seen.append(e.step)
    assert seen == list(STEPS)


def test_wandb_gets_histograms_in_its_offline_history(root: Path, tmp_path: Path) -> None:
    optional("wandb")
    import _wandb_log as wlog

    from tracklake.exporters.wandb.destination import WandbDestination

    _export(WandbDestination(dir=str(tmp_path / "out")), root)
    files = sorted((tmp_path / "out" / "wandb").glob("offline-run-*/*.wandb"))
    history = dict(wlog.history(files))
    got = {step: (row["w"]["bins"], row["w"]["values"]) for step, row in history.items()
           if "w" in row}
    assert {step: row["w"]["_type"] for step, row in history.items() if "w" in row} == {
        s: "histogram" for s in STEPS}
    assert got == _expected()
    assert history[3]["w/count"] == 0 and "w" not in history[3]


def test_mlflow_gets_a_json_artifact_per_key_and_step_and_the_statistics_as_metrics(
        root: Path, mlflow_server: str) -> None:
    optional("mlflow")
    from mlflow.tracking import MlflowClient

    from tracklake.exporters.mlflow.destination import MlflowDestination

    _export(MlflowDestination(tracking_uri=mlflow_server), root)
    client = MlflowClient(mlflow_server)
    run_id = mlflow_run_id(client, PROJECT, "r1")
    listed = [f.path for f in client.list_artifacts(run_id, "histograms/w")]
    assert listed == [f"histograms/w/step_{s:08d}.json" for s in (*STEPS, 3)]
    for step, (edges, counts) in _expected().items():
        path = client.download_artifacts(run_id, f"histograms/w/step_{step:08d}.json")
        stored = json.loads(Path(path).read_text())
        assert (stored["key"], stored["step"], stored["edges"], stored["counts"]) == (
            "w", step, edges, counts)
        assert stored["count"] == 500
    nan = json.loads(Path(client.download_artifacts(
        run_id, "histograms/w/step_00000003.json")).read_text())
    assert (nan["edges"], nan["nonfinite"], nan["mean"]) == ([], 3, "nan")
    means = {m.step: m.value for m in client.get_metric_history(run_id, "w/mean")}
    assert {s: round(v, 9) for s, v in means.items() if s in STEPS} == {
        s: round(float(_values(s).mean()), 9) for s in STEPS}


def test_swanlab_gets_a_bar_chart_per_key_and_step(root: Path, tmp_path: Path) -> None:
    optional("swanlab")
    import _swanlab_log as slog

    from tracklake.exporters.swanlab.destination import SwanlabDestination

    logdir = tmp_path / "swanlab"
    _export(SwanlabDestination(logdir=str(logdir)), root)
    charts: dict[int, Any] = {}
    for run_file in logdir.glob("run-*/run-*.swanlab"):
        for r in slog.records(run_file):
            if r.WhichOneof("record_type") == "media" and r.media.key == "w":
                [item] = r.media.value.items
                options = json.loads(
                    (run_file.parent / "media" / "echarts" / item.filename).read_text())
                charts[r.media.step] = (options, item.caption)
    assert sorted(charts) == list(STEPS)
    for step, (edges, counts) in _expected().items():
        options, caption = charts[step]
        assert options["series"][0]["data"] == counts
        assert options["xAxis"][0]["data"] == [f"[{lo:.6g}, {hi:.6g})" for lo, hi in
                                              itertools.pairwise(edges)]
        assert caption.startswith("500 values from ")
    assert slog.points(sorted(p.parent for p in logdir.glob("run-*/run-*.swanlab")))[
        (3, "w/count", 0.0)] == 1


def test_wandb_with_every_rank_holds_histograms_with_the_metrics_of_their_step(
        tmp_path: Path) -> None:
    """``--ranks all`` while rank 1 lags: steps above the slower rank wait in the export
    state, histograms with them (JSON there), and none is dropped as going backwards."""
    optional("wandb")
    import _wandb_log as wlog

    from tracklake.exporters import ExportOptions
    from tracklake.exporters.wandb.destination import WandbDestination

    root = tmp_path / "store"
    runs = [tracklake.init(project=PROJECT, run_id="r1", root=root, rank=rank,
                           capture_identity=False, system_metrics=False, compact=False)
            for rank in (0, 1)]

    def log(rank: int, steps: range) -> None:
        for step in steps:
            runs[rank].log({"loss": float(step)}, step=step)
            runs[rank].log_histogram("w", [float(step), step + 1.0], step=step, bins=2)

    log(0, range(6))
    log(1, range(3))
    for run in runs:
        run.flush()

    def once() -> None:
        export(WandbDestination(dir=str(tmp_path / "out")), root=root,
               selection=Selection(runs=("r1",)), options=ExportOptions(ranks="all"),
               log=lambda _: None)

    once()
    log(1, range(3, 6))
    for run in runs:
        run.finish()
    once()
    files = sorted((tmp_path / "out" / "wandb").glob("offline-run-*/*.wandb"))
    history = wlog.history(files)
    got = sorted((step, key, tuple(v["bins"])) for step, row in history
                 for key, v in row.items() if isinstance(v, dict) and "bins" in v)
    assert got == sorted((step, f"rank{rank}/w", (float(step), step + 0.5, step + 1.0))
                         for rank in (0, 1) for step in range(6))
