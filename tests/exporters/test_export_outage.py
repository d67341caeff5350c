"""A destination that goes down delays only its own exporter: the MLflow server is
stopped in the middle of an export and kept down; the exporter waits with backoff,
resumes when the server is back, and the server ends with exactly the store's data."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import tracklake
from tracklake.exporters import Exporter, ExportOptions, Selection

pytestmark = pytest.mark.slow

STEPS = 3000


def test_the_exporter_waits_out_an_mlflow_outage_and_delivers_exactly_once(
        root: Path, mlflow_server_control: object, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    from tracklake.exporters.mlflow.destination import MlflowDestination

    server = mlflow_server_control
    with tracklake.init(project="outage", run_id="r", root=root, capture_identity=False) as run:
        for step in range(STEPS):
            run.log({"loss": step * 0.25, "acc": step / 4096}, step=step)
            if step % 500 == 0:
                run.flush()  # several segments, so the export takes several commits
    commits: list[float] = []
    messages: list[str] = []

    class Observed(MlflowDestination):
        def commit(self, info: object) -> object:  # type: ignore[override]
            state = super().commit(info)  # type: ignore[arg-type]
            commits.append(time.monotonic())
            return state

    retries = threading.Semaphore(0)

    def counted_sleep(seconds: float) -> None:
        retries.release()
        time.sleep(seconds)

    exporter = Exporter(Observed(tracking_uri=mlflow_server), root=root,
                        selection=Selection(runs=("r",)),
                        options=ExportOptions(batch_rows=600, retry_initial=0.5,
                                              retry_max=2.0, give_up_after=120.0),
                        log=messages.append, sleep=counted_sleep)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(exporter.run()))
    with server.outage():  # type: ignore[attr-defined]
        thread.start()
        for _ in range(3):  # the exporter meets the outage three times: it stays down
            assert retries.acquire(timeout=60)
        assert "retry 1 in" in messages[0]
        assert not commits
    thread.join(timeout=120)
    assert not thread.is_alive()
    summary = outcome[0]
    assert summary.runs["outage/r"].error is None  # type: ignore[attr-defined]
    assert len(commits) >= 5

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`tracklake.run_id` = 'outage/r'")
    assert len(runs) == 1
    history = sorted((m.step, m.value) for m in client.get_metric_history(
        runs[0].info.run_id, "loss"))
    assert history == [(s, s * 0.25) for s in range(STEPS)]
    assert runs[0].info.status == "FINISHED"
