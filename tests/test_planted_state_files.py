"""Files planted in a store (by another user of a shared store, or in a restored backup)
where tracklake reads its own: a FIFO, a symbolic link or a huge sparse file makes no
operation hang, read outside the store, or run out of memory."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tracklake


def _store(root: Path, runs: tuple[str, ...] = ("r",)) -> None:
    for run_id in runs:
        with tracklake.init(project="p", run_id=run_id, root=root, compact=False) as r:
            for step in range(10):
                r.log({"loss": float(step)}, step=step)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`tracklake ARGS` in its own process, its memory capped at 3 GB, with a deadline."""
    return subprocess.run([sys.executable, "-m", "tracklake._cli", *args],
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_capped)


def _segment_dir(root: Path) -> Path:
    [directory] = root.glob("metrics/project=p/run=r/rank=0/attempt=1")
    return directory


def test_a_segment_with_a_sparse_tail_of_64_gb_is_read_a_slice_at_a_time(
        tmp_path: Path) -> None:
    """A segment whose good batches are followed by a 64 GB hole: compaction and fsck,
    their memory capped at 3 GB, read its batches and report the rest, instead of
    reading the file whole."""
    root = tmp_path / "store"
    _store(root)
    directory = _segment_dir(root)
    [segment] = directory.glob("_seg-*.arrows")
    planted = directory / "_seg-000001-000000000010.arrows"
    shutil.copy(segment, planted)
    with planted.open("r+b") as f:
        f.truncate(64 << 30)  # sparse: nothing is written
    done = _cli("fsck", "--root", str(root))
    assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr
    assert "_seg-000001-000000000010.arrows: undecodable batch at byte" in done.stdout
    done = _cli("compact", "--root", str(root))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{planted}: undecodable batch" in done.stderr, done.stderr
    with pytest.warns(RuntimeWarning, match="undecodable batch"):
        counted = tracklake.query("SELECT count(*) AS n FROM metrics", root=root)
    assert counted.to_pylist() == [{"n": 10}]


def test_a_segment_read_a_slice_at_a_time_reads_every_batch_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._format import segment as seg

    root = tmp_path / "store"
    with tracklake.init(project="p", run_id="r", root=root, compact=False,
                        flush_interval=0.01) as r:
        for step in range(50):
            r.log({"loss": float(step)}, step=step)
            r.flush()
    [path] = _segment_dir(root).glob("_seg-*.arrows")
    whole = seg.decode_bytes(path, path.read_bytes(), 0)
    assert len(whole.batches) > 3
    monkeypatch.setattr(seg, "SCAN_BYTES", 1)  # one batch a slice
    sliced = seg.read_segment(path)
    assert [b.to_pylist() for b in sliced.batches] == [b.to_pylist() for b in whole.batches]
    assert (sliced.ends, sliced.sealed, sliced.torn_bytes, sliced.damaged) == (
        whole.ends, whole.sealed, whole.torn_bytes, whole.damaged)


@pytest.mark.parametrize("planted", ["fifo", "link"])
def test_a_stale_claim_planted_as_a_fifo_or_link_is_broken_without_opening_it(
        tmp_path: Path, planted: str) -> None:
    """A day-old `.compacting` claim that is a FIFO, or a link to a FIFO outside the
    store: compaction breaks it as a claim whose holder is gone (removing the name in
    the store only) and compacts, instead of waiting for ever on a read of it."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root)
    claim = _segment_dir(root) / ".compacting"
    if planted == "fifo":
        os.mkfifo(claim)
    else:
        os.mkfifo(outside)
        claim.symlink_to(outside)
    os.utime(claim, (1, 1), follow_symlinks=False)
    done = _cli("compact", "--root", str(root), timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "compacted 1 segments, 10 records" in done.stdout, done.stdout
    assert not os.path.lexists(claim) and list(_segment_dir(root).glob(".compacting*")) == []
    if planted == "link":
        assert outside.exists()


_CLAIMED_BY = {  # the command that claims a directory, and that directory's claim
    "compact": (("compact",), "metrics/project=p/run=r/rank=0/attempt=1/.compacting"),
    "repair": (("fsck", "--repair"), "quarantine/.repairing"),
    "retain": (("retain", "--keep-last", "0", "--apply"), "trash/.retaining"),
}


@pytest.mark.parametrize("command", sorted(_CLAIMED_BY))
def test_a_directory_planted_as_a_claim_is_named_and_never_removed(
        tmp_path: Path, command: str) -> None:
    """A day-old directory, with a file in it, where an operation makes its claim (and
    one at the name a broken claim is set aside under): the operation names it and does
    not run (compaction skips that stream), fsck lists it, and both directories keep
    what they hold. Breaking it as a stale claim used to move it aside, then fail to
    unlink it, and every later run of the operation failed on the directory set aside."""
    root = tmp_path / "store"
    _store(root)
    args, claim_at = _CLAIMED_BY[command]
    claim = root / claim_at
    aside = claim.with_name(f"{claim.name}-stale.host.1.tmp")
    for planted in (claim, aside):
        planted.mkdir(parents=True)
        (planted / "theirs").write_bytes(b"kept")
        os.utime(planted, (1, 1))
    for _ in range(2):
        done = _cli(*args, "--root", str(root), timeout=60)
        assert "Traceback" not in done.stderr, done.stderr
        said = done.stdout + done.stderr
        assert f"{claim} is a directory, where the store keeps a claim file" in said, said
        assert (done.returncode == 0) == (command == "compact"), said
        assert "compacted 1 segments" not in done.stdout
    for planted in (claim, aside):
        assert (planted / "theirs").read_bytes() == b"kept"
    assert sorted(root.glob("metrics/**/*.arrows")), "the segments were left in place"
    done = _cli("fsck", "--root", str(root), timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{claim_at}: a directory where the store keeps a claim file" in done.stdout, \
        done.stdout
    shutil.rmtree(claim)
    done = _cli(*args, "--root", str(root), timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (aside / "theirs").read_bytes() == b"kept"  # a leftover's name, not ours


def test_a_folder_in_the_trash_that_retention_did_not_make_is_left(tmp_path: Path) -> None:
    """A folder without a journal in ROOT/trash/ is one a killed applier made before
    its journal only if it bears an action's name; any other is warned about and kept,
    while a journal-less folder of an action's name is still finished (removed)."""
    root = tmp_path / "store"
    _store(root)
    theirs, killed = root / "trash" / "photos", root / "trash" / "20261201T101010-0123abcd"
    for folder in (theirs, killed):
        folder.mkdir(parents=True)
        (folder / "kept.jpg").write_bytes(b"theirs")
    done = _cli("retain", "--root", str(root), "--keep-last", "0", "--apply", timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{theirs}: not acted on: a folder retention did not make" in done.stderr
    assert (theirs / "kept.jpg").read_bytes() == b"theirs" and not killed.exists()


def test_a_backup_record_planted_as_a_fifo_hangs_neither_fsck_nor_retention(
        tmp_path: Path) -> None:
    """ROOT/backups/<id>.json a FIFO: fsck reports it once, as a FIFO; retention that
    requires a backup counts no backup for it (and so removes nothing)."""
    root = tmp_path / "store"
    _store(root)
    (root / "backups").mkdir()
    os.mkfifo(root / "backups" / "0123456789abcdef.json")
    done = _cli("fsck", "--root", str(root), timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.count("0123456789abcdef.json") == 1, done.stdout
    assert "a FIFO inside the store" in done.stdout
    done = _cli("retain", "--root", str(root), "--keep-last", "0", "--require-backup",
                timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_a_backups_directory_planted_as_a_link_is_neither_read_nor_written(
        tmp_path: Path) -> None:
    from tracklake._ops.backup.backup import backup
    from tracklake._ops.backup.ledger import backups

    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root)
    outside.mkdir()
    (root / "backups").symlink_to(outside)
    backup(root, tmp_path / "copy")
    assert list(outside.iterdir()) == []
    (root / "backups").unlink()
    backup(root, tmp_path / "copy")
    [record] = (root / "backups").iterdir()
    record.rename(outside / record.name)
    (root / "backups").rmdir()
    (root / "backups").symlink_to(outside)
    assert backups(root) == []  # a record reached through a link protects nothing


def test_a_backup_restored_from_is_read_without_following_a_link_or_opening_a_fifo(
        tmp_path: Path) -> None:
    """A backup is outside input too: its manifest planted as a FIFO stops the restore
    at once, naming it; a file of it replaced by a link to a file outside the backup
    (the manifest made to agree) is missing, never copied into the store."""
    import hashlib
    import json

    from tracklake._ops.backup.manifest import MANIFEST

    root, copy, secret = tmp_path / "store", tmp_path / "copy", tmp_path / "secret"
    _store(root)
    assert _cli("backup", "--root", str(root), str(copy)).returncode == 0
    manifest = json.loads((copy / MANIFEST).read_bytes())
    [rel] = [r for r in manifest["files"] if r.startswith("runs/")]
    secret.write_bytes(b'{"not": "the backup\'s to give"}')
    manifest["files"][rel].update(sha256=hashlib.sha256(secret.read_bytes()).hexdigest(),
                                  size=secret.stat().st_size)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    (copy / rel).unlink()
    (copy / rel).symlink_to(secret)
    done = _cli("restore", "--root", str(tmp_path / "restored"), str(copy), timeout=60)
    assert done.returncode == 1 and f"{rel}: missing" in done.stderr, done.stderr
    assert not (tmp_path / "restored" / rel).exists()
    fifo = tmp_path / "fifo-copy"
    fifo.mkdir()
    os.mkfifo(fifo / MANIFEST)
    done = _cli("restore", "--root", str(tmp_path / "again"), str(fifo), timeout=60)
    assert done.returncode == 1 and "is a FIFO, not a regular file" in done.stderr, \
        done.stderr


@pytest.mark.parametrize("planted", ["fifo", "link"])
def test_a_claims_scratch_name_planted_as_a_fifo_or_link_is_not_written_through(
        tmp_path: Path, planted: str) -> None:
    """The name a claim was written under before it was linked into place
    (`.compacting.HOST.PID.tmp`, which anyone could guess) planted as a FIFO or as a link
    to a file outside the store: the claim is taken, and the FIFO is not waited on nor
    the link written through (the name is now random, and made with O_EXCL)."""
    import platform
    import threading

    from tracklake._ops.claims import _take_claim

    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root)
    claim = _segment_dir(root) / ".compacting"
    scratch = claim.with_name(f"{claim.name}.{platform.node()}.{os.getpid()}.tmp")
    outside.write_bytes(b"theirs")
    if planted == "fifo":
        os.mkfifo(scratch)
    else:
        scratch.symlink_to(outside)
    taken: list[bool] = []
    worker = threading.Thread(target=lambda: taken.append(_take_claim(claim)), daemon=True)
    worker.start()
    worker.join(30)
    assert taken == [True], "taking the claim hung or failed"
    assert outside.read_bytes() == b"theirs" and claim.is_file() and not claim.is_symlink()
    assert sorted(p.name for p in claim.parent.glob(".compacting*")) == sorted(
        [claim.name, scratch.name])  # nothing else left beside what was planted


_BACKUP_COPIES = """
import os, sys
from pathlib import Path
from tracklake._ops.backup.blobcopy import kernel_copy
from tracklake._ops.backup.target import _copy_fd
base = Path(sys.argv[1])
for copy in (kernel_copy, _copy_fd):
    try:
        copy(base / "fifo", base / f"from-fifo-{copy.__name__}")
        print("copied a FIFO")
    except OSError as exc:
        print("refused:", exc.strerror)
    try:
        copy(base / "src", base / "link")
        print("wrote through a link")
    except FileExistsError:
        print("refused: exists")
"""


def test_a_backups_copy_neither_opens_a_fifo_nor_writes_through_a_link(
        tmp_path: Path) -> None:
    """A store file swapped for a FIFO after the backup listed it is refused, not read
    (which hangs); the copy is created new, never through a link standing at its name."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "src").write_text("the store's")
    (tmp_path / "outside").write_text("someone else's")
    (tmp_path / "link").symlink_to(tmp_path / "outside")
    done = subprocess.run([sys.executable, "-c", _BACKUP_COPIES, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[1::2] == ["refused: exists"] * 2, lines
    assert all("is a FIFO" in line for line in lines[0::2]), lines
    assert (tmp_path / "outside").read_text() == "someone else's"
