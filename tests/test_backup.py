"""Backup and restore to a directory: a full then an incremental backup copy only what
is new, a killed backup resumes, a backup is a store SQL reads directly, restore gives
identical answers (every view and the five questions of benchmarks/sql_scale.py), is
idempotent, refuses damage and conflicts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _backup_store import answers, log_run, make_store
from _views import views
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._ops.backup import (
    KILL_AT_ENV,
    MANIFEST,
    BackupError,
    backup,
    read_manifest,
    restore,
)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "store")


def test_a_backup_is_a_store_and_a_restore_answers_like_the_source(store: Path,
                                                                  tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    result = CliRunner().invoke(main, ["backup", str(dest), "--root", str(store)])
    assert result.exit_code == 0, result.output
    expected = answers(store)
    assert all(expected[f"q{i}"] for i in range(1, 6))
    assert answers(dest) == expected  # the backup is queried directly
    shutil.rmtree(store)  # the store is lost
    restored = tmp_path / "restored"
    result = CliRunner().invoke(main, ["restore", str(dest), "--root", str(restored)])
    assert result.exit_code == 0, result.output
    assert answers(restored) == expected
    again = restore(dest, restored)
    assert again.copied == [] and again.unchanged == len(read_manifest(dest)["files"])
    listing = CliRunner().invoke(main, ["backup", "--list", str(dest)])
    assert "bk/one" in listing.output and "files" in listing.output


def test_an_incremental_backup_copies_only_what_changed(store: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    first = backup(store, dest)
    assert first.copied and first.unchanged == 0
    second = backup(store, dest)
    assert second.copied == [] and second.bytes_copied == 0
    log_run(store, "two")
    tracklake.compact(root=store, run="one")  # segments become a part
    third = backup(store, dest)
    assert third.copied
    assert all("run=two" in rel or "run=one" in rel or rel.startswith("blobs/")
               for rel in third.copied)
    assert views(dest) == views(store)
    # a file touched but not changed is hashed, not copied
    attempt = next((store / "runs").rglob("attempt=1.json"))
    os.utime(attempt, ns=(1, 1))
    assert backup(store, dest).copied == []


def test_a_killed_backup_resumes_without_copying_twice(store: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV} | {KILL_AT_ENV: "5"}
    code = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from tracklake._ops.backup import backup; backup(Path(sys.argv[1]), "
         "Path(sys.argv[2]))", str(store), str(dest)], env=env, check=False).returncode
    assert code == -9
    assert not (dest / MANIFEST).exists()  # killed before its first save
    there = {p.relative_to(dest).as_posix() for p in dest.rglob("*")
             if p.is_file() and not p.name.startswith(".")}
    assert len(there) >= 5
    report = backup(store, dest)
    assert report.unchanged == len(there)  # checked by content, not copied again
    assert not there & set(report.copied)
    assert views(dest) == views(store)


def test_a_backup_removes_the_temporaries_a_killed_backup_left(store: Path,
                                                              tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    backup(store, dest)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    [attempt] = store.glob("runs/project=bk/run=one/**/attempt=1.json")
    there = dest / attempt.parent.relative_to(store)
    stale = there / f".attempt=2.json.{dead}.tmp"  # a copy killed midway, long ago
    stale.write_bytes(b"half a file")
    os.utime(stale, (1e9, 1e9))
    young = there / f".attempt=9.json.{os.getpid()}.tmp"  # its process lives
    young.write_bytes(b"x")
    os.utime(young, (1e9, 1e9))
    log_run(store, "one")  # attempt 2: the next backup writes into that directory
    backup(store, dest)
    assert not stale.exists() and young.exists()


def test_restore_refuses_a_damaged_backup_and_conflicts(store: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    backup(store, dest)
    target = tmp_path / "restored"
    part = next(dest.rglob("*.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(BackupError, match="damaged; nothing was restored") as info:
        restore(dest, target)
    assert part.relative_to(dest).as_posix() in str(info.value)
    assert not target.exists() or not any(target.rglob("*"))
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    target.mkdir()
    clash = target / part.relative_to(dest)
    clash.parent.mkdir(parents=True)
    clash.write_bytes(b"something else")
    result = CliRunner().invoke(main, ["restore", str(dest), "--root", str(target)])
    assert result.exit_code == 1 and "other content" in result.output
    assert clash.read_bytes() == b"something else"
    assert [p for p in target.rglob("*") if p.is_file()] == [clash]


def test_a_backup_inside_the_store_is_refused(store: Path) -> None:
    with pytest.raises(BackupError, match="outside"):
        backup(store, store / "backup")


def test_trash_quarantine_and_temporaries_are_not_backed_up(store: Path,
                                                             tmp_path: Path) -> None:
    for rel in ("trash/x/action.json", "quarantine/metrics/seg.arrows",
                "metrics/.part-1.123.tmp"):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_bytes(b"x")
    backup(store, tmp_path / "b")
    files = read_manifest(tmp_path / "b")["files"]
    assert not [f for f in files if f.startswith(("trash/", "quarantine/")) or "/." in f]
    blob = next(f for f in files if f.startswith("blobs/"))
    assert files[blob]["sha256"] == hashlib.sha256((store / blob).read_bytes()).hexdigest()


def test_an_empty_store_backs_up_to_an_empty_manifest(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    report = backup(empty, tmp_path / "b")
    assert report.copied == [] and read_manifest(tmp_path / "b")["files"] == {}
    with pytest.raises(BackupError, match="holds no tracklake backup"):
        restore(tmp_path / "b", tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("manifest", [
    b"{not json", b"[]", b'{"format": 1, "files": {"../../etc/x": {"sha256": "' + b"0" * 64
    + b'", "size": 1}}}', b'{"format": 99, "files": {}}',
    b'{"format": 1, "files": {"metrics/a": {"sha256": "short", "size": 1}}}'])
def test_a_damaged_or_hostile_manifest_is_refused_by_name(store: Path, tmp_path: Path,
                                                          manifest: bytes) -> None:
    dest = tmp_path / "b"
    dest.mkdir()
    (dest / MANIFEST).write_bytes(manifest)
    with pytest.raises(BackupError, match=MANIFEST):
        restore(dest, tmp_path / "r")
    with pytest.raises(BackupError, match=MANIFEST):
        backup(store, dest)
    assert not (tmp_path / "r").exists() and not (tmp_path / "etc").exists()


def test_a_restore_killed_midway_leaves_nothing_half_restored_and_is_run_again(
        store: Path, tmp_path: Path) -> None:
    import socket

    dest = tmp_path / "backup"
    backup(store, dest)
    target = tmp_path / "restored"
    # what a restore killed while downloading leaves: its staging folder with its owner
    # file, nothing in place
    staging = target / f".restore-1-0123456789ab-{socket.gethostname()}"
    (staging / "metrics").mkdir(parents=True)
    (staging / "metrics" / "half").write_bytes(b"x")
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from tracklake._ops.claims import write_owner; "
                    "write_owner(Path(sys.argv[1]))", str(staging / ".owner")], check=True)
    # one of a live restore in another PID namespace (a container with this host name):
    # its pid means nothing here, so it is left alone
    live = target / f".restore-2-0123456789ab-{socket.gethostname()}"
    live.mkdir()
    owner = json.loads((staging / ".owner").read_text())
    (live / ".owner").write_text(json.dumps({**owner, "pid_ns": 1}))
    # and a planted link by that name, pointing out of the store: removed, not followed
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    (target / ".restore-3-x-y").symlink_to(outside)
    report = restore(dest, target)
    assert report.copied and not staging.exists()
    assert [p.name for p in target.iterdir() if p.name.startswith(".restore-")] == [live.name]
    assert (outside / "keep").read_bytes() == b"k"
    assert answers(target) == answers(store)


def test_a_restore_on_another_host_is_judged_by_its_owner_file_standing_still(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A staging folder whose owner cannot be probed (another host) is removed once its
    owner file stood still for a day plus the clocks' allowance, never earlier; and a
    restore rewrites its owner file as files arrive, so a long one never looks dead."""
    import importlib

    from tracklake._format.liveness import clock_skew

    restoring = importlib.import_module("tracklake._ops.backup.restore")

    dest = tmp_path / "backup"
    backup(store, dest)
    target = tmp_path / "restored"
    target.mkdir()
    owner = {"pid": 1, "host": "node-b", "boot_id": None, "start_ticks": None}
    day = restoring.STAGING_STALE_SECONDS
    ages = {"behind": day + clock_skew() / 2, "gone": day + clock_skew() + 60}
    for name, age in ages.items():
        (target / f".restore-1-{name}-node-b").mkdir()
        path = target / f".restore-1-{name}-node-b" / ".owner"
        path.write_text(json.dumps(owner))
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age))
    seen: list[int] = []

    def progress(done: int, total: int, note: str) -> None:
        stagings = [p for p in target.glob(".restore-*") if "node-b" not in p.name]
        seen.append((stagings[0] / ".owner").stat().st_mtime_ns)

    monkeypatch.setattr(restoring, "OWNER_REFRESH", -1.0)  # at every file
    restore(dest, target, progress=progress)
    assert sorted(p.name for p in target.glob(".restore-*")) == [".restore-1-behind-node-b"]
    assert len(seen) > 2 and len(set(seen)) > 1


def _damage(path: Path) -> None:
    """Flip one bit in the middle of `path`, keeping its size (bit rot, a bad sector)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def test_a_blob_damaged_in_the_store_is_reported_and_not_recorded(store: Path,
                                                                  tmp_path: Path) -> None:
    from tracklake._ops.backup import LEDGER_DIR, DamagedSourceError, unbacked_files

    dest = tmp_path / "backup"
    blob = next(p for p in (store / "blobs").rglob("*") if p.is_file())
    rel = blob.relative_to(store).as_posix()
    good = blob.read_bytes()
    _damage(blob)
    with pytest.raises(DamagedSourceError, match="damaged") as info:
        backup(store, dest)
    assert rel in str(info.value) and info.value.report.damaged == [rel]
    files = read_manifest(dest)["files"]
    assert rel not in files
    others = {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()
              and not p.name.startswith(".") and LEDGER_DIR not in p.parts} - {rel}
    assert others <= set(files)  # every other file was backed up and recorded
    assert not (dest / rel).exists() and not [p for p in dest.rglob(".*.tmp")]
    assert rel in unbacked_files(store, [store / "blobs"])  # retention will not drop it
    result = CliRunner().invoke(main, ["backup", str(dest), "--root", str(store)])
    assert result.exit_code == 1 and rel in result.output and "damaged" in result.output
    blob.write_bytes(good)  # repaired (from another copy): backed up as usual
    report = backup(store, dest)
    assert report.copied == [rel] and report.damaged == []
    assert hashlib.sha256((dest / rel).read_bytes()).hexdigest() == blob.name


def test_a_good_backup_of_a_blob_is_kept_when_the_store_copy_rots(store: Path,
                                                                  tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    backup(store, dest)
    blob = next(p for p in (store / "blobs").rglob("*") if p.is_file())
    rel = blob.relative_to(store).as_posix()
    good = blob.read_bytes()
    _damage(blob)
    report = backup(store, dest)  # checked against its name, not against the source
    assert rel not in report.copied and (dest / rel).read_bytes() == good
    restored = tmp_path / "restored"
    restore(dest, restored)
    assert (restored / rel).read_bytes() == good


def test_a_file_system_refusing_kernel_copies_gets_user_space_copies(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def refuse(*args: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    dest = tmp_path / "backup"
    report = backup(store, dest)
    blobs = [rel for rel in report.copied if rel.startswith("blobs/")]
    assert blobs
    for rel in blobs:
        assert hashlib.sha256((dest / rel).read_bytes()).hexdigest() == rel.rsplit("/")[-1]


def test_a_copy_that_does_not_read_back_stops_the_backup_unrecorded(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._ops.backup import blobcopy

    real = blobcopy.kernel_copy

    def failing_disk(src: Path, dst: Path) -> None:
        real(src, dst)
        _damage(dst)

    monkeypatch.setattr(blobcopy, "kernel_copy", failing_disk)
    dest = tmp_path / "backup"
    with pytest.raises(BackupError, match="storage is failing") as info:
        backup(store, dest)
    assert "damaged" not in str(info.value)  # the store's blob is sound
    assert not [p for p in (dest / "blobs").rglob("*") if p.is_file()]
    assert not (dest / MANIFEST).exists() or not [
        f for f in read_manifest(dest)["files"] if f.startswith("blobs/")]


@pytest.mark.parametrize("size", [0, 1, (8 << 20) + 3])
def test_blobs_of_edge_sizes_copy_and_verify(tmp_path: Path, size: int) -> None:
    from tracklake._ops.backup.blobcopy import DamagedBlobError, copy_blob

    data = os.urandom(size)
    name = hashlib.sha256(data).hexdigest()
    src = tmp_path / name
    src.write_bytes(data)
    dst = tmp_path / "out" / name
    dst.parent.mkdir()
    assert copy_blob(src, dst, f"blobs/sha256/{name[:2]}/{name}", name) == size
    assert dst.read_bytes() == data
    wrong = hashlib.sha256(data + b"x").hexdigest()
    with pytest.raises(DamagedBlobError, match="damaged"):
        copy_blob(src, tmp_path / "out" / wrong, f"blobs/sha256/{wrong[:2]}/{wrong}", wrong)
    assert sorted(p.name for p in dst.parent.iterdir()) == [name]


def test_blobs_a_killed_backup_left_are_checked_against_their_names(store: Path,
                                                                    tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    backup(store, dest)
    (dest / MANIFEST).unlink()  # as if killed before its first save
    blobs = sorted(p for p in (dest / "blobs").rglob("*") if p.is_file())
    assert len(blobs) >= 2
    _damage(blobs[0])  # same size, other bytes: must not be taken as the blob
    report = backup(store, dest)
    rel = blobs[0].relative_to(dest).as_posix()
    assert report.copied == [rel]
    assert hashlib.sha256(blobs[0].read_bytes()).hexdigest() == blobs[0].name
    assert set(read_manifest(dest)["files"]) >= {
        b.relative_to(dest).as_posix() for b in blobs}
