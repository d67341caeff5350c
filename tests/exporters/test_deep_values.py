"""Records whose JSON nests far deeper than any writer lets a value nest (a planted or
restored file can hold them): every exporter delivers the run, such a value as its text,
and goes on to the next run; none stops with RecursionError."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _optional import optional
from _wandb_log import config as wandb_config
from _wandb_runs import offline_files

import tracklake
from tracklake.exporters import Destination, Selection, export

DEEP_LIST = "[" * 50_000 + "]" * 50_000
DEEP_OBJECT = '{"a":' * 50_000 + "1" + "}" * 50_000
DEEP_KEY = "/".join(["k"] * 5_000)


def _plant(root: Path) -> None:
    """Run p/planted with deep values in a config value, a config key of 5,000 parts,
    a generation's input and fields, a span's attributes, inputs and outputs and an
    artifact's metadata, written by the writer's record path past the API's checks (as
    a planted file holds them), and a span whose input is a text of 50,000 brackets,
    logged as a user may; and run p/plain after it, as a user would log it."""
    with tracklake.init(project="p", run_id="planted", root=root, config={"lr": 0.1},
                        capture_identity=False, system_metrics=False) as run:
        run.log({"loss": 1.0}, step=0)
        t = int(time.time() * 1e6)
        run._add("configs", [{"time": t, "key": "deep", "value": DEEP_LIST},
                             {"time": t, "key": "object", "value": DEEP_OBJECT},
                             {"time": t, "key": DEEP_KEY, "value": "1"}])
        run._add("generations", [{"time": t, "step": 0, "key": "val", "sample": 0,
                                  "input": DEEP_LIST, "output": "ok", "score": 1.0,
                                  "extra": DEEP_OBJECT}])
        run._add("traces", [{"time": t, "end_time": t + 5, "step": 0, "trace_id": "t1",
                             "span_id": "s1", "parent_id": None, "name": "rollout",
                             "status": "ok", "error": None, "attributes": DEEP_OBJECT,
                             "inputs": DEEP_LIST, "outputs": DEEP_OBJECT,
                             "token_ids": None}])
        with run.span("judge", step=1, inputs={"prompt": DEEP_LIST}):  # text: legal
            pass
        digest = run.log_artifact(b"weights", name="model.bin")
        run._add("artifacts", [{"time": t, "step": 0, "name": "again.bin", "digest": digest,
                                "size": 7, "media_type": None, "metadata": DEEP_OBJECT}])
    with tracklake.init(project="p", run_id="plain", root=root, config={"lr": 0.3},
                        capture_identity=False, system_metrics=False) as run:
        run.log({"loss": 2.0}, step=0)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    _plant(store)
    return store


def _tensorboard(out: Path, _: str) -> Destination:
    optional("tensorboard")
    from tracklake.exporters.tensorboard.destination import TensorBoardDestination
    return TensorBoardDestination(logdir=str(out))


def _wandb(out: Path, _: str) -> Destination:
    optional("wandb")
    from tracklake.exporters.wandb.destination import WandbDestination
    return WandbDestination(dir=str(out))


def _swanlab(out: Path, _: str) -> Destination:
    optional("swanlab")
    from tracklake.exporters.swanlab.destination import SwanlabDestination
    return SwanlabDestination(logdir=str(out))


def _mlflow(_: Path, uri: str) -> Destination:
    optional("mlflow")
    from tracklake.exporters.mlflow.destination import MlflowDestination
    return MlflowDestination(tracking_uri=uri)


@pytest.mark.parametrize("made", [_tensorboard, _wandb, _swanlab, _mlflow],
                         ids=["tensorboard", "wandb", "swanlab", "mlflow"])
def test_every_exporter_delivers_a_run_of_deep_values_and_the_next_one(
        root: Path, tmp_path: Path, made: Callable[[Path, str], Destination],
        request: pytest.FixtureRequest) -> None:
    uri = request.getfixturevalue("mlflow_server") if made is _mlflow else ""
    out = tmp_path / "out"
    summary = export(made(out, uri), root=root, selection=Selection(all_runs=True),
                     log=lambda _: None)
    assert not summary.failed, [o.error for o in summary.failed]
    assert set(summary.runs) == {"p/planted", "p/plain"}
    assert all(o.records > 0 for o in summary.runs.values())
    if made is _mlflow:  # read back through MLflow's client
        from mlflow.tracking import MlflowClient
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("p")
        [run] = client.search_runs([experiment.experiment_id],
                                   "tags.`tracklake.run_id` = 'p/planted'")
        spans = {s.name: s for t in client.search_traces(
            locations=[experiment.experiment_id], run_id=run.info.run_id)
            for s in t.data.spans}
        assert spans["judge"].inputs == {"prompt": DEEP_LIST}  # JSON within its bound
        assert spans["rollout"].inputs == {"text": DEEP_LIST}  # not: as its text
        assert run.data.params["deep"] == DEEP_LIST[:6000]  # MLflow's param length
    if made is _wandb:  # read back from the offline files: the values arrive as text
        config: dict[str, Any] = wandb_config(offline_files(out / "wandb"))
        assert config["deep"] == DEEP_LIST and config["object"] == DEEP_OBJECT
        assert config[DEEP_KEY] == 1  # left flat, not 5,000 nested dicts
