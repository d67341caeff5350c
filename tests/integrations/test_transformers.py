"""The transformers integration against real transformers from PyPI: a tiny Trainer on 2
processes (``torchrun``, gloo, CPU) writes its logs once, at each global step, under the
names W&B shows; a crashed training resumed from its checkpoint continues the same run as a
new attempt; TRL's completions files become generations."""

from __future__ import annotations

import json
from math import nan
from pathlib import Path
from typing import Any

import pytest
from _optional import optional
from _trainer_jobs import logged, torchrun

import tracklake

torch = optional("torch")
transformers = optional("transformers")

pytestmark = pytest.mark.xdist_group("torchrun")

SCRIPT = Path(__file__).with_name("_hf_train.py")


def _train(root: Path, output_dir: Path, *flags: str, expect_ok: bool = True) -> str:
    """The tiny job on 2 processes; its combined output."""
    return torchrun(SCRIPT, root, output_dir, *flags, expect_ok=expect_ok)


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


def test_two_processes_log_the_trainers_values_once_at_each_global_step(tmp_path: Path,
                                                                         root: Path) -> None:
    out_dir = tmp_path / "out"
    _train(root, out_dir)
    history = json.loads((out_dir / "log_history.json").read_text())
    rows = _rows(root, "SELECT rank, attempt, step, key, value FROM metrics ORDER BY seq")
    assert {(r["rank"], r["attempt"]) for r in rows} == {(0, 1)}  # world rank zero, once
    assert sorted((r["key"], r["step"], r["value"]) for r in rows) == sorted(logged(history))
    keys = {r["key"] for r in rows}
    assert {"train/loss", "train/learning_rate", "eval/loss", "train/train_runtime"} <= keys
    # evaluate() after train() logged into the same run, at the last step
    assert [r["step"] for r in rows if r["key"] == "eval/loss"] == [3, 6, 6]
    [run] = _rows(root, "SELECT project, name, status, ranks FROM runs")
    assert run == {"project": "hf", "name": "tiny", "status": "finished", "ranks": 1}
    config = {r["key"]: json.loads(r["value"])
              for r in _rows(root, "SELECT key, value FROM configs")}
    assert config["trainer/learning_rate"] == 0.001
    assert config["trainer/max_steps"] == 6
    assert config["model/n_embd"] == 8
    assert config["model/id2label/0"] == "a"  # int keys of the model config, as text
    assert config["model/num_parameters"] > 0
    manifests = _rows(root, "SELECT name, step FROM artifacts ORDER BY step")
    assert manifests == [{"name": "checkpoint-3.json", "step": 3},
                         {"name": "checkpoint-6.json", "step": 6}]


def test_report_to_tracklake_names_the_callback_once_the_module_is_imported(
        tmp_path: Path, root: Path) -> None:
    _train(root, tmp_path / "out", "--report-to")
    [run] = _rows(root, "SELECT project, name, status FROM runs")
    assert run == {"project": "huggingface", "name": "tiny", "status": "finished"}
    steps = [r["step"] for r in _rows(
        root, "SELECT step FROM metrics WHERE key = 'train/loss' ORDER BY step")]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_crashed_training_resumed_from_its_checkpoint_is_a_new_attempt_of_the_run(
        tmp_path: Path, root: Path) -> None:
    out_dir = tmp_path / "out"
    _train(root, out_dir, "--crash-at", "5", expect_ok=False)
    [first] = _rows(root, "SELECT run, status FROM runs")
    assert first["status"] == "failed"
    _train(root, out_dir, "--resume")  # a new torchrun: a new TORCHELASTIC_RUN_ID
    history = json.loads((out_dir / "log_history.json").read_text())
    [run] = _rows(root, "SELECT run, status, attempts FROM runs")
    assert run == {"run": first["run"], "status": "finished", "attempts": 2}
    attempts = _rows(root, "SELECT attempt, status FROM run_attempts ORDER BY attempt")
    assert attempts == [{"attempt": 1, "status": "failed"}, {"attempt": 2, "status": "finished"}]
    loss = _rows(root, "SELECT step, attempt, value FROM metrics WHERE key = 'train/loss' "
                       "ORDER BY step")
    assert [(r["step"], r["attempt"]) for r in loss] == [
        (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
    resumed = {e["step"]: e["loss"] for e in history if "loss" in e}
    assert {r["step"]: r["value"] for r in loss if r["attempt"] == 2} == {
        s: resumed[s] for s in (4, 5, 6)}
    # attempt 1's step 4 is kept, superseded, in the views of every attempt
    assert [r["attempt"] for r in _rows(
        root, "SELECT attempt FROM metrics_all WHERE key = 'train/loss' AND step = 4 "
              "ORDER BY attempt")] == [1, 2]


def test_a_checkpoint_written_without_the_callback_resumes_into_a_new_run(
        tmp_path: Path, root: Path) -> None:
    out_dir = tmp_path / "out"
    _train(root, out_dir, "--no-callback", "--crash-at", "5", expect_ok=False)
    assert not _rows(root, "SELECT run FROM runs")
    _train(root, out_dir, "--resume")  # saves checkpoint-6 without a KeyError
    [run] = _rows(root, "SELECT status, attempts FROM runs")
    assert run == {"status": "finished", "attempts": 1}
    steps = [r["step"] for r in _rows(
        root, "SELECT step FROM metrics WHERE key = 'train/loss' ORDER BY step")]
    assert steps == [4, 5, 6]


def _completions(path: Path, step: int, rows: dict[str, list[Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"step": [step] * len(rows["prompt"]), **rows}),
                   path / f"completions_{step:05d}.parquet")


class _Model:
    """What the callback reads of the Trainer's model: its training flag."""

    def __init__(self, training: bool) -> None:
        self.training = training


def test_trl_completions_files_become_generations_at_their_step(tmp_path: Path,
                                                                 root: Path) -> None:
    """GRPOTrainer's ``completions_NNNNN.parquet`` files (TRL's columns: step, prompt,
    completion, one column per reward function, advantage), as TRL writes them: after each
    ``on_log``, read at the next event; a chat prompt is kept as JSON, a lone reward is the
    score."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tracklake.integrations.transformers import TracklakeCallback

    out_dir = tmp_path / "out"
    args = TrainingArguments(output_dir=str(out_dir), report_to="none", use_cpu=True)
    args.log_completions = True  # GRPOConfig's field
    state, control = TrainerState(), TrainerControl()
    callback = TracklakeCallback(project="trl", root=str(root))
    callback.on_train_begin(args, state, control)
    chat = [{"role": "user", "content": "2+2?"}]
    state.global_step = 2
    callback.on_log(args, state, control, logs={"loss": 1.0}, model=_Model(training=True))
    _completions(out_dir / "completions", 2, {
        "prompt": ["1+1?", "3+3?"], "completion": ["2", "7"], "accuracy": [1.0, 0.0],
        "advantage": [0.5, -0.5]})
    state.global_step = 3
    callback.on_step_end(args, state, control)
    state.global_step = 4
    callback.on_log(args, state, control, logs={"loss": 1.0}, model=_Model(training=True))
    _completions(out_dir / "completions", 4, {
        "prompt": [chat], "completion": ["4"], "accuracy": [1.0],
        "length": [0.2], "advantage": [0.0]})
    callback.on_train_end(args, state, control)
    callback._run.finish()  # type: ignore[union-attr]
    rows = _rows(root, "SELECT step, sample, input, output, score, extra FROM generations "
                       "WHERE key = 'completions' ORDER BY step, sample")
    assert [(r["step"], r["sample"], r["input"], r["output"], r["score"]) for r in rows] == [
        (2, 0, "1+1?", "2", 1.0), (2, 1, "3+3?", "7", 0.0), (4, 0, json.dumps(chat), "4", None)]
    assert json.loads(rows[0]["extra"]) == {"accuracy": 1.0, "advantage": 0.5}
    assert json.loads(rows[2]["extra"]) == {"accuracy": 1.0, "length": 0.2, "advantage": 0.0}


def test_trl_rewrites_of_a_completions_file_are_read_as_trl_logged_them(tmp_path: Path,
                                                                        root: Path) -> None:
    """TRL rewrites step N's file after every log at N: an evaluation's samples (the model
    not training) become ``eval/completions`` and the training's stay ``completions``; the
    end-of-training summary's rewrite of the same samples (a NaN reward too) is not logged
    twice; a file left by a crashed attempt is never read as the resumed attempt's; a
    symlink is left out."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tracklake.integrations.transformers import TracklakeCallback

    out_dir = tmp_path / "out"
    args = TrainingArguments(output_dir=str(out_dir), report_to="none", use_cpu=True)
    args.log_completions = True
    completions = out_dir / "completions"
    _completions(completions, 4, {"prompt": ["stale"], "completion": ["x"], "r": [0.0]})
    state, control = TrainerState(), TrainerControl()
    state.global_step = 3  # resumed from checkpoint-3
    callback = TracklakeCallback(project="trl", root=str(root))
    callback.on_train_begin(args, state, control)
    state.global_step = 4
    callback.on_step_end(args, state, control)  # the crashed attempt's step 4: not read
    training, evaluating = _Model(training=True), _Model(training=False)
    callback.on_log(args, state, control, logs={"loss": 1.0}, model=training)
    _completions(completions, 4, {"prompt": ["train"], "completion": ["t"], "r": [1.0]})
    callback.on_log(args, state, control, logs={"eval_loss": 2.0}, model=evaluating)
    _completions(completions, 4, {"prompt": ["eval"], "completion": ["e"], "r": [nan]})
    callback.on_evaluate(args, state, control)
    callback.on_log(args, state, control, logs={"train_runtime": 1.0}, model=evaluating)
    _completions(completions, 4, {"prompt": ["eval"], "completion": ["e"], "r": [nan]})
    callback.on_train_end(args, state, control)
    state.global_step = 5
    callback.on_log(args, state, control, logs={"loss": 1.0}, model=training)
    (completions / "completions_00005.parquet").symlink_to("/etc/passwd")
    callback.on_step_end(args, state, control)
    callback._run.finish()  # type: ignore[union-attr]
    rows = _rows(root, "SELECT key, step, input FROM generations ORDER BY seq")
    assert rows == [{"key": "completions", "step": 4, "input": "train"},
                    {"key": "eval/completions", "step": 4, "input": "eval"}]


def test_each_trial_of_a_hyperparameter_search_is_a_run_of_its_own(tmp_path: Path,
                                                                  root: Path) -> None:
    """The Trainer's events as `hyperparameter_search` sends them (one `train()` per
    trial, the state naming the trial and its parameters)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tracklake.integrations.transformers import TracklakeCallback

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none",
                             use_cpu=True, run_name="search")
    callback, control = TracklakeCallback(project="hp", root=str(root)), TrainerControl()
    for trial, lr in (("trial-0", 0.1), ("trial-1", 0.01)):
        state = TrainerState()
        state.is_hyper_param_search, state.trial_name = True, trial
        state.trial_params = {"learning_rate": lr}
        callback.on_train_begin(args, state, control)
        state.global_step = 1
        callback.on_log(args, state, control, logs={"loss": lr * 10})
    callback._run.finish()  # type: ignore[union-attr]
    runs = _rows(root, "SELECT name, status, tags FROM runs ORDER BY name")
    assert runs == [{"name": "trial-0", "status": "finished", "tags": ["search:search"]},
                    {"name": "trial-1", "status": "finished", "tags": ["search:search"]}]
    rows = _rows(root, "SELECT r.name, m.value, c.value AS lr FROM metrics m "
                       "JOIN runs r USING (project, run) JOIN configs c USING (project, run) "
                       "WHERE c.key = 'trial/learning_rate' ORDER BY r.name")
    assert [(r["name"], r["value"], json.loads(r["lr"])) for r in rows] == [
        ("trial-0", 1.0, 0.1), ("trial-1", 0.1, 0.01)]
