"""A W&B sidecar on a machine without network: W&B offline run files, read back with W&B's
own record format, hold every point once; a later manual `tracklake export wandb` uses the
same cursors, so it sends nothing again."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from _env import child_env
from _optional import optional
from _sidecar import PATIENCE, trainer

optional("wandb")
import _wandb_log as wlog  # noqa: E402


def _points(out: Path) -> Counter[tuple[int, str, object]]:
    files = sorted((out / "wandb").glob("offline-run-*/*.wandb"))
    return wlog.points(wlog.history(files))


def test_a_wandb_sidecar_writes_offline_runs_and_a_later_export_continues_from_its_cursors(
        tmp_path: Path, root: Path) -> None:
    out = tmp_path / "out"
    with trainer(tmp_path, root, {"wandb": {"dir": str(out)}}) as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        t.wait_sidecars_exit()
        assert "to W&B offline" in t.text() and "p/r1: 80 records, finished" in t.text()
    expected = {(s, "loss", wlog.same(1.0 / (s + 1))) for s in range(40)} | {
        (s, "reward", float(s)) for s in range(40)}
    points = _points(out)
    assert set(points) == expected and all(n == 1 for n in points.values())
    files_before = sorted(p.name for p in (out / "wandb").glob("offline-run-*/*.wandb"))
    later = subprocess.run([sys.executable, "-m", "tracklake._cli", "export", "wandb", "--root",
                            str(root), "--run", "r1", "--dir", str(out)], capture_output=True,
                           text=True, timeout=PATIENCE, env=child_env(), check=False)
    assert later.returncode == 0, later.stderr
    assert "p/r1: 0 records, finished" in later.stderr  # the sidecar's cursors: nothing again
    assert sorted(p.name for p in (out / "wandb").glob("offline-run-*/*.wandb")) == files_before
