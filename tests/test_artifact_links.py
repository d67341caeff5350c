"""`log_artifact(directory)` stores the directory's own files, never what a link inside it
points to outside the tree."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import tracklake
from tracklake._write.blobs import artifact_items

OUTSIDE = b"outside-the-tree-7c1e9a\n"


def _blobs(root: Path) -> set[bytes]:
    return {p.read_bytes() for p in (root / "blobs" / "sha256").rglob("*") if p.is_file()}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "hostname"
    path.parent.mkdir()
    path.write_bytes(OUTSIDE)
    return path


@pytest.mark.parametrize("link", ["absolute", "relative", "nested", "directory"])
def test_a_link_out_of_the_directory_is_refused_and_nothing_is_stored(
        root: Path, tmp_path: Path, outside: Path, link: str) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "weights.bin").write_bytes(b"w")
    if link == "absolute":
        (ckpt / "host").symlink_to(outside)
    elif link == "relative":
        (ckpt / "host").symlink_to(Path("..") / "elsewhere" / "hostname")
    elif link == "nested":
        (ckpt / "sub" / "host").symlink_to(Path("..") / ".." / "elsewhere" / "hostname")
    else:
        (ckpt / "sub" / "etc").symlink_to(outside.parent, target_is_directory=True)
    run = tracklake.init(project="p", run_id="links", root=root, capture_identity=False)
    with pytest.raises(ValueError, match=r"(host|etc)\b.*outside the directory|not a regular"):
        run.log_artifact(ckpt, name="checkpoint")
    run.finish()
    assert OUTSIDE not in _blobs(root)


def test_a_link_to_a_file_inside_the_directory_is_stored_as_that_file(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "real.bin").write_bytes(b"inside")
    (ckpt / "latest.bin").symlink_to(Path("sub") / "real.bin")
    items = artifact_items(ckpt, "c")
    assert [(n, p if isinstance(p, bytes) else p.read_bytes()) for n, p in items] == [
        ("c/latest.bin", b"inside"), ("c/sub/real.bin", b"inside")]


def test_a_pipe_inside_the_directory_is_refused_by_name(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "fifo")
    with pytest.raises(ValueError, match=r"fifo.*not a regular file"):
        artifact_items(ckpt, "c")


def test_a_link_named_by_the_caller_is_followed(root: Path, tmp_path: Path,
                                                outside: Path) -> None:
    """Logging a link itself is an explicit choice of its target."""
    link = tmp_path / "link"
    link.symlink_to(outside)
    run = tracklake.init(project="p", run_id="one", root=root, capture_identity=False)
    assert run.log_artifact(link) == hashlib.sha256(OUTSIDE).hexdigest()
    run.finish()
