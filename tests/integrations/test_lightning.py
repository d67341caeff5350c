"""The Lightning integration against real Lightning from PyPI (``lightning`` and
``pytorch_lightning``), 2 DDP processes on the CPU: global rank zero writes what Lightning
hands its loggers (compared with Lightning's own CSVLogger), `test()` after `fit()` logs
into the same run, and a failed fit resumed from its checkpoint is attempt 2."""

from __future__ import annotations

import csv
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
lightning = optional("lightning")

pytestmark = pytest.mark.xdist_group("torchrun")

SCRIPT = Path(__file__).with_name("_lightning_job.py")


def _job(root: Path, out_dir: Path, package: str, *flags: str, expect_ok: bool = True) -> None:
    env = child_env() | {"OMP_NUM_THREADS": "1", "TRACKLAKE_COMPACT": "0",
                         "TRACKLAKE_SYSTEM_METRICS": "0", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root), str(out_dir), package,
                           *flags], env=env, capture_output=True, text=True, timeout=600)
    assert (proc.returncode == 0) == expect_ok, (proc.stdout + proc.stderr)[-4000:]


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


def _csv_values(out_dir: Path) -> list[tuple[str, int, float]]:
    """What Lightning handed its CSVLogger: (key, step, value) for every filled cell."""
    out = []
    with open(out_dir / "csv" / "v" / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            step = int(row.pop("step"))
            out += [(k, step, float(v)) for k, v in row.items() if v != ""]
    return out


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_rank_zero_writes_what_lightning_logs_and_test_continues_the_run(
        tmp_path: Path, root: Path, package: str) -> None:
    out_dir = tmp_path / "out"
    _job(root, out_dir, package)
    [run] = _rows(root, "SELECT project, name, status, ranks, attempts FROM runs")
    assert run == {"project": "lt", "name": "tiny", "status": "finished", "ranks": 1,
                   "attempts": 1}
    rows = _rows(root, "SELECT rank, key, step, value FROM metrics")
    assert {r["rank"] for r in rows} == {0}
    assert sorted((r["key"], r["step"], r["value"]) for r in rows) == sorted(
        _csv_values(out_dir))
    assert {r["key"] for r in rows} == {"train_loss", "val_loss", "test_loss", "epoch"}
    config = {r["key"]: json.loads(r["value"]) for r in _rows(root, "SELECT * FROM configs")}
    assert config == {"lr": 0.05, "layers/0": "in"}
    manifests = _rows(root, "SELECT name, step FROM artifacts ORDER BY step")
    assert [m["name"] for m in manifests] == ["checkpoint.json"] * 2
    # checkpoints went where the logger said, under the run's id, not into the store
    run_id = _rows(root, "SELECT run FROM runs")[0]["run"]
    assert sorted(p.name for p in (out_dir / "lt" / run_id / "checkpoints").iterdir()) == [
        "epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    assert not list(root.rglob("*.ckpt"))


def test_a_failed_fit_resumed_from_its_checkpoint_is_attempt_two(tmp_path: Path,
                                                                  root: Path) -> None:
    out_dir = tmp_path / "out"
    _job(root, out_dir, "lightning", "--run-id", "lt-1", "--crash-at", "5", expect_ok=False)
    assert _rows(root, "SELECT attempt, status FROM run_attempts") == [
        {"attempt": 1, "status": "failed"}]
    _job(root, out_dir, "lightning", "--run-id", "lt-1", "--resume")
    assert _rows(root, "SELECT attempt, status FROM run_attempts ORDER BY attempt") == [
        {"attempt": 1, "status": "failed"}, {"attempt": 2, "status": "finished"}]
    loss = _rows(root, "SELECT step, attempt FROM metrics WHERE key = 'train_loss' "
                       "ORDER BY step")
    assert [(r["step"], r["attempt"]) for r in loss] == [
        (0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]


def test_with_only_pytorch_lightning_installed_the_logger_subclasses_its_base() -> None:
    code = ("import sys; sys.modules['lightning'] = None\n"
            "import pytorch_lightning\n"
            "from tracklake.integrations.lightning import TracklakeLogger\n"
            "assert issubclass(TracklakeLogger, pytorch_lightning.loggers.logger.Logger)\n"
            "assert 'lightning.pytorch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
