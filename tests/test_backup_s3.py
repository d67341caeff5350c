"""Backup and restore through a real S3 server on loopback (moto in server mode), reached
with pyarrow's S3 file system and the standard AWS_* environment: full then incremental,
a `tracklake backup` killed mid-upload then resumed, a corrupted object refused on
restore, restore into an empty root answering like the source, and no credential ever
written into the store or the backup."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _backup_store import answers, log_run, make_store
from _s3 import CREDENTIALS, S3Server
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
    verify_backup,
)


@pytest.fixture(scope="module", autouse=True)
def _no_s3_client_outlives_the_module() -> Iterator[None]:
    """Free every pyarrow S3 client before the interpreter shuts down: one destroyed after
    pyarrow finalized S3 can crash the process at exit (apache/arrow#38352, #41087)."""
    yield
    gc.collect()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "store")


def objects(server: S3Server, bucket: str, prefix: str) -> dict[str, int]:
    """Size of every object under `bucket/prefix`, by path relative to it."""
    from pyarrow import fs

    s3 = server.filesystem()
    assert isinstance(s3, fs.S3FileSystem)
    infos = s3.get_file_info(fs.FileSelector(f"{bucket}/{prefix}", recursive=True,
                                             allow_not_found=True))
    return {i.path.removeprefix(f"{bucket}/{prefix}/"): int(i.size or 0) for i in infos
            if i.type == fs.FileType.File}


def test_full_then_incremental_backup_to_s3_and_restore_into_an_empty_root(
        store: Path, tmp_path: Path, s3_bucket: str, s3_env: S3Server) -> None:
    url = f"s3://{s3_bucket}/backups/lab"
    result = CliRunner().invoke(main, ["backup", url, "--root", str(store)])
    assert result.exit_code == 0, result.output
    first = read_manifest(url)["files"]
    held = objects(s3_env, s3_bucket, "backups/lab")
    assert set(held) == set(first) | {MANIFEST}  # the store's layout, plus the manifest
    assert all(held[rel] == e["size"] for rel, e in first.items())

    again = backup(store, url)
    assert again.copied == [] and again.unchanged == len(first)
    log_run(store, "two")
    tracklake.compact(root=store, run="one")
    third = backup(store, url)
    assert third.copied and all("run=two" in r or "run=one" in r or r.startswith("blobs/")
                                for r in third.copied)
    expected = answers(store)

    listing = CliRunner().invoke(main, ["backup", "--list", url])
    assert listing.exit_code == 0, listing.output
    assert "bk/two" in listing.output and "golden/done" in listing.output

    restored = tmp_path / "restored"
    result = CliRunner().invoke(main, ["restore", url, "--root", str(restored)])
    assert result.exit_code == 0, result.output
    assert answers(restored) == expected
    twice = restore(url, restored)
    assert twice.copied == [] and twice.unchanged == len(read_manifest(url)["files"])


def test_a_backup_killed_mid_upload_resumes_without_uploading_twice(
        store: Path, tmp_path: Path, s3_bucket: str, s3_env: S3Server) -> None:
    url = f"s3://{s3_bucket}/b"
    env = dict(os.environ) | {KILL_AT_ENV: "4"}
    code = subprocess.run([sys.executable, "-m", "tracklake._cli", "backup", url, "--root",
                           str(store)], env=env, check=False, capture_output=True).returncode
    assert code == -9
    uploaded = set(objects(s3_env, s3_bucket, "b"))
    assert len(uploaded) >= 4 and MANIFEST not in uploaded  # killed before its first save
    report = backup(store, url)
    # read back and compared, not sent again; an upload whose body was on its way when
    # the process was killed may still complete on the server after the listing above
    assert report.unchanged >= len(uploaded)
    assert not uploaded & set(report.copied)
    assert verify_backup(url) == []
    restored = tmp_path / "restored"
    restore(url, restored)
    assert answers(restored) == answers(store)


def test_a_corrupted_object_is_refused_on_restore(store: Path, tmp_path: Path,
                                                  s3_bucket: str, s3_env: S3Server) -> None:
    url = f"s3://{s3_bucket}/b"
    backup(store, url)
    s3 = s3_env.filesystem()
    rel = next(r for r in read_manifest(url)["files"] if r.endswith(".parquet"))
    key = f"{s3_bucket}/b/{rel}"
    with s3.open_input_stream(key) as f:  # type: ignore[attr-defined]
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x40  # same size, other bytes
    with s3.open_output_stream(key) as f:  # type: ignore[attr-defined]
        f.write(bytes(data))
    assert verify_backup(url) == [f"{rel}: content does not match its checksum"]
    target = tmp_path / "restored"
    result = CliRunner().invoke(main, ["restore", url, "--root", str(target)])
    assert result.exit_code == 1
    assert "damaged; nothing was restored" in result.output and rel in result.output
    assert not target.exists()


def test_no_credential_is_written_into_the_store_or_the_backup(
        store: Path, s3_bucket: str, s3_env: S3Server) -> None:
    url = f"s3://{s3_bucket}/b"
    backup(store, url)
    secret = CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode()
    for path in store.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    s3 = s3_env.filesystem()
    with s3.open_input_stream(f"{s3_bucket}/b/{MANIFEST}") as f:  # type: ignore[attr-defined]
        assert secret not in f.read()
    ledger = list((store / "backups").glob("*.json"))
    assert len(ledger) == 1 and f"s3://{s3_bucket}/b".encode() in ledger[0].read_bytes()


def test_a_missing_bucket_is_a_clear_error(store: Path, s3_env: S3Server) -> None:
    with pytest.raises(BackupError, match=r"no-such-bucket.*run the backup again"):
        backup(store, "s3://no-such-bucket-for-tracklake/b")


def test_a_blob_damaged_in_the_store_is_not_left_in_the_bucket(
        store: Path, tmp_path: Path, s3_bucket: str, s3_env: S3Server) -> None:
    from tracklake._ops.backup import DamagedSourceError

    url = f"s3://{s3_bucket}/b"
    blob = next(p for p in (store / "blobs").rglob("*") if p.is_file())
    rel = blob.relative_to(store).as_posix()
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(DamagedSourceError, match="damaged") as info:
        backup(store, url)
    assert info.value.report.damaged == [rel]
    assert rel not in objects(s3_env, s3_bucket, "b")  # uploaded, read back, deleted
    files = read_manifest(url)["files"]
    assert rel not in files and any(f.startswith("blobs/") for f in files)
    assert verify_backup(url) == []
