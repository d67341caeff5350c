"""verl's trainer to MLflow through the store, against real verl from PyPI and a real
`mlflow server` on loopback: verl's own `RayPPOTrainer._maybe_log_val_generations` sends
validation samples through its `ValidationGenerationsLogger` into the store, the
``mlflow`` backend in ``trainer.logger`` becomes a sidecar exporter, and the MLflow run
ends with verl's ``val_step{N}.json`` files and verl's own flattening of the config as
params (computed by verl's `_compute_mlflow_params_from_objects`); runs verl did not
log keep tracklake's params."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _optional import optional
from _sidecar import SIDECAR_LINE, alive, wait_for

import tracklake

verl = optional("verl")
optional("mlflow")
optional("hydra")

import numpy as np  # noqa: E402
from mlflow.artifacts import download_artifacts  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils import tracking as verl_tracking  # noqa: E402

from tracklake.exporters import Selection, export  # noqa: E402
from tracklake.exporters.mlflow import MlflowDestination  # noqa: E402
from tracklake.exporters.mlflow.params import VERL_RUN_TAG  # noqa: E402
from tracklake.integrations import verl as integration  # noqa: E402

pytestmark = [
    # MLflow's SQL store on SQLAlchemy 2.1 (as in tests/exporters/test_mlflow.py)
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated"),
    # one pytest worker: the module's MLflow server starts once, not on each worker
    pytest.mark.xdist_group("verl_mlflow"),
]

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"
INPUTS = ["what is 2+2?", "name a prime", "capital of France?", "3*3=", "say hi"]
OUTPUTS = ["4", "7", "Paris", "9", "hi"]
SCORES = [1.0, 1.0, 0.0, 1.0, 0.5]


def _servers() -> Any:
    """The exporter tests' `MlflowServer` (tests/exporters/conftest.py), reused as it is."""
    path = Path(__file__).parent.parent / "exporters" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_mlflow_server_for_verl", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    servers = _servers()
    server = servers.MlflowServer(tmp_path_factory.mktemp("mlflow-verl"), servers._free_port())
    server.start()
    try:
        yield server.uri
    finally:
        server.stop()


def _trainer_config(*overrides: str) -> Any:
    """verl's shipped ``ppo_trainer.yaml``, composed with Hydra as ``main_ppo`` does."""
    from hydra import compose, initialize_config_dir

    with warnings.catch_warnings():
        # Hydra 1.3 on OmegaConf 2.4 warns about its own version handling; not ours
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))


def _ray_trainer_module() -> Any:
    with warnings.catch_warnings():
        # verl's engine registry warns for every GPU engine it cannot import on CPU, and
        # ray warns about its own experimental state API; neither concerns logging
        warnings.simplefilter("ignore")
        from verl.trainer.ppo import ray_trainer
    return ray_trainer


def _verl_params(config: Any) -> dict[str, str]:
    """The params verl's MLflow backend logs for `config` (mlflow stores ``str(value)``)."""
    return {k: str(v) for k, v in
            verl_tracking._compute_mlflow_params_from_objects(config).items()}


def _mlflow_run(uri: str, project: str, run_id: str) -> Any:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(project)
    assert experiment is not None, project
    [found] = client.search_runs([experiment.experiment_id],
                                 filter_string=f"tags.`tracklake.run_id` = '{project}/{run_id}'")
    return found


def _val_file(uri: str, mlrun: Any, step: int, dst: Path) -> Any:
    local = download_artifacts(run_id=mlrun.info.run_id, artifact_path=f"val_step{step}.json",
                               dst_path=str(dst), tracking_uri=uri)
    return json.loads(Path(local).read_text(encoding="utf-8"))


def test_verls_trainer_sends_validation_generations_and_config_to_mlflow_as_verl_does(
        root: Path, tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ray_trainer = _ray_trainer_module()
    # the trainer module took verl's logger name after the plugin replaced it
    assert ray_trainer.ValidationGenerationsLogger is integration.ValidationGenerationsLogger
    monkeypatch.setenv("TRACKLAKE_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)
    cfg = _trainer_config("trainer.logger=[console,tracklake,mlflow]",
                          "trainer.project_name=vproj", "trainer.experiment_name=vexp",
                          "trainer.log_val_generations=3")
    config = OmegaConf.to_container(cfg, resolve=True)
    tracking = verl_tracking.Tracking(project_name=cfg.trainer.project_name,
                                      experiment_name=cfg.trainer.experiment_name,
                                      default_backend=cfg.trainer.logger, config=config)
    try:
        # RayPPOTrainer with only what `_maybe_log_val_generations` reads, set as its
        # __init__ and fit() set them
        trainer = object.__new__(ray_trainer.RayPPOTrainer)
        trainer.config = cfg
        trainer.validation_generations_logger = ray_trainer.ValidationGenerationsLogger(
            project_name=cfg.trainer.project_name, experiment_name=cfg.trainer.experiment_name)
        for step in (10, 20):
            trainer.global_steps = step
            tracking.log({"val-core/acc/best@2/mean": step / 100}, step=step)
            trainer._maybe_log_val_generations(inputs=INPUTS, outputs=[
                f"{o} @{step}" for o in OUTPUTS], scores=SCORES)
        tracking.finish(exit_code=0)
    finally:
        # the sidecar's console line comes from its supervisor thread
        pids = [int(m[2]) for m in SIDECAR_LINE.finditer(capsys.readouterr().err)]
        try:
            wait_for(f"the mlflow sidecar {pids} to drain and exit",
                     lambda: not any(alive(p) for p in pids))
        finally:
            for pid in pids:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert len(pids) == 1, "one sidecar, for mlflow"

    # what verl's trainer chose (sorted by input, shuffled with seed 42, first 3)
    chosen = sorted(zip(INPUTS, OUTPUTS, SCORES, strict=True))
    np.random.RandomState(42).shuffle(chosen)
    chosen = chosen[:3]
    run_id = integration.run_id_for("vproj", "vexp")
    stored = tracklake.query("select step, sample, input, output, score from generations "
                             "where key = 'val/generations' order by step, sample",
                             root=root).to_pylist()
    assert stored == [{"step": s, "sample": i, "input": q, "output": f"{a} @{s}", "score": x}
                      for s in (10, 20) for i, (q, a, x) in enumerate(chosen)]

    mlrun = _mlflow_run(mlflow_uri, "vproj", run_id)
    for step in (10, 20):
        assert _val_file(mlflow_uri, mlrun, step, tmp_path / f"dl{step}") == [
            {"input": q, "output": f"{a} @{step}", "score": x} for q, a, x in chosen]
    assert mlrun.data.metrics["val-core/acc/best_at_2/mean"] == 0.2
    # the config's params: verl's own flattening, value for value
    expected = _verl_params(config)
    assert "trainer/logger/list_len" in expected and expected["trainer/logger/0"] == "console"
    params = dict(mlrun.data.params)
    # except what the store redacted: a secret-named key's value never leaves the trainer
    redacted = {k for k, v in params.items() if v == "<redacted>"}
    assert redacted == {"distillation/teacher_key"}  # verl's config: a key named *key*
    assert params == expected | dict.fromkeys(redacted, "<redacted>")


def test_a_verl_run_exported_later_gets_verls_params_for_odd_configs(
        root: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lists (empty, nested, of dicts), empty dicts, None, booleans, NaN and long floats
    are flattened and printed as verl's MLflow backend does; an exporter run twice adds
    nothing."""
    monkeypatch.setenv("TRACKLAKE_ROOT", str(root))
    config = {"a": {}, "b": [], "c": [1, {"x": None, "y": [True, False]}], "h": [[1, 2], []],
              "d": {"e": 1.5e-6, "f": "str", "g": 10**20, "n": float("nan")},
              "ünï code": "ü", "path with space": {"k": -0.0}}
    tracking = verl_tracking.Tracking("odd", "cfg", ["tracklake"], config=config)
    tracking.finish(exit_code=0)
    for _ in range(2):
        summary = export(MlflowDestination(tracking_uri=mlflow_uri), root=root,
                         selection=Selection(all_runs=True))
        assert not summary.failed, str(summary)
    mlrun = _mlflow_run(mlflow_uri, "odd", integration.run_id_for("odd", "cfg"))
    assert dict(mlrun.data.params) == _verl_params(config)
    assert _verl_params(config)["d/n"] == "nan" and "a" not in _verl_params(config)


def test_runs_not_logged_by_verl_keep_tracklakes_params(root: Path, mlflow_uri: str) -> None:
    config = {"lr": 1e-5, "layers": [1, 2], "flag": True, "none": None}
    with tracklake.init(project="plain", run_id="r", root=root, config=config,
                        capture_identity=False):
        pass
    # a user's own tag that merely mentions verl changes nothing
    with tracklake.init(project="plain", run_id="tagged", root=root, config=config,
                        tags=["verl"], capture_identity=False):
        pass
    summary = export(MlflowDestination(tracking_uri=mlflow_uri), root=root,
                     selection=Selection(all_runs=True))
    assert not summary.failed, str(summary)
    for run in ("r", "tagged"):
        assert dict(_mlflow_run(mlflow_uri, "plain", run).data.params) == {
            "lr": "1e-05", "layers": "[1, 2]", "flag": "true", "none": "null"}


def test_the_verl_run_tag_is_the_one_the_integration_sets(root: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("TRACKLAKE_ROOT", str(root))
    tracking = verl_tracking.Tracking("p", "e", ["tracklake"])
    tracking.finish(exit_code=0)
    [row] = tracklake.query("select tags from runs", root=root).to_pylist()
    assert list(row["tags"]) == [VERL_RUN_TAG]
