"""The Ray integration against real Ray from PyPI: Tune with 3 trials (a run each, one
failing, then `Tuner.restore` running it again as attempt 2) and Train with 2 workers (a
rank each), read back with `tracklake.query`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _env import child_env
from _optional import optional

import tracklake

ray = optional("ray")

pytestmark = pytest.mark.xdist_group("ray")

SCRIPT = Path(__file__).with_name("_ray_job.py")


def _job(root: Path, storage: Path, ray_tmp: Path, mode: str) -> None:
    env = child_env() | {"TRACKLAKE_COMPACT": "0", "TRACKLAKE_SYSTEM_METRICS": "0",
                         "PYTHONPATH": str(SCRIPT.parent), "RAY_TRAIN_V2_ENABLED": "1",
                         "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root), str(storage), str(ray_tmp),
                           mode], env=env, capture_output=True, text=True, timeout=900)
    # Tune ends a run with an errored trial with an error of its own; the store says more
    assert proc.returncode == 0 or mode == "tune", (proc.stdout + proc.stderr)[-4000:]


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


def test_each_tune_trial_is_a_run_and_a_restored_trial_its_next_attempt(
        tmp_path: Path, root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    storage, ray_tmp = tmp_path / "ray-results", tmp_path_factory.mktemp("ray")
    _job(root, storage, ray_tmp, "tune")
    runs = _rows(root, "SELECT run, status, attempts FROM runs ORDER BY run")
    assert len(runs) == 3 and all(r["run"].startswith("exp-") for r in runs)
    by_lr = {}
    for run in runs:
        config = {r["key"]: json.loads(r["value"]) for r in _rows(
            root, f"SELECT key, value FROM configs WHERE run = '{run['run']}'")}
        by_lr[config["lr"]] = run | {"trial": config["ray/trial_id"]}
        assert run["run"] == f"exp-{config['ray/trial_id']}"
    assert {lr: r["status"] for lr, r in by_lr.items()} == {
        0.1: "finished", 0.01: "finished", 0.5: "failed"}
    _job(root, storage, tmp_path_factory.mktemp("ray"), "tune-restore")
    failed = by_lr[0.5]["run"]
    assert _rows(root, f"SELECT attempt, status FROM run_attempts WHERE run = '{failed}' "
                       "ORDER BY attempt") == [{"attempt": 1, "status": "failed"},
                                               {"attempt": 2, "status": "finished"}]
    rows = _rows(root, "SELECT run, step, key, value, attempt FROM metrics "
                       "WHERE key IN ('score', 'nested/i') ORDER BY run, key, step")
    got = {(r["run"], r["key"], r["step"]): (r["value"], r["attempt"]) for r in rows}
    for lr, run in by_lr.items():
        for i in (1, 2, 3):
            attempt = 2 if lr == 0.5 and i > 1 else 1
            assert got[(run["run"], "score", i)] == (lr * i, attempt)
            assert got[(run["run"], "nested/i", i)] == (i, attempt)
    assert len(rows) == 18  # each iteration once in the views


def test_each_ray_train_worker_is_a_rank_of_the_run(
        tmp_path: Path, root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    _job(root, tmp_path / "ray-results", tmp_path_factory.mktemp("ray"), "train")
    [run] = _rows(root, "SELECT run, name, status, ranks FROM runs")
    assert run == {"run": "train-job", "name": "train-job", "status": "finished", "ranks": 2}
    rows = _rows(root, "SELECT rank, step, value FROM metrics WHERE key = 'loss' "
                       "ORDER BY rank, step")
    assert [(r["rank"], r["step"], r["value"]) for r in rows] == [
        (0, 0, 1.0), (0, 1, 0.5), (0, 2, 1 / 3), (1, 0, 2.0), (1, 1, 1.5), (1, 2, 4 / 3)]
