"""The accelerate integration against real accelerate from PyPI, on 2 processes
(``torchrun``, gloo, CPU): the main process writes what `Accelerator.log` is given, or
every process as a rank when asked; both processes end."""

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

torch = optional("torch")
accelerate = optional("accelerate")

pytestmark = pytest.mark.xdist_group("torchrun")

SCRIPT = Path(__file__).with_name("_accelerate_job.py")


def _job(root: Path, mode: str) -> None:
    env = child_env() | {"OMP_NUM_THREADS": "1", "TRACKLAKE_COMPACT": "0",
                         "TRACKLAKE_SYSTEM_METRICS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(SCRIPT), str(root), mode], env=env, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


def test_log_with_tracklake_by_name_writes_the_main_process_only(root: Path) -> None:
    _job(root, "by-name")
    [run] = _rows(root, "SELECT project, name, status, ranks FROM runs")
    assert run == {"project": "acc", "name": "tiny", "status": "finished", "ranks": 1}
    rows = _rows(root, "SELECT rank, step, key, value FROM metrics ORDER BY step")
    assert [(r["rank"], r["step"], r["key"], r["value"]) for r in rows] == [
        (0, 1, "loss", 1.0), (0, 2, "loss", 0.5), (0, 3, "loss", 1 / 3), (0, 4, "loss", 10.0)]
    config = {r["key"]: json.loads(r["value"]) for r in _rows(root, "SELECT * FROM configs")}
    assert config == {"lr": 0.1, "model/layers": 2, "model/labels/0": "neg"}
    samples = _rows(root, "SELECT step, sample, input, output, score, extra FROM generations "
                          "WHERE key = 'samples' ORDER BY sample")
    assert [(s["step"], s["input"], s["output"], s["score"]) for s in samples] == [
        (3, "1+1", "2", 1.0), (3, "2+2", "5", 0.0)]
    assert json.loads(samples[0]["extra"]) == {"len": 1}


def test_an_instance_asked_for_every_process_makes_each_a_rank(root: Path) -> None:
    _job(root, "every-process")
    [run] = _rows(root, "SELECT project, name, status, ranks FROM runs")
    assert run == {"project": "acc", "name": "ranks", "status": "finished", "ranks": 2}
    rows = _rows(root, "SELECT rank, step, value FROM metrics WHERE key = 'loss' "
                       "ORDER BY rank, step")
    assert [(r["rank"], r["step"], r["value"]) for r in rows] == [
        (0, 1, 1.0), (0, 2, 0.5), (0, 3, 1 / 3), (0, 4, 10.0),
        (1, 1, 2.0), (1, 2, 1.5), (1, 3, 4 / 3), (1, 4, 11.0)]
