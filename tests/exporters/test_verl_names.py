"""Generations stored under verl's key ``val/generations`` are exported where verl's own
`ValidationGenerationsLogger` puts them: a W&B table ``val/generations`` with one wide row
per step (W&B offline files read back), MLflow ``val_step{N}.json`` artifacts (a real
MLflow server on loopback), TensorBoard text ``val/generations`` in verl's markdown
(TensorBoard's EventAccumulator). Other generation keys keep tracklake's layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _optional import optional

import tracklake
from tracklake.exporters import Selection, export

#: verl's samples as its trainer passes them: (input, output, score), 3 then 4 per step.
SAMPLES = {100: [("q1", "a1", 1.0), ("q2", "a2", 0.0), ("q3 ünï", "a3\n|x|", 0.5)],
           200: [("q1", "b1", 1.0), ("q2", "b2", 1.0), ("q3 ünï", "b3", 0.0), ("q4", "b4", 0.25)]}


#: The project, and so the MLflow experiment: its own, as the MLflow server is shared.
PROJECT = "verl-names"


def _log(root: Path) -> None:
    with tracklake.init(project=PROJECT, run_id="verl-run", root=root,
                        capture_identity=False) as run:
        for step, samples in SAMPLES.items():
            run.log({"val-core/acc/best@4/mean": step / 1000}, step=step)
            run.log_generations(samples, step=step, key="val/generations")
        run.log_generations([("x", "y", 1.0)], step=100, key="val")


def test_wandb_gets_verls_wide_val_generations_rows(root: Path, tmp_path: Path) -> None:
    optional("wandb")
    import _wandb_log as wlog

    from tracklake.exporters.wandb import WandbDestination

    _log(root)
    summary = export(WandbDestination(dir=str(tmp_path / "out")), root=root,
                     selection=Selection(all_runs=True))
    assert not summary.failed, str(summary)
    files = sorted((tmp_path / "out").rglob("*.wandb"))
    by_step = dict(wlog.history(files))
    for step, samples in SAMPLES.items():
        ref = by_step[step]["val/generations"]
        assert ref["_type"] == "table-file" and ref["nrows"] == 1
        table = json.loads((files[0].parent / "files" / ref["path"]).read_text())
        # verl's ValidationGenerationsLogger: ["step"] + [input_i, output_i, score_i]...;
        # tables sent together take the widest step's columns, narrower rows padded
        assert table["columns"] == ["step"] + [f"{c}_{i}" for i in range(1, 5)
                                               for c in ("input", "output", "score")]
        padding = [None] * 3 * (4 - len(samples))
        assert table["data"] == [[step, *[v for s in samples for v in s], *padding]]
    assert "generations/val" in by_step[100]  # not verl's key: tracklake's layout


@pytest.mark.filterwarnings(  # MLflow's SQL store on SQLAlchemy 2.1 (as in test_mlflow.py)
    "ignore:The ``noload`` loader strategy is deprecated")
def test_mlflow_gets_verls_val_step_files_and_pass_at_k_names(
        root: Path, tmp_path: Path, mlflow_server: str) -> None:
    optional("mlflow")
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    from tracklake.exporters.mlflow import MlflowDestination

    _log(root)
    for _ in range(2):  # exported again: the files are the same, not doubled
        summary = export(MlflowDestination(tracking_uri=mlflow_server), root=root,
                         selection=Selection(all_runs=True))
        assert not summary.failed, str(summary)
    client = MlflowClient(mlflow_server)
    (found,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert "val-core/acc/best_at_4/mean" in found.data.metrics  # verl's MLflow name
    names = {f.path for f in client.list_artifacts(found.info.run_id)}
    assert {"val_step100.json", "val_step200.json"} <= names
    for step, samples in SAMPLES.items():
        local = download_artifacts(run_id=found.info.run_id, artifact_path=f"val_step{step}.json",
                                   dst_path=str(tmp_path / f"dl{step}"),
                                   tracking_uri=mlflow_server)
        got = json.loads(Path(local).read_text(encoding="utf-8"))
        # verl's log_generations_to_mlflow: [{"input", "output", "score"}, ...]
        assert got == [{"input": i, "output": o, "score": s} for i, o, s in samples]


def test_tensorboard_gets_verls_markdown_under_val_generations(root: Path,
                                                               tmp_path: Path) -> None:
    optional("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (
        TENSORS,
        EventAccumulator,
    )

    from tracklake.exporters.tensorboard import TensorBoardDestination

    _log(root)
    summary = export(TensorBoardDestination(logdir=tmp_path / "tb"), root=root,
                     selection=Selection(all_runs=True))
    assert not summary.failed, str(summary)
    [run_dir] = {p.parent for p in (tmp_path / "tb").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(run_dir), size_guidance={TENSORS: 0})
    acc.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode()
             for e in acc.Tensors("val/generations")}
    assert sorted(texts) == [100, 200]
    assert texts[100] == _verl_markdown(100, SAMPLES[100])
    assert "generations/val" in acc.PluginTagToContent("text")


def _verl_markdown(step: int, samples: list[tuple[Any, ...]]) -> str:
    """What verl's log_generations_to_tensorboard writes, by verl's own method."""
    verl_tracking = optional("verl.utils.tracking")
    captured: dict[str, Any] = {}

    class Writer:
        def add_text(self, tag: str, text: str, step: int) -> None:
            captured.update(tag=tag, text=text, step=step)

        def flush(self) -> None:
            pass

    logger = verl_tracking.ValidationGenerationsLogger("p", "e")
    logger.writer = Writer()  # verl's method builds a SummaryWriter only if it has none
    logger.log_generations_to_tensorboard(samples, step)
    assert captured["tag"] == "val/generations" and captured["step"] == step
    return str(captured["text"])
