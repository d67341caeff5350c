"""Every operation tolerates the others' normal work: fsck while compaction removes the
segments it listed, compaction while retention moves a run away under it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import tracklake
from tracklake._ops import compact as compact_module
from tracklake._ops.fsck import check as fsck_check
from tracklake._ops.fsck import fsck


def _runs(root: Path, names: tuple[str, ...]) -> None:
    for name in names:
        with tracklake.init(project="p", run_id=name, root=root, compact=False) as run:
            for step in range(20):
                run.log({"loss": float(step)}, step=step)
            run.log_text("note", "hello", step=0)


def test_fsck_tolerates_segments_compacted_while_it_checks(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _runs(root, ("a", "b"))
    read_segment = fsck_check.read_segment

    def compacted_first(path: Path, *args: Any, **kwargs: Any) -> Any:
        tracklake.compact(root=root)  # removes every segment fsck listed
        return read_segment(path, *args, **kwargs)

    monkeypatch.setattr(fsck_check, "read_segment", compacted_first)
    report = fsck(root)
    assert report.problems == []
    monkeypatch.undo()
    assert fsck(root).problems == []
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist() == [
        {"n": 40}]


def test_compaction_tolerates_a_run_moved_away_under_it(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _runs(root, ("a", "b"))
    trash = tmp_path / "trash"
    idle = compact_module._idle

    def moved_first(r: Path, s: Any, *rest: Any) -> bool:
        for kind_dir in r.glob(f"*/project=p/run={s.run}"):
            if kind_dir.parts[-3] != "runs":  # as retention moves a run to its trash
                target = trash / kind_dir.relative_to(r)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(kind_dir, target)
        return bool(idle(r, s, *rest))

    monkeypatch.setattr(compact_module, "_idle", moved_first)
    report = tracklake.compact(root=root, run="a")
    assert any("removed while compaction ran" in why for _, why in report.skipped)
    assert not list((trash / "metrics").rglob("*.parquet"))  # nothing written there
    assert len(list((trash / "metrics").rglob("_seg-*.arrows"))) == 1  # nothing lost


def test_fsck_reports_temporaries_left_by_killed_processes(root: Path) -> None:
    import os
    import subprocess
    import sys

    _runs(root, ("a",))
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    [directory] = root.glob("metrics/project=p/run=a/rank=0/attempt=1")
    old = directory / f".part-0-19-0.parquet.{dead}.tmp"
    old.write_bytes(b"half a part")
    os.utime(old, (1e9, 1e9))
    young = directory / f".part-0-19-1.parquet.{dead}.tmp"  # may be being written
    young.write_bytes(b"x")
    mine = root / "runs" / f".attempt=1.json.{os.getpid()}.tmp"  # a live process's
    mine.write_bytes(b"x")
    os.utime(mine, (1e9, 1e9))
    found = [p.path for p in fsck(root).problems if "temporary" in p.what]
    assert found == [old]
    repaired = [p for p in fsck(root, repair=True).problems if "temporary" in p.what]
    assert [p.repaired for p in repaired] == [
        f"moved to quarantine/{old.relative_to(root)}"]
    assert not old.exists() and young.exists() and mine.exists()
    assert not [p for p in fsck(root).problems if "temporary" in p.what]  # not again
