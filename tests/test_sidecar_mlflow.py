"""Sidecar exporters to a real `mlflow server` on loopback: the run arrives exactly, and a
server that is down delays only its exporter — the trainer logs and finishes while the
exporter retries, and the exporter delivers once the server is back."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _optional import optional
from _sidecar import alive, trainer, wait_for

optional("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


def _server_module() -> Any:
    """The exporter tests' `MlflowServer` (tests/exporters/conftest.py), reused as it is."""
    path = Path(__file__).parent / "exporters" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_mlflow_server_for_sidecars", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_servers = _server_module()


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real mlflow server of the test's own (each test exports run p/r1), not started:
    the test starts it, or stops and starts it again."""
    s = _servers.MlflowServer(tmp_path_factory.mktemp("mlflow-sidecar"), _servers._free_port())
    try:
        yield s
    finally:
        s.stop()


def _history(uri: str) -> dict[str, list[tuple[int, float]]]:
    """Each metric's (step, value) points of the MLflow run of tracklake run p/r1."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("p")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id],
                               filter_string="tags.`tracklake.run_id` = 'p/r1'")
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id,
                                                                              key))
            for key in ("loss", "reward")}


def _expected(steps: int) -> dict[str, list[tuple[int, float]]]:
    return {"loss": [(s, 1.0 / (s + 1)) for s in range(steps)],
            "reward": [(s, float(s)) for s in range(steps)]}


def test_a_sidecar_exports_the_run_to_a_real_mlflow_server_exactly(
        tmp_path: Path, root: Path, server: Any) -> None:
    server.start()
    with trainer(tmp_path, root, {"mlflow": {"tracking_uri": server.uri}}) as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        t.wait_sidecars_exit()
        assert f"to {server.uri}: pid" in t.text()
    assert _history(server.uri) == _expected(40)


def test_a_destination_that_is_down_does_not_hold_the_trainer_back(
        tmp_path: Path, root: Path, server: Any) -> None:
    """The trainer logs, finishes with everything written and exits while its exporter is
    still retrying against a stopped server; the exporter delivers once it is back."""
    server.stop()
    with trainer(tmp_path, root, {"mlflow": {"tracking_uri": server.uri,
                                             "give_up_after": 600}}, steps=500) as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        assert t.process.returncode == 0
        [(_, pid, log)] = t.sidecars()
        assert alive(pid), t.text()  # the trainer ended; its exporter did not
        wait_for("the exporter to meet the outage", lambda: "retry 1 in" in log.read_text())
        server.start()
        t.wait_sidecars_exit()
    assert _history(server.uri) == _expected(500)
