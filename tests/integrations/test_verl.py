"""The verl integration against real verl from PyPI (the ``verl`` extra): verl's own
`Tracking` and generation loggers, built from verl's shipped trainer config, write to the
store once tracklake is installed; nothing in these tests imports tracklake's integration
by hand except where it says so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _env import child_env
from _optional import optional

import tracklake

verl = optional("verl")
hydra = optional("hydra")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_timing_metrics  # noqa: E402
from verl.utils import tracking as verl_tracking  # noqa: E402

from tracklake.integrations import verl as integration  # noqa: E402

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


@pytest.fixture
def store(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The store root, given to the integration the way a verl job gives it: by env."""
    monkeypatch.setenv("TRACKLAKE_ROOT", str(root))
    return root


def _trainer_config(*overrides: str) -> Any:
    """verl's shipped ``ppo_trainer.yaml``, composed with Hydra as ``main_ppo`` does."""
    import warnings

    from hydra import compose, initialize_config_dir

    with warnings.catch_warnings():
        # Hydra 1.3 on OmegaConf 2.4 warns about its own version handling; not ours
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))


def _tracking(cfg: Any) -> Any:
    """`Tracking` built exactly as verl's `RayPPOTrainer.fit` builds it."""
    from verl.utils.tracking import Tracking

    return Tracking(
        project_name=cfg.trainer.project_name,
        experiment_name=cfg.trainer.experiment_name,
        default_backend=cfg.trainer.logger,
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def _fake_batch(n: int = 4, prompt: int = 3, response: int = 5) -> Any:
    """A small DataProto with the fields verl's `compute_data_metrics` reads."""
    from verl import DataProto

    g = torch.Generator().manual_seed(0)
    response_mask = torch.ones(n, response)
    response_mask[0, 3:] = 0
    scores = torch.rand(n, response, generator=g)
    return DataProto.from_dict(tensors={
        "token_level_scores": scores,
        "token_level_rewards": scores * 0.5,
        "advantages": torch.randn(n, response, generator=g),
        "returns": torch.randn(n, response, generator=g),
        "prompts": torch.ones(n, prompt, dtype=torch.long),
        "responses": torch.ones(n, response, dtype=torch.long),
        "response_mask": response_mask,
        "attention_mask": torch.cat([torch.ones(n, prompt), response_mask], dim=1),
    })


def test_the_entry_point_installed_tracklake_into_verl() -> None:
    """`import verl` loaded the ``verl.plugins`` entry point: verl's names are tracklake's."""
    assert integration.installed()
    assert verl_tracking.Tracking is integration.Tracking
    assert "tracklake" in verl_tracking.Tracking.supported_backend
    assert sorted(integration.__all__) == [
        "BACKEND", "DapoFilteredRewardTableLogger", "Tracking", "ValidationGenerationsLogger",
        "active_run", "install", "installed", "run_id_for"]


def test_without_tracklake_in_the_list_verl_is_unchanged(store: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    cfg = _trainer_config("trainer.logger=[console]")
    tracking = _tracking(cfg)
    tracking.log({"a": 1.0}, step=1)
    tracking.finish(exit_code=0)
    assert list(tracking.logger) == ["console"]
    assert capsys.readouterr().out == "step:1 - a:1.0\n"  # verl's own console format
    assert not any(p.is_file() for p in store.rglob("*"))
    with pytest.raises(AssertionError, match="neptune is not supported"):
        verl_tracking.Tracking("p", "e", ["neptune"])


def test_verl_trainer_metrics_reach_the_store_and_exit_code_sets_the_status(
        store: Path) -> None:
    cfg = _trainer_config("trainer.logger=[console,tracklake]", "trainer.project_name=proj",
                          "trainer.experiment_name=exp")
    tracking = _tracking(cfg)
    batch = _fake_batch()
    metrics: dict[str, Any] = {}
    for step in (1, 2):
        metrics = {**compute_data_metrics(batch, use_critic=False),
                   **compute_timing_metrics(batch, {"gen": 0.5, "update_actor": 0.25})}
        tracking.log(data=metrics, step=step)
    tracking.finish(exit_code=0)

    run_id = integration.run_id_for("proj", "exp")
    assert _rows(store, "select run, name, status from runs") == [
        {"run": run_id, "name": "exp", "status": "finished"}]
    stored = _rows(store, "select step, key, value from metrics where step = 2 order by key")
    expected = {k: float(v) for k, v in metrics.items()}
    assert {r["key"]: r["value"] for r in stored} == pytest.approx(expected, nan_ok=True)
    assert "critic/score/mean" in expected and "timing_s/gen" in expected
    configs = {r["key"]: json.loads(r["value"]) for r in _rows(store,
               "select key, value from configs")}
    assert configs["trainer/logger"] == ["console", "tracklake"]
    assert configs["trainer/experiment_name"] == "exp"


def test_a_failed_verl_run_is_recorded_as_failed(store: Path) -> None:
    tracking = verl_tracking.Tracking("proj", "exp", ["tracklake"], config={"lr": 0.1})
    tracking.log({"loss": 1.0}, step=0)
    tracking.finish(exit_code=1)
    tracking.finish(exit_code=0)  # verl's __del__ calls it again: no change
    assert _rows(store, "select status from runs") == [{"status": "failed"}]


def test_values_verl_console_skips_are_skipped_and_counted_not_raised(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    tracking = verl_tracking.Tracking("proj", "exp", ["console", "tracklake"])
    for step in (1, 2):
        tracking.log({"loss": 0.5, "none": None, "lengths": [1, 2], "note": "hi",
                      "table": pd.DataFrame({"a": [1]}), "arr": np.zeros(3)}, step=step)
    tracking.finish(exit_code=0)
    assert tracking.skipped == {"none": 2, "lengths": 2, "table": 2, "arr": 2}
    err = capsys.readouterr().err
    assert err.count("'lengths' is a builtins.list, not a metric") == 1
    assert _rows(store, "select step, key, value from metrics order by step") == [
        {"step": 1, "key": "loss", "value": 0.5}, {"step": 2, "key": "loss", "value": 0.5}]
    assert _rows(store, "select step, key, text from texts order by step") == [
        {"step": 1, "key": "note", "text": "hi"}, {"step": 2, "key": "note", "text": "hi"}]


def test_a_restarted_job_with_the_same_names_is_a_new_attempt_of_the_same_run(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verl's resume: same project and experiment name, the same run, one more attempt; the
    steps logged again supersede the first attempt's."""
    first = verl_tracking.Tracking("proj", "exp", ["tracklake"])
    for step in (1, 2, 3):
        first.log({"loss": float(step)}, step=step)
    first.finish(exit_code=1)
    second = verl_tracking.Tracking("proj", "exp", ["tracklake"])
    for step in (3, 4):
        second.log({"loss": 10.0 * step}, step=step)
    second.finish(exit_code=0)
    other = verl_tracking.Tracking("proj", "other", ["tracklake"])
    other.finish(exit_code=0)

    run_id = integration.run_id_for("proj", "exp")
    err = capsys.readouterr().err
    assert f"tracklake: verl run '{run_id}' attempt 2 (rank 0) is written to '{store}'" in err
    assert run_id == integration.run_id_for("proj", "exp")
    assert run_id != integration.run_id_for("proj", "other")
    assert run_id != integration.run_id_for("other", "exp")
    assert _rows(store, f"select attempt, status from run_attempts where run = '{run_id}' "
                 "order by attempt") == [
        {"attempt": 1, "status": "failed"}, {"attempt": 2, "status": "finished"}]
    assert _rows(store, f"select step, value from metrics where run = '{run_id}' "
                 "order by step") == [{"step": 1, "value": 1.0}, {"step": 2, "value": 2.0},
                                      {"step": 3, "value": 30.0}, {"step": 4, "value": 40.0}]


def test_tracklake_run_id_overrides_the_derived_one(store: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_RUN_ID", "given")
    tracking = verl_tracking.Tracking("proj", "exp", ["tracklake"])
    tracking.finish(exit_code=0)
    assert _rows(store, "select run from runs") == [{"run": "given"}]


def test_validation_generations_land_under_verls_key(store: Path) -> None:
    """verl's trainer calls ``ValidationGenerationsLogger.log(config.trainer.logger, samples,
    step)`` with (input, output, score) tuples; they are stored as ``val/generations``."""
    cfg = _trainer_config("trainer.logger=[console,tracklake]", "trainer.project_name=proj",
                          "trainer.experiment_name=exp")
    tracking = _tracking(cfg)
    gen_logger = verl_tracking.ValidationGenerationsLogger(
        project_name=cfg.trainer.project_name, experiment_name=cfg.trainer.experiment_name)
    samples = [("1+1=", "2", 1.0), ("2+2=", "5", np.float32(0.0))]
    gen_logger.log(cfg.trainer.logger, samples, 7)
    reward_table = verl_tracking.DapoFilteredRewardTableLogger(
        project_name="proj", experiment_name="exp")
    reward_table.log(cfg.trainer.logger, {1.0: 3, 0.0: 2}, 7)
    tracking.finish(exit_code=0)
    assert _rows(store, "select step, key, sample, input, output, score from generations "
                 "order by sample") == [
        {"step": 7, "key": "val/generations", "sample": 0, "input": "1+1=", "output": "2",
         "score": 1.0},
        {"step": 7, "key": "val/generations", "sample": 1, "input": "2+2=", "output": "5",
         "score": 0.0}]
    assert _rows(store, "select step, key, text from texts") == [
        {"step": 7, "key": "training/filter_groups/filtered_reward_counts",
         "text": "0:2, 1:3"}]


def test_generations_without_an_open_tracking_are_named_not_silently_lost(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen_logger = verl_tracking.ValidationGenerationsLogger(project_name="proj",
                                                           experiment_name="nowhere")
    gen_logger.log(["tracklake"], [("q", "a", 1.0)], 1)
    assert "validation generations for project 'proj' experiment 'nowhere' not recorded" in (
        capsys.readouterr().err)
    assert not any(p.is_file() for p in store.rglob("*"))


@pytest.mark.slow
def test_a_worker_process_gets_the_backend_from_the_entry_point_alone(root: Path) -> None:
    """A fresh interpreter that imports only verl, as a Ray worker does, can log to
    ``tracklake``: the ``verl.plugins`` entry point installed it."""
    script = textwrap.dedent("""
        import sys
        from verl.utils.tracking import Tracking
        t = Tracking("proj", "worker", ["tracklake"], config={"seed": 1})
        t.log({"loss": 0.5}, step=3)
        t.finish(exit_code=0)
        print(sorted(m for m in sys.modules if m.startswith("tracklake._integrations")))
    """)
    env = child_env() | {"TRACKLAKE_ROOT": str(root)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "tracklake._integrations.verl.plugin" in done.stdout
    assert _rows(root, "select run, status from runs") == [
        {"run": integration.run_id_for("proj", "worker"), "status": "finished"}]
    assert _rows(root, "select step, value from metrics") == [{"step": 3, "value": 0.5}]
