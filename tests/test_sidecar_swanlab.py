"""A SwanLab sidecar, offline: verl's SWANLAB_LOG_DIR says where, and the offline run
files, read back with SwanLab's own reader, hold every point once."""

from __future__ import annotations

from pathlib import Path

from _optional import optional
from _sidecar import trainer

optional("swanlab")
import _swanlab_log as slog  # noqa: E402


def test_a_swanlab_sidecar_writes_offline_runs_where_swanlab_log_dir_says(
        tmp_path: Path, root: Path) -> None:
    logdir = tmp_path / "swanlog"
    with trainer(tmp_path, root, ["swanlab"], env={"SWANLAB_LOG_DIR": str(logdir),
                                                   "SWANLAB_MODE": "offline"}) as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        t.wait_sidecars_exit()
        assert f"SwanLab offline, files under {logdir}" in t.text()
        assert "p/r1: 80 records, finished" in t.text()
    sessions = sorted(logdir.glob("run-*-tracklake[0-9]*"))
    points = slog.points(sessions)
    assert set(points) == {(s, "loss", 1.0 / (s + 1)) for s in range(40)} | {
        (s, "reward", float(s)) for s in range(40)}
    assert all(n == 1 for n in points.values())
