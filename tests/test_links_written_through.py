"""Every operation that writes into a store (unpack, restore, retention, fsck --repair,
pin) refuses to write through a directory planted there as a link to
somewhere outside: nothing lands outside, the error names the link, and the store keeps
what it held."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracklake


def _store(root: Path, project: str = "p", run: str = "r") -> None:
    with tracklake.init(project=project, run_id=run, root=root, compact=False) as r:
        for step in range(10):
            r.log({"loss": float(step)}, step=step)
        r.log_artifact(b"weights" if project == "p" else b"other", name="w.bin")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracklake._cli", *args],
                          capture_output=True, text=True, timeout=120)


def _everything(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _losses(root: Path) -> list[float]:
    return [row["value"] for row in tracklake.query(
        "SELECT value FROM metrics WHERE key = 'loss' ORDER BY step", root=root).to_pylist()]


WEIGHTS_DIR = f"blobs/sha256/{hashlib.sha256(b'weights').hexdigest()[:2]}"


@pytest.mark.parametrize("linked", ["metrics/project=p", "runs/project=p", WEIGHTS_DIR])
def test_unpack_refuses_a_store_whose_directory_is_a_link_and_writes_nothing(
        tmp_path: Path, linked: str) -> None:
    src, root, outside = tmp_path / "src", tmp_path / "store", tmp_path / "outside"
    _store(src)
    assert _cli("pack", "--root", str(src), "--all", "-o", str(tmp_path / "r.tar")
                ).returncode == 0
    _store(root, project="q")  # a store with a run of its own
    outside.mkdir()
    (root / linked).parent.mkdir(parents=True, exist_ok=True)
    (root / linked).symlink_to(outside, target_is_directory=True)
    before = _everything(root)
    done = _cli("unpack", "--root", str(root), str(tmp_path / "r.tar"))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "symbolic link" in done.stderr and "nothing was written" in done.stderr, \
        done.stderr
    assert list(outside.iterdir()) == []
    assert _everything(root) == before
    (root / linked).unlink()
    assert _cli("unpack", "--root", str(root), str(tmp_path / "r.tar")).returncode == 0
    assert sorted(_losses(root)) == sorted([float(s) for s in range(10)] * 2)


def test_restore_counts_a_path_reached_through_a_link_as_a_conflict(
        tmp_path: Path) -> None:
    src, root, outside = tmp_path / "src", tmp_path / "store", tmp_path / "outside"
    _store(src)
    assert _cli("backup", "--root", str(src), str(tmp_path / "copy")).returncode == 0
    outside.mkdir()
    (root / "metrics").mkdir(parents=True)
    (root / "metrics" / "project=p").symlink_to(outside, target_is_directory=True)
    done = _cli("restore", "--root", str(root), str(tmp_path / "copy"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "(reached through a symbolic link)" in done.stderr, done.stderr
    assert "nothing was restored" in done.stderr
    assert list(outside.iterdir()) == []
    assert sorted(os.listdir(root)) == ["metrics"]


def test_restore_never_opens_a_fifo_standing_where_a_file_goes(tmp_path: Path) -> None:
    src, root = tmp_path / "src", tmp_path / "store"
    _store(src)
    assert _cli("backup", "--root", str(src), str(tmp_path / "copy")).returncode == 0
    [attempt] = src.glob("runs/project=p/run=r/rank=0/attempt=*.json")
    fifo = root / attempt.relative_to(src)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    done = _cli("restore", "--root", str(root), str(tmp_path / "copy"))
    assert done.returncode == 1 and "already holds other content" in done.stderr, \
        done.stderr


def test_retention_refuses_a_trash_directory_that_is_a_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root)
    outside.mkdir()
    (root / "trash").symlink_to(outside, target_is_directory=True)
    done = _cli("retain", "--root", str(root), "--keep-last", "0", "--apply")
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{root / 'trash'} is a symbolic link" in done.stderr, done.stderr
    assert list(outside.iterdir()) == []
    assert _losses(root) == [float(s) for s in range(10)]


def test_fsck_repair_never_quarantines_through_a_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root)
    [segment] = root.glob("metrics/project=p/run=r/rank=0/attempt=1/_seg-*.arrows")
    segment.write_bytes(segment.read_bytes()[:-20])  # a torn tail: fsck repairs it
    outside.mkdir()
    (root / "quarantine").symlink_to(outside, target_is_directory=True)
    done = _cli("fsck", "--root", str(root), "--repair")
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{root / 'quarantine'} is a symbolic link" in done.stdout + done.stderr, \
        done.stdout + done.stderr
    assert list(outside.iterdir()) == []
    assert segment.exists()


def test_pin_refuses_a_pins_directory_that_is_a_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root)
    outside.mkdir()
    (root / "pins").symlink_to(outside, target_is_directory=True)
    done = _cli("pin", "--root", str(root), "r")
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{root / 'pins'} is a symbolic link" in done.stderr, done.stderr
    assert list(outside.iterdir()) == []

