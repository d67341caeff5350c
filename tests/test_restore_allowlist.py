"""Restore writes only the store's data paths; control files and policy are skipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tracklake
from tracklake._ops.backup import BackupError, backup, restore


def _store(root: Path) -> None:
    with tracklake.init(project="p", name="r", root=root) as run:
        run.log({"loss": 1.0}, step=1)


def _plant(dest: Path, rel: str, data: bytes) -> None:
    """Add a file to a directory backup and name it in its manifest."""
    import hashlib

    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    (dest / rel).write_bytes(data)
    manifest = json.loads((dest / "tracklake-backup.json").read_bytes())
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (dest / "tracklake-backup.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("rel", [
    "backups/0123456789abcdef.json", "tracklake.toml", "trash/x/journal.json",
    "metrics/project=p/run=r/rank=0/attempt=1/.compacting", "quarantine/x",
    "exports/wandb-0123/project=p/run=r.json"])
def test_restore_skips_control_and_policy_files(tmp_path: Path, rel: str) -> None:
    src, dest, out = tmp_path / "s", tmp_path / "b", tmp_path / "o"
    _store(src)
    backup(src, dest)
    _plant(dest, rel, b'[retain]\nmax_age = "0s"\n')
    report = restore(dest, out)
    assert rel in report.skipped
    assert not (out / rel).exists()
    assert report.copied


def test_restore_writes_policy_only_when_asked(tmp_path: Path) -> None:
    src, dest, out = tmp_path / "s", tmp_path / "b", tmp_path / "o"
    _store(src)
    (src / "tracklake.toml").write_text("[retain]\n")
    backup(src, dest)
    restore(dest, out, policy=True)
    assert (out / "tracklake.toml").read_text() == "[retain]\n"


def test_restore_refuses_an_invalid_attempt_file(tmp_path: Path) -> None:
    src, dest, out = tmp_path / "s", tmp_path / "b", tmp_path / "o"
    _store(src)
    backup(src, dest)
    _plant(dest, "runs/project=p/run=x/rank=0/attempt=1.json", b'{"format": "x"}')
    with pytest.raises(BackupError, match=r"attempt=1\.json"):
        restore(dest, out)
    assert not out.exists()


def test_backup_copies_no_control_file_nor_link(tmp_path: Path) -> None:
    src, dest = tmp_path / "s", tmp_path / "b"
    _store(src)
    (src / "backups").mkdir()
    (src / "backups" / "f.json").write_text("{}")
    (src / "pins").mkdir()
    os.symlink("/etc/passwd", src / "pins" / "project=p")
    os.symlink("/etc/passwd", src / "tracklake.toml")
    seg = next((src / "metrics").rglob("*.arrows"), None) or next(
        (src / "metrics").rglob("*.parquet"))
    os.symlink("/dev/zero", seg.with_name("_seg-000099-000000000099.arrows"))
    backup(src, dest)
    held = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert "backups/f.json" not in held
    assert "tracklake.toml" not in held
    assert not any("000099" in h for h in held)
    assert any(h.startswith("runs/") for h in held)
