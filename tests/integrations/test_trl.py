"""The transformers integration against a real TRL GRPOTrainer from PyPI: a tiny GRPO job on
2 processes (``torchrun``, gloo, CPU, ``report_to="tracklake"``) writes GRPO's metrics once,
at each global step, and its completions files as generations; a crashed training resumed
from its checkpoint continues the same run as a new attempt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _optional import optional
from _trainer_jobs import logged, torchrun

import tracklake

torch = optional("torch")
transformers = optional("transformers")
trl = optional("trl")

pytestmark = pytest.mark.xdist_group("trl")

SCRIPT = Path(__file__).with_name("_trl_grpo.py")
TRAIN_PROMPTS = {"how many a ?", "how many b ?", "a b c ?", "c d ?"}
EVAL_PROMPTS = {"how many c ?", "a a ?"}
#: what GRPOTrainer logs at each training step (beta 0; the reward functions `count_a`
#: and `no_opinion`, whose metrics TRL logs as None)
GRPO_KEYS = {
    "num_tokens", "completions/mean_length", "completions/min_length",
    "completions/max_length", "completions/clipped_ratio",
    "completions/mean_terminated_length", "completions/min_terminated_length",
    "completions/max_terminated_length", "rewards/count_a/mean", "rewards/count_a/std",
    "reward", "reward_std", "frac_reward_zero_std", "entropy", "clip_ratio/low_mean",
    "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
    "clip_ratio/high_max"}


def _train(root: Path, output_dir: Path, *flags: str, expect_ok: bool = True) -> str:
    """The tiny GRPO job on 2 processes; its combined output."""
    return torchrun(SCRIPT, root, output_dir, *flags, expect_ok=expect_ok)


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


def _content(message_list: str) -> str:
    [message] = json.loads(message_list)
    assert message["role"] == "assistant"
    return str(message["content"])


@pytest.fixture(scope="session")  # once per worker: the "trl" group keeps these tests on
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:  # one, not in a row
    """The store and output folder of the GRPO job: crashed at step 5, then resumed from
    checkpoint-3 by a new torchrun (a new TORCHELASTIC_RUN_ID)."""
    base = tmp_path_factory.mktemp("grpo")
    root, out_dir = base / "store", base / "out"
    (root / "runs").mkdir(parents=True)
    _train(root, out_dir, "--crash-at", "5", expect_ok=False)
    [first] = _rows(root, "SELECT status FROM runs")
    assert first["status"] == "failed"
    _train(root, out_dir, "--resume")
    return root, out_dir


def test_grpo_metrics_are_the_trainers_log_history_once_at_each_global_step(
        job: tuple[Path, Path]) -> None:
    """GRPO's metrics, train and eval, at their steps, once, from world rank zero of 2
    processes; the `None`s TRL logs for a reward function without an opinion left out."""
    root, out_dir = job
    history = json.loads((out_dir / "log_history.json").read_text())
    rows = _rows(root, "SELECT rank, step, key, value FROM metrics")
    assert {r["rank"] for r in rows} == {0}
    assert sorted((r["key"], r["step"], r["value"]) for r in rows) == sorted(logged(history))
    steps: dict[str, list[int]] = {}
    for r in sorted(rows, key=lambda r: r["step"]):
        steps.setdefault(r["key"], []).append(r["step"])
    for key in GRPO_KEYS:
        assert steps[f"train/{key}"] == [1, 2, 3, 4, 5, 6], key
        assert steps[f"eval/{key}"] == [3, 6], key
    assert steps["train/loss"] == [1, 2, 3, 4, 5, 6]
    assert steps["train/train_runtime"] == [6]
    assert {k for e in history for k, v in e.items() if v is None} == {
        "rewards/no_opinion/mean", "rewards/no_opinion/std", "eval_rewards/no_opinion/mean",
        "eval_rewards/no_opinion/std"}
    assert not [k for k in steps if "no_opinion" in k]


def test_a_resume_from_a_checkpoint_is_attempt_2_of_the_run_from_that_step(
        job: tuple[Path, Path]) -> None:
    """The crashed attempt's steps after checkpoint-3 (metrics, completions) are superseded
    by attempt 2's, and kept in the ``_all`` views."""
    root, _ = job
    [run] = _rows(root, "SELECT project, name, status, ranks, attempts FROM runs")
    assert run == {"project": "trl", "name": "grpo", "status": "finished", "ranks": 1,
                   "attempts": 2}
    assert _rows(root, "SELECT attempt, status FROM run_attempts ORDER BY attempt") == [
        {"attempt": 1, "status": "failed"}, {"attempt": 2, "status": "finished"}]
    for view in ("metrics", "generations"):
        assert {(r["step"], r["attempt"]) for r in _rows(
            root, f"SELECT step, attempt FROM {view}")} == {
            (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)}, view
        assert [r["attempt"] for r in _rows(
            root, f"SELECT DISTINCT attempt FROM {view}_all WHERE step = 4 "
                  "ORDER BY attempt")] == [1, 2], view
    assert _rows(root, "SELECT name, step, attempt FROM artifacts ORDER BY step") == [
        {"name": "checkpoint-3.json", "step": 3, "attempt": 1},
        {"name": "checkpoint-6.json", "step": 6, "attempt": 2}]


def test_the_config_holds_grpoconfigs_fields_and_the_models(job: tuple[Path, Path]) -> None:
    root, _ = job
    config = {r["key"]: json.loads(r["value"])
              for r in _rows(root, "SELECT key, value FROM configs")}
    assert {k: config[f"trainer/{k}"] for k in (
        "num_generations", "max_completion_length", "beta", "log_completions",
        "learning_rate", "max_steps", "ddp_backend", "report_to")} == {
        "num_generations": 2, "max_completion_length": 4, "beta": 0.0,
        "log_completions": True, "learning_rate": 0.01, "max_steps": 6,
        "ddp_backend": "gloo", "report_to": ["tracklake"]}
    assert config["model/n_embd"] == 8 and config["model/vocab_size"] == 18
    assert config["model/num_parameters"] > 0


def test_completions_become_generations_an_evaluations_apart(job: tuple[Path, Path]) -> None:
    """4 samples a step (2 prompts x 2 generations, gathered from both processes): the
    training's under ``completions``, an evaluation's under ``eval/completions``, as
    TRL wrote each file after that log; the prompt and completion chats as JSON, both
    rewards and the advantage in `extra`, no score (two reward functions)."""
    import pyarrow.parquet as pq

    root, out_dir = job
    gens = _rows(root, "SELECT key, step, sample, input, output, score, extra "
                       "FROM generations ORDER BY key, step, sample")
    by_step: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for g in gens:
        by_step.setdefault((g["key"], g["step"]), []).append(g)
    assert {k: [g["sample"] for g in v] for k, v in by_step.items()} == {
        **{("completions", s): [0, 1, 2, 3] for s in range(1, 7)},
        ("eval/completions", 3): [0, 1, 2, 3], ("eval/completions", 6): [0, 1, 2, 3]}
    for (key, _), samples in by_step.items():
        prompts = TRAIN_PROMPTS if key == "completions" else EVAL_PROMPTS
        for g in samples:
            [message] = json.loads(g["input"])
            assert message == {"role": "user", "content": message["content"]}
            assert message["content"] in prompts
            extra = json.loads(g["extra"])
            assert g["score"] is None and set(extra) == {"count_a", "no_opinion", "advantage"}
            assert extra["count_a"] == float(_content(g["output"]).split().count("a"))
            assert extra["no_opinion"] is None
    # exactly what TRL wrote, in order: each write once (the end-of-training summary's
    # rewrite of the same samples is not a write); attempt 1 to step 4, attempt 2 from 4 on
    writes = [pq.read_table(p).to_pylist() for p in sorted((out_dir / "writes").iterdir())]
    logged = _rows(root, "SELECT attempt, key, step, sample, input, output, extra "
                         "FROM generations_all ORDER BY attempt, seq, sample")
    chunks: list[tuple[int, str, int]] = []
    for g in logged:
        if not chunks or chunks[-1] != (g["attempt"], g["key"], g["step"]):
            chunks.append((g["attempt"], g["key"], g["step"]))
    assert chunks == [
        (1, "completions", 1), (1, "completions", 2), (1, "completions", 3),
        (1, "eval/completions", 3), (1, "completions", 4),
        (2, "completions", 4), (2, "completions", 5), (2, "completions", 6),
        (2, "eval/completions", 6)]
    assert len(writes) == len(chunks)
    assert [(w["step"], json.dumps(w["prompt"]), json.dumps(w["completion"]), w["count_a"],
             w["advantage"]) for rows in writes for w in rows] == [
        (g["step"], g["input"], g["output"],
         *map(json.loads(g["extra"]).get, ("count_a", "advantage"))) for g in logged]
