"""Links and special files planted in a store: no operation follows a link out of the
store or opens a FIFO or device (so nothing hangs, and nothing outside is written,
moved or deleted), and fsck reports each one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._ops.fsck import fsck
from tracklake._ops.pack.pack import pack
from tracklake._read.catalog_shards import catalog_file
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
        ["fsck", "--root", str(root), "--repair"],  # never salvaged, moved nor opened
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


def test_a_writer_never_writes_through_a_directory_planted_as_a_link(tmp_path: Path) -> None:
    """A run's metrics or runs directory, or the blobs directory, planted as a link to a
    directory outside the store (by another user of a shared store, or in a restored
    backup): nothing is written there. init() refuses a linked runs directory naming it;
    a linked metrics directory or blob directory fails those writes, counted and reported
    by finish() naming the link, and the rest of the run is written in the store."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root, "p", ("first",))
    for name in ("metrics", "runs", "blobs"):
        (outside / name).mkdir(parents=True)
    (root / "runs" / "project=p" / "run=r1").symlink_to(outside / "runs")
    with pytest.raises(OSError, match=r"run=r1 is a symbolic link, where the store keeps"):
        tracklake.init(project="p", run_id="r1", root=root, compact=False)
    (root / "metrics" / "project=p" / "run=r2").symlink_to(outside / "metrics")
    (root / "blobs").symlink_to(outside / "blobs")
    run = tracklake.init(project="p", run_id="r2", root=root, compact=False)
    run.log({"loss": 1.0}, step=0)
    assert run.log_artifact(b"weights", name="w.bin") is None
    run.log_config({"lr": 0.1})
    report = run.finish(timeout=3)
    assert not report.complete and "symbolic link" in str(report.last_error)
    assert report.errors_by_errno.get("ELOOP", 0) >= 2, report
    assert [p for p in outside.rglob("*") if p.is_file()] == []
    (root / "metrics" / "project=p" / "run=r2").unlink()
    assert tracklake.query("SELECT status FROM runs WHERE run = 'r2'",
                           root=root).to_pylist() == [{"status": "finished"}]


def test_a_rank_directory_swapped_for_a_link_after_init_gets_no_attempt_record(
        tmp_path: Path) -> None:
    """The rank's directory of `runs/`, moved out of the store and replaced by a link to
    it while the run lives: finish() writes no record through the link, and says so."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    run = tracklake.init(project="p", run_id="r", root=root, compact=False)
    run.log({"loss": 1.0}, step=0)
    rank_dir = root / "runs" / "project=p" / "run=r" / "rank=0"
    shutil.move(rank_dir, outside)
    rank_dir.symlink_to(outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    report = run.finish(timeout=3)
    assert not report.complete and "symbolic link" in str(report.last_error), report
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_the_shipper_never_writes_through_a_stream_directory_planted_as_a_link(
        tmp_path: Path) -> None:
    """In ship mode, the root's directory of the run is a link out of the store: the
    records stay on the node's disk, and nothing is written outside."""
    root, outside, local = tmp_path / "store", tmp_path / "outside", tmp_path / "local"
    _store(root, "p", ("first",))
    outside.mkdir()
    (root / "metrics" / "project=p" / "run=r").symlink_to(outside)
    run = tracklake.init(project="p", run_id="r", root=root, compact=False,
                         local_root=local, capture_identity=False)
    for step in range(20):
        run.log({"loss": float(step)}, step=step)
    report = run.finish(timeout=3)
    assert not report.complete and report.errors_by_errno.get("ELOOP") == 1, report
    assert "records are left to ship" in str(report.last_error), report
    assert list(outside.rglob("*")) == []
    (root / "metrics" / "project=p" / "run=r").unlink()  # the link removed, as told
    result = CliRunner().invoke(main, ["ship", "--root", str(root), "--local", str(local)])
    assert result.exit_code == 0, result.output
    assert tracklake.query("SELECT count(*) AS n FROM metrics WHERE run = 'r'",
                           root=root).to_pylist() == [{"n": 20}]


@pytest.mark.parametrize("name", [catalog_file("r").relative_to(".cache").as_posix(),
                                  "decoded-v1.json", "heartbeats/h.json"])
def test_a_fifo_named_as_a_cache_file_hangs_nothing(tmp_path: Path, name: str) -> None:
    """The files readers keep in ROOT/.cache (the run catalog, decoded values, the
    heartbeats a host watched) planted as FIFOs: each question ends and answers from the
    store's own files, as when the cache is missing."""
    root = tmp_path / "store"
    _store(root, "p", ("r", "s"))
    fifo = root / ".cache" / name
    if name.startswith("heartbeats/"):
        from tracklake._format.heartbeats import watch_file

        fifo = watch_file(root)
    for path in (root / ".cache").rglob("*"):
        if path.is_file():
            path.unlink()
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    for args in (["sql", "--root", str(root), "--format", "csv",
                  "SELECT count(*) AS n FROM metrics"],
                 ["runs", "--root", str(root)], ["compact", "--root", str(root)]):
        proc = subprocess.run([sys.executable, "-m", "tracklake._cli", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        if args[0] == "sql":
            assert proc.stdout.split() == ['"n"', "20"], proc.stdout
    assert fifo.exists()


def test_the_bundle_marker_as_a_fifo_hangs_no_reader(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root, "p", ("r",))
    (root / ".cache" / "bundles").mkdir(parents=True, exist_ok=True)
    os.mkfifo(root / ".cache" / "bundles" / ".checked")
    proc = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                           "from tracklake._read.bundles import checked_marker; "
                           "print(checked_marker(Path(sys.argv[1])))", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "{}", proc.stderr


def test_a_cache_directory_planted_as_a_link_is_neither_read_nor_written(
        tmp_path: Path) -> None:
    """ROOT/.cache a link to a directory outside the store: questions answer from the
    store's files, compaction compacts and says why it bundled nothing, and nothing is
    read from or written into the directory it leads to."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root, "p", ("r", "s"))
    shutil.rmtree(root / ".cache", ignore_errors=True)
    (outside / "bundles").mkdir(parents=True)
    (outside / catalog_file("r").relative_to(".cache")).parent.mkdir(parents=True)
    (outside / catalog_file("r").relative_to(".cache")).write_bytes(b"crafted")
    (root / ".cache").symlink_to(outside)
    before = _files(outside)
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist() == [
        {"n": 20}]
    result = CliRunner().invoke(main, ["compact", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "small runs not bundled" in result.output and ".cache is a symbolic link" in \
        result.output, result.output
    assert CliRunner().invoke(main, ["runs", "--root", str(root)]).exit_code == 0
    assert tracklake.query("SELECT count(*) AS n FROM runs", root=root).to_pylist() == [
        {"n": 2}]
    assert _files(outside) == before


@pytest.mark.parametrize("planted", ["link out of the store", "link to a device", "FIFO"])
def test_a_catalogued_part_swapped_for_a_link_or_fifo_is_never_opened(
        tmp_path: Path, planted: str) -> None:
    """The run catalog still lists the part, the run is small enough to be read whole
    (`run_table`), and its directory's mtime is put back: a question about that run, one
    about every run and `show` end in their own process without reading what the link
    leads to, and fsck names it."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    _store(root, "p", ("a", "b"))
    with tracklake.init(project="p", run_id="a", root=outside, compact=False) as run:
        for step in range(10):
            run.log({"loss": 1000.0 + step}, step=step)  # a part worth reading, elsewhere
    for store in (root, outside):
        tracklake.compact(root=store)
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist() == [
        {"n": 20}]  # the catalog now lists run a's part
    [part] = (root / "metrics" / "project=p" / "run=a").rglob("*.parquet")
    [theirs] = (outside / "metrics" / "project=p" / "run=a").rglob("*.parquet")
    was = os.stat(part.parent)
    part.unlink()
    if planted == "FIFO":
        os.mkfifo(part)
    else:
        part.symlink_to("/dev/zero" if planted == "link to a device" else theirs)
    # its directory's mtime put back, as a restore that keeps mtimes would
    os.utime(part.parent, ns=(was.st_atime_ns, was.st_mtime_ns))
    questions = {"SELECT count(*) AS n, coalesce(max(value), -1) AS top FROM metrics "
                 "WHERE run = 'a'": ['"n","top"', "0,-1"],
                 "SELECT count(*) AS n, max(value) AS top FROM metrics": [
                     '"n","top"', "10,9"]}
    for sql, lines in questions.items():
        proc = subprocess.run([sys.executable, "-m", "tracklake._cli", "sql", "--root",
                               str(root), "--format", "csv", sql],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (sql, proc.stderr)
        assert proc.stdout.split() == lines, (sql, proc.stdout)
    proc = subprocess.run([sys.executable, "-m", "tracklake._cli", "show", "a", "--root",
                           str(root)], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "1000" not in proc.stdout, proc.stderr
    found = {p.path: p.what for p in fsck(root).problems}
    kind = "FIFO" if planted == "FIFO" else "symbolic link"
    assert part in found and kind in found[part], found
