"""Links and special files planted in a store: no operation follows a link out of the
store or opens a FIFO or device (so nothing hangs, and nothing outside is written,
moved or deleted), and fsck reports each one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._ops.fsck import fsck
from tracklake._ops.pack.pack import pack
from tracklake._read.location import regular_blob


def _store(root: Path, project: str, runs: tuple[str, ...]) -> None:
    for run_id in runs:
        with tracklake.init(project=project, run_id=run_id, root=root, compact=False) as r:
            for step in range(10):
                r.log({"loss": float(step)}, step=step)


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink() and ".cache" not in p.parts}


def test_a_project_directory_linked_into_another_store_is_never_followed(
        tmp_path: Path) -> None:
    root, other = tmp_path / "store", tmp_path / "other"
    _store(root, "p", ("mine",))
    _store(other, "v", ("theirs",))
    before = _files(other)
    for kind in ("metrics", "runs"):
        (root / kind / "project=v").symlink_to(other / kind / "project=v")
    tracklake.compact(root=root)
    result = CliRunner().invoke(main, ["retain", "--root", str(root), "--keep-last", "0",
                                       "--apply"])
    assert result.exit_code == 0, result.output
    assert _files(other) == before  # nothing written, moved or deleted there
    assert tracklake.query("SELECT DISTINCT project FROM metrics_all",
                           root=other).to_pylist() == [{"project": "v"}]
    found = {p.path: p.what for p in fsck(root).problems}
    for kind in ("metrics", "runs"):
        link = root / kind / "project=v"
        assert link in found and "symbolic link" in found[link], found


def _segment_dir(root: Path) -> Path:
    [directory] = root.glob("metrics/project=p/run=r/rank=0/attempt=1")
    return directory


def test_a_segment_named_link_to_a_device_is_never_read(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root, "p", ("r",))
    (_segment_dir(root) / "_seg-000099-000000001000.arrows").symlink_to("/dev/zero")
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist() == [
        {"n": 10}]
    report = fsck(root)
    assert [p.what for p in report.problems] == [
        "a symbolic link to /dev/zero inside the store"]
    tracklake.compact(root=root)
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist() == [
        {"n": 10}]


def test_a_fifo_named_as_a_segment_hangs_nothing(tmp_path: Path) -> None:
    """Each command runs in its own process with a deadline: a FIFO opened for reading
    would block it for ever."""
    root = tmp_path / "store"
    _store(root, "p", ("r",))
    fifo = _segment_dir(root) / "_seg-000099-000000001000.arrows"
    os.mkfifo(fifo)
    commands = [
        ["sql", "--root", str(root), "SELECT count(*) FROM metrics"],
        ["show", "r", "--root", str(root)],
        ["fsck", "--root", str(root)],
        ["compact", "--root", str(root)],
        ["export", "tensorboard", "--root", str(root), "--run", "r", "--logdir",
         str(tmp_path / "tb")],
        ["backup", "--root", str(root), str(tmp_path / "backup")],
        ["pack", "--root", str(root), "--run", "r", "--output", str(tmp_path / "r.tlpack")],
    ]
    for args in commands:
        proc = subprocess.run([sys.executable, "-m", "tracklake._cli", *args],
                              capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        if args[0] == "fsck":
            assert "a FIFO inside the store" in proc.stdout + proc.stderr
            assert proc.returncode != 0
        else:
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert fifo.exists()  # nobody removed or replaced what they do not own


def _blob_store(root: Path, data: bytes) -> str:
    with tracklake.init(project="p", run_id="r", root=root, compact=False) as r:
        digest = r.log_artifact(data, name="weights.bin")
    assert digest is not None
    return digest


def test_a_blob_replaced_by_a_link_out_of_the_store_is_never_read(tmp_path: Path) -> None:
    from tracklake.files import NotRegularFileError
    from tracklake.read import blob_path, open_blob, stored_blob

    root, secret = tmp_path / "store", tmp_path / "secret"
    secret.write_bytes(b"not the store's to give away")
    digest = _blob_store(root, b"model bytes")
    blob = blob_path(root, digest)
    assert stored_blob(root, digest) == blob
    blob.unlink()
    blob.symlink_to(secret)
    assert stored_blob(root, digest) is None
    try:
        open_blob(root, digest)
    except NotRegularFileError as exc:
        assert str(blob) in str(exc)
    else:
        raise AssertionError("open_blob followed a link out of the store")
    report = pack(root=root, all_runs=True, output=tmp_path / "p.tar")
    assert report.missing_blobs == [digest]
    found = {p.path: p.what for p in fsck(root).problems}
    assert blob in found and "symbolic link" in found[blob], found
    # logging the same bytes again puts the real blob back in place of the link
    _blob_store(root, b"model bytes")
    assert stored_blob(root, digest) == blob and not blob.is_symlink()
    assert blob.read_bytes() == b"model bytes"
    assert secret.read_bytes() == b"not the store's to give away"


def test_a_blob_directory_linked_elsewhere_or_a_fifo_blob_is_left_out(tmp_path: Path) -> None:
    from tracklake.files import NotRegularFileError
    from tracklake.read import blob_path, open_blob, stored_blob

    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    digest = _blob_store(root, b"first")
    shard = blob_path(root, digest).parent
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)  # the blob is there, but only through a link
    assert stored_blob(root, digest) is None
    try:
        open_blob(root, digest)
    except NotRegularFileError:
        pass
    else:
        raise AssertionError("open_blob went through a linked directory")
    shard.unlink()
    shard.mkdir()
    os.mkfifo(blob_path(root, digest))
    assert stored_blob(root, digest) is None
    try:
        open_blob(root, digest)  # refused at once, no read that waits for a writer
    except NotRegularFileError as exc:
        assert "FIFO" in str(exc)
    else:
        raise AssertionError("open_blob opened a FIFO")
    assert regular_blob(root, "../" * 10 + "etc/passwd") is None


def test_the_wandb_artifacts_leave_out_a_blob_that_is_a_link(tmp_path: Path) -> None:
    from tracklake.exporters.wandb.artifacts import build
    from tracklake.read import blob_path

    root, secret = tmp_path / "store", tmp_path / "secret"
    secret.write_bytes(b"secret")
    digest = _blob_store(root, b"model bytes")
    record = {"name": "weights.bin", "digest": digest, "step": 0, "size": 11}
    built, missing = build([record], root)
    assert len(built) == 1 and missing == []
    blob = blob_path(root, digest)
    blob.unlink()
    blob.symlink_to(secret)
    built, missing = build([record], root)
    assert built == [] and missing == ["weights.bin"]
