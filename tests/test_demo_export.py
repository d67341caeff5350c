"""`tracklake demo --export [DEST]`: the demo's run reaches TensorBoard (by default) or
MLflow beside the store, point for point as the store holds it, read back with each
tool's own reader; a bad destination fails before the job runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from _optional import optional
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main

SMALL = ("--ranks", "2", "--steps", "60")
KEY = "critic/score/mean"


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _store_points(root: Path) -> tuple[str, list[tuple[int, float]]]:
    """The demo's run id and rank 0's points of KEY, from the store itself."""
    table = tracklake.query(f"SELECT run, step, value FROM metrics WHERE key = '{KEY}' "
                            "AND rank = 0 ORDER BY step", root=root)
    runs = set(table.column("run").to_pylist())
    assert len(runs) == 1
    points = [(r["step"], r["value"]) for r in table.to_pylist()]
    return runs.pop(), points


def test_export_without_a_name_writes_tensorboard_beside_the_store(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    optional("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    code, out = _invoke("demo", "--root", str(root), *SMALL, "--export")
    assert code == 0, out
    assert "tensorboard --logdir store-tensorboard" in out  # <root>-tensorboard, as typed
    run_id, points = _store_points(root)
    assert len(points) == 60
    assert f"exported demo/{run_id} (rank 0)" in out and "steps 0..59" in out

    accumulator = EventAccumulator(str(tmp_path / "store-tensorboard" / "demo" / run_id),
                                   size_guidance={"scalars": 0})
    accumulator.Reload()
    keys = tracklake.query("SELECT DISTINCT key FROM metrics WHERE rank = 0", root=root)
    assert set(accumulator.Tags()["scalars"]) == set(keys.column("key").to_pylist())
    scalars = accumulator.Scalars(KEY)
    assert [e.step for e in scalars] == [step for step, _ in points]
    assert [e.value for e in scalars] == pytest.approx([v for _, v in points], rel=1e-6)
    assert not list(root.rglob("events.out.tfevents*"))  # nothing inside the store


@pytest.mark.filterwarnings(  # MLflow 3.17's SQL store on SQLAlchemy 2.1 (see test_mlflow)
    "ignore:The ``noload`` loader strategy is deprecated")
def test_export_mlflow_writes_a_sqlite_database_mlflow_client_reads(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    optional("mlflow")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    target = tmp_path / "mlflow-out"
    code, out = _invoke("demo", "--root", str(root), *SMALL, "--export", "mlflow",
                        "--export-dir", str(target))
    assert code == 0, out
    uri = f"sqlite:///{target}/mlflow.db"
    assert f"mlflow ui --backend-store-uri {uri}" in out
    run_id, points = _store_points(root)

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("demo")
    assert experiment is not None
    [mlrun] = client.search_runs([experiment.experiment_id],
                                 f"tags.`tracklake.run_id` = 'demo/{run_id}'")
    assert mlrun.info.status == "FINISHED"
    history = sorted(client.get_metric_history(mlrun.info.run_id, KEY), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == points
    assert Path(mlrun.info.artifact_uri.removeprefix("file://")).is_relative_to(target)
    assert not list(cwd.iterdir())  # no ./mlruns or ./mlflow.db in the current directory


def test_an_unknown_destination_fails_before_the_job_naming_the_installed_ones(
        root: Path) -> None:
    code, out = _invoke("demo", "--root", str(root), *SMALL, "--export", "nowhere")
    assert code == 2
    assert "no exporter named 'nowhere'" in out and "tensorboard" in out
    assert not any(p.is_file() for p in root.rglob("*"))  # the demo did not run


def test_a_destination_that_is_not_installed_names_the_pip_extra(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr("tracklake.exporters.load", missing)
    code, out = _invoke("demo", "--root", str(root), "--export", "swanlab")
    assert code == 1
    assert "pip install 'tracklake[swanlab]'" in out
    assert not any(p.is_file() for p in root.rglob("*"))


def test_an_export_dir_inside_the_store_is_refused(root: Path) -> None:
    code, out = _invoke("demo", "--root", str(root), "--export",
                        "--export-dir", str(root / "tb"))
    assert code == 2
    assert "inside the store" in out
