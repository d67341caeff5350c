"""A resumed run reaches every destination as the default views show it: the steps a later
attempt logged again hold that attempt's values only, in every rank mode, whether the
later attempt was there before the export or came while it was following."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _optional import optional

import tracklake
from tracklake.exporters import (
    Exporter,
    ExportOptions,
    MemoryDestination,
    Selection,
)

ALL = Selection(all_runs=True)


def _attempt(root: Path, steps: range, *, rank: int = 0, offset: float,
             project: str = "p") -> None:
    """One attempt of run r on `rank`: loss = offset + step (+ 1000 per rank)."""
    with tracklake.init(project=project, run_id="r", root=root, rank=rank,
                        capture_identity=False) as run:
        for step in steps:
            run.log({"loss": offset + step + rank * 1000}, step=step)
        run.log_text("note", f"attempt at {offset}", step=steps[-1])


def _quiet(message: str) -> None:
    del message


def _export(dest: Any, root: Path, **options: Any) -> None:
    Exporter(dest, root=root, selection=ALL, options=ExportOptions(**options), log=_quiet,
             sleep=lambda s: None).run()


def _view(root: Path, sql: str) -> list[tuple[Any, ...]]:
    table = tracklake.query(sql, root=root)
    return sorted(zip(*(table.column(i).to_pylist() for i in range(table.num_columns)),
                      strict=True))


def _sent(dest: MemoryDestination, kind: str = "metrics") -> list[tuple[Any, ...]]:
    table = dest.runs["p/r"].table(kind)
    assert table is not None
    return sorted(zip(table.column("step").to_pylist(), table.column("key").to_pylist(),
                      table.column("value" if kind == "metrics" else "text").to_pylist(),
                      strict=True))


def test_a_run_resumed_before_its_export_arrives_as_the_views_show_it(root: Path) -> None:
    _attempt(root, range(100), offset=0.0)
    _attempt(root, range(60, 150), offset=0.5)  # resumed from the checkpoint at step 60
    dest = MemoryDestination()
    _export(dest, root)
    view = _view(root, "SELECT step, key, value FROM metrics")
    assert len(view) == 150  # one value per step
    assert _sent(dest) == view
    assert _sent(dest, "texts") == _view(root, "SELECT step, key, text FROM texts")


@pytest.mark.parametrize("mode", ["mean", "min", "max"])
def test_rank_aggregates_of_a_resumed_run_are_over_each_ranks_latest_attempt(
        root: Path, mode: str) -> None:
    """2 ranks, both resumed at step 30: at every step the aggregate is that of the values
    the views show, once (before: the superseded attempt mixed in, then a one-rank
    aggregate of the later attempt written after it)."""
    for rank in (0, 1):
        _attempt(root, range(50), rank=rank, offset=0.0)
    for rank in (0, 1):
        _attempt(root, range(30, 80), rank=rank, offset=0.5)
    dest = MemoryDestination()
    _export(dest, root, ranks=mode)
    fn = {"mean": "avg", "min": "min", "max": "max"}[mode]
    view = _view(root, f"SELECT step, key, {fn}(value) FROM metrics GROUP BY step, key")
    assert len(view) == 80
    assert _sent(dest) == view


def test_a_later_attempt_that_comes_while_following_supersedes_what_was_held(
        root: Path) -> None:
    """Rank 1 of attempt 1 is behind at step 40, so rank 0's steps 41-49 are held for the
    mean when both ranks are resumed at step 30: the held values of the superseded
    attempt are never used."""
    _attempt(root, range(50), rank=0, offset=0.0)
    behind = tracklake.init(project="p", run_id="r", root=root, rank=1,
                            capture_identity=False)
    for step in range(41):
        behind.log({"loss": step + 1000.0}, step=step)
    behind.flush()
    dest = MemoryDestination()
    _export(dest, root, ranks="mean")  # the run is live: rank 0's steps 41-49 are held
    behind.finish()
    for rank in (0, 1):  # resumed at step 30, stopped again at 44
        _attempt(root, range(30, 45), rank=rank, offset=0.5)
    _export(dest, root, ranks="mean")
    table = dest.runs["p/r"].table("metrics")
    assert table is not None
    steps, values = table.column("step").to_pylist(), table.column("value").to_pylist()
    # in the order they were sent; rank 0's held 45-49 are superseded, never sent
    assert steps == list(range(41)) + list(range(30, 45))
    view = _view(root, "SELECT step, key, avg(value) FROM metrics WHERE step >= 30 "
                 "GROUP BY step, key")
    assert [(s, "loss", v) for s, v in zip(steps[41:], values[41:], strict=True)] == view
    attempts = dict(zip(steps[41:], table.column("attempt").to_pylist()[41:], strict=True))
    assert set(attempts.values()) == {2}


# -- TensorBoard, read back with its own loaders ---------------------------------------


def _tb_values(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """The loss points of run p/r as each of TensorBoard's Python loaders shows them."""
    event_accumulator = optional("tensorboard.backend.event_processing.event_accumulator")
    plugin_accumulator = optional("tensorboard.backend.event_processing."
                                  "plugin_event_accumulator")
    tensor_util = optional("tensorboard.util.tensor_util")
    run_dir = logdir / "p" / "r"
    legacy = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    legacy.Reload()
    server = plugin_accumulator.EventAccumulator(str(run_dir),
                                                  tensor_size_guidance={"scalars": 0})
    server.Reload()
    return {
        "EventAccumulator": [(e.step, round(e.value, 3)) for e in legacy.Scalars("loss")],
        "load_fast=false": [(e.step, round(float(tensor_util.make_ndarray(e.tensor_proto)), 3))
                            for e in server.Tensors("loss")],
    }


def _view_points(root: Path, where: str = "") -> list[tuple[int, float]]:
    return [(s, round(v, 3)) for s, v in _view(
        root, f"SELECT step, value FROM metrics WHERE key = 'loss' {where}")]


@pytest.mark.parametrize("live", [False, True], ids=["resumed-before", "resumed-while-exporting"])
def test_tensorboard_shows_each_step_once_with_the_later_attempts_value(
        root: Path, tmp_path: Path, live: bool) -> None:
    tensorboard_destination = optional("tracklake.exporters.tensorboard")
    logdir = tmp_path / "tb"
    _attempt(root, range(100), offset=0.0)
    if live:  # attempt 1 reaches TensorBoard before attempt 2 exists
        _export(tensorboard_destination.TensorBoardDestination(logdir=logdir), root)
    _attempt(root, range(60, 150), offset=0.5)
    _export(tensorboard_destination.TensorBoardDestination(logdir=logdir), root)
    view = _view_points(root)
    assert len(view) == 150 and (60, 60.5) in view
    for loader, points in _tb_values(logdir).items():
        assert sorted(points) == view, loader


# -- MLflow, read back with MlflowClient -----------------------------------------------


def _mlflow_runs(uri: str, project: str) -> dict[str, list[tuple[int, float]]]:
    """Per MLflow run of `project` (by its ``tracklake.run_id`` tag): loss points."""
    client = optional("mlflow.tracking").MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(project)
    found: dict[str, list[tuple[int, float]]] = {}
    for mlrun in client.search_runs([experiment.experiment_id]):
        points = [(m.step, round(m.value, 3))
                  for m in client.get_metric_history(mlrun.info.run_id, "loss")]
        found[mlrun.data.tags["tracklake.run_id"]] = sorted(points)
    return found


@pytest.mark.parametrize("live", [False, True], ids=["resumed-before", "resumed-while-exporting"])
def test_mlflow_holds_each_step_once_per_run_with_the_later_attempt_in_its_own(
        root: Path, tmp_path: Path, mlflow_server: str, live: bool) -> None:
    """Exported after the fact, the run is one MLflow run holding what the views show.
    Exported while it ran, attempt 1's steps 60-99 were delivered before attempt 2 logged
    them again: attempt 2 goes to an MLflow run of its own (a child of the first), so that
    no MLflow run holds two values at one step (before: 190 points for 150 steps)."""
    mlflow_destination = optional("tracklake.exporters.mlflow")
    uri = mlflow_server
    project = f"supersession-{'live' if live else 'after'}-{tmp_path.name}"[:60]
    _attempt(root, range(100), offset=0.0, project=project)
    if live:
        _export(mlflow_destination.MlflowDestination(tracking_uri=uri), root)
    _attempt(root, range(60, 150), offset=0.5, project=project)
    _export(mlflow_destination.MlflowDestination(tracking_uri=uri), root)
    runs = _mlflow_runs(uri, project)
    for points in runs.values():
        assert len({s for s, _ in points}) == len(points)  # one value per step
    key = f"{project}/r"
    if not live:
        assert runs == {key: _view_points(root)}
        return
    assert runs == {
        key: [(s, float(s)) for s in range(100)],
        f"{key} (attempt 2)": [(s, s + 0.5) for s in range(60, 150)]}
    client = optional("mlflow.tracking").MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(project)
    by_tag = {r.data.tags["tracklake.run_id"]: r
              for r in client.search_runs([experiment.experiment_id])}
    child = by_tag[f"{key} (attempt 2)"]
    assert child.data.tags["mlflow.parentRunId"] == by_tag[key].info.run_id
    assert child.info.run_name == "r (attempt 2)" and child.info.status == "FINISHED"


class _Killed(BaseException):
    """An exporter killed between a destination's write and the save of its commit."""


def test_mlflow_keeps_one_value_per_step_when_a_commit_was_lost_after_its_write(
        root: Path, tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Attempt 1's steps 0-99 reach MLflow, and the exporter dies before it saves that
    commit; attempt 2 then logs again from step 60. The export after it leaves attempt 1's
    steps 60-99 out (the views hide them), but MLflow holds them already: attempt 2 must
    go to a run of its own. Before, its steps 60-99 went into the first run beside them
    (two values at each of those steps), as an exporter SIGKILLed under load left it in
    tests/exporters/test_export_kill.py."""
    from tracklake.exporters._loop import state as state_module

    mlflow_destination = optional("tracklake.exporters.mlflow")
    uri = mlflow_server
    project = f"supersession-lost-{tmp_path.name}"[:60]
    _attempt(root, range(100), offset=0.0, project=project)
    real_save = state_module.ExportState.save

    def die_before_saving(self: Any) -> None:
        if self.records:
            raise _Killed  # the commit that delivered attempt 1's steps is not saved
        real_save(self)

    monkeypatch.setattr(state_module.ExportState, "save", die_before_saving)
    with pytest.raises(_Killed):
        _export(mlflow_destination.MlflowDestination(tracking_uri=uri), root)
    monkeypatch.setattr(state_module.ExportState, "save", real_save)
    assert len(_mlflow_runs(uri, project)[f"{project}/r"]) == 100
    _attempt(root, range(60, 150), offset=0.5, project=project)
    _export(mlflow_destination.MlflowDestination(tracking_uri=uri), root)
    runs = _mlflow_runs(uri, project)
    for tag, points in runs.items():
        assert len({s for s, _ in points}) == len(points), tag  # one value per step
    key = f"{project}/r"
    assert runs == {
        key: [(s, float(s)) for s in range(100)],
        f"{key} (attempt 2)": [(s, s + 0.5) for s in range(60, 150)]}
