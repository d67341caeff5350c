"""pack/unpack: runs carried across an air gap arrive whole, once, verified, and never
outside the target store."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest
from _views import views
from click.testing import CliRunner

import tracklake
from tracklake._cli.pack import pack as pack_command
from tracklake._cli.pack import unpack as unpack_command
from tracklake._format import blob_path
from tracklake._ops.pack.pack import (
    MANIFEST,
    MANIFEST_SUM,
    PackConflictError,
    pack,
    read_manifest,
    unpack,
    verify,
)

GOLDEN = Path(__file__).parent / "golden" / tracklake.FORMAT_VERSION

def snapshot(path: Path) -> dict[str, bytes]:
    """Every file below `path` (relative name -> bytes)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def log_multi_rank(root: Path, steps: range, *, artifact: bytes) -> None:
    """Two ranks of run `multi`, one NaN metric, a text and an artifact per rank."""
    for rank in (0, 1):
        with tracklake.init(project="air", run_id="multi", root=root, rank=rank,
                            config={"lr": 1e-4, "rank": rank},
                            capture_identity=False) as run:
            for step in steps:
                run.log({"loss": 1.0 / (step + 1) + rank, "odd": math.nan if step % 5 == 0
                         else float(step)}, step=step)
            run.log_text("note", f"rank {rank} steps {steps.start}..{steps.stop - 1}",
                         step=steps.stop - 1)
            run.log_artifact(artifact + bytes([rank]), name=f"ckpt-{rank}.bin")


@pytest.fixture
def store_a(tmp_path: Path) -> Path:
    """The golden corpus (a finished run, a resumed one, one with a torn tail; texts,
    generations, traces, configs, events, artifacts) plus a two-rank run of our own,
    partly compacted so that packs read parts and live segments alike."""
    a = tmp_path / "a"
    shutil.copytree(GOLDEN, a)
    log_multi_rank(a, range(0, 40), artifact=b"weights-v1")
    tracklake.compact(root=a, run="done")
    return a


def test_unpacked_store_answers_every_query_like_the_source(store_a: Path, tmp_path: Path
                                                            ) -> None:
    """Pins: records of every kind, ranks, the torn-tail run (its complete batches), the
    resumed run's supersession, attempt files and artifact blobs all arrive; packing
    only reads the source."""
    before = snapshot(store_a)
    out = tmp_path / "runs.pack"
    report = pack(root=store_a, all_runs=True, output=out)
    assert snapshot(store_a) == before
    assert report.runs == 4 and report.blobs >= 3 and not report.missing_blobs

    b = tmp_path / "b"
    result = unpack(out, root=b)
    assert result.new > 0 and result.records == report.records
    assert views(b) == views(store_a)
    counts = {r["run"]: r["n"] for r in tracklake.query(
        "SELECT run, count(*) AS n FROM metrics_all GROUP BY run", root=b).to_pylist()}
    assert counts["torn"] == 9  # the complete batches before the tear, not the torn one
    assert counts["multi"] == 2 * 40 * 2  # two ranks, two keys
    for row in tracklake.query("SELECT DISTINCT digest FROM artifacts", root=b).to_pylist():
        digest = row["digest"]
        assert blob_path(b, digest).read_bytes() == blob_path(store_a, digest).read_bytes()


def test_unpacking_the_same_pack_twice_adds_nothing(store_a: Path, tmp_path: Path) -> None:
    """Pins idempotence: the second unpack reports 0 new and leaves every file as it was."""
    out = tmp_path / "runs.pack"
    pack(root=store_a, all_runs=True, output=out)
    b = tmp_path / "b"
    unpack(out, root=b)
    first = snapshot(b)
    again = unpack(out, root=b)
    assert again.new == 0 and again.records == 0
    assert again.streams_skipped == len(read_manifest(out).streams)
    assert snapshot(b) == first


def test_incremental_pack_carries_only_what_is_new(store_a: Path, tmp_path: Path) -> None:
    """Pins `since`: after more logging in A (a new attempt of `multi`), a pack made since
    the first holds only records past it, changed attempt files and new blobs; unpacked
    into B, B equals A again, and nothing is counted twice."""
    first = tmp_path / "first.pack"
    pack(root=store_a, all_runs=True, output=first)
    b = tmp_path / "b"
    unpack(first, root=b)

    log_multi_rank(store_a, range(30, 60), artifact=b"weights-v2")  # attempt 2 resumes
    second = tmp_path / "second.pack"
    report = pack(root=store_a, all_runs=True, output=second, since=first)
    manifest = read_manifest(second)
    assert {e.stream.attempt for e in manifest.streams} == {2}
    assert {(a.run, a.attempt) for a in manifest.attempts} == {("multi", 2)}
    assert report.blobs == 2  # the two new checkpoints only
    result = unpack(second, root=b)
    assert result.records == report.records
    assert views(b) == views(store_a)
    assert tracklake.query("SELECT count(*) AS n FROM metrics WHERE run = 'multi' AND "
                           "key = 'loss'", root=b).to_pylist() == [{"n": 2 * 60}]

    # a third pack since the second (the chain) holds nothing new at all
    third = tmp_path / "third.pack"
    empty = pack(root=store_a, all_runs=True, output=third, since=second)
    assert empty.records == empty.attempts == empty.blobs == 0
    assert unpack(third, root=b).new == 0

    # the full pack again after the incremental one: everything is already there
    assert unpack(first, root=b).new == 0
    assert views(b) == views(store_a)


def test_selection_by_project_and_run_and_unknown_run(store_a: Path, tmp_path: Path) -> None:
    """Pins selection like list_runs: a run id packs only that run; an unknown id fails."""
    out = tmp_path / "one.pack"
    report = pack(root=store_a, runs=["multi"], output=out)
    assert report.runs == 1
    assert {e.stream.run for e in read_manifest(out).streams} == {"multi"}
    assert pack(root=store_a, project="golden", output=tmp_path / "g.pack").runs == 3
    with pytest.raises(tracklake.RunNotFoundError, match="nope"):
        pack(root=store_a, runs=["nope"], output=tmp_path / "x.pack")
    with pytest.raises(ValueError, match="choose runs"):
        pack(root=store_a, output=tmp_path / "x.pack")


def _members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


@pytest.fixture
def packed(store_a: Path, tmp_path: Path) -> Path:
    out = tmp_path / "runs.pack"
    pack(root=store_a, all_runs=True, output=out)
    return out


@pytest.fixture
def store_b(tmp_path: Path) -> Path:
    """A target that already holds a run, so that "unchanged" is not trivially empty."""
    b = tmp_path / "b"
    with tracklake.init(project="local", run_id="mine", root=b, capture_identity=False) as run:
        run.log({"x": 1.0}, step=0)
    return b


@pytest.mark.parametrize("where", ["manifest", "checksum", "part", "attempt", "blob"])
def test_a_corrupt_byte_is_refused_and_nothing_is_written(packed: Path, store_b: Path,
                                                          where: str) -> None:
    """Pins verification: one flipped byte in any member gives FormatError naming the pack
    (and the member), and the target is left exactly as it was."""
    prefix = {"manifest": MANIFEST, "checksum": MANIFEST_SUM, "part": "metrics/",
              "attempt": "runs/", "blob": "blobs/"}[where]
    info = next(m for m in _members(packed) if m.name.startswith(prefix))
    data = bytearray(packed.read_bytes())
    data[info.offset_data + info.size // 2] ^= 0x55
    packed.write_bytes(bytes(data))
    before = snapshot(store_b)
    with pytest.raises(tracklake.FormatError, match=str(packed)):
        unpack(packed, root=store_b)
    assert snapshot(store_b) == before


@pytest.mark.parametrize("cut", ["start", "header", "30%", "70%", "last-member", "end-marker"])
def test_a_truncated_pack_is_refused_and_nothing_is_written(packed: Path, store_b: Path,
                                                            cut: str) -> None:
    """Pins truncation anywhere up to the end-of-archive marker: FormatError naming the
    file, target unchanged. (Losing only the zero padding after the marker loses nothing
    and is accepted, as tar itself does.)"""
    data = packed.read_bytes()
    last = _members(packed)[-1]
    end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    keep = {"start": 0, "header": 100, "30%": int(len(data) * 0.3),
            "70%": int(len(data) * 0.7), "last-member": last.offset_data + last.size // 2,
            "end-marker": end + tarfile.BLOCKSIZE}[cut]
    packed.write_bytes(data[:keep])
    before = snapshot(store_b)
    with pytest.raises(tracklake.FormatError, match=str(packed)):
        unpack(packed, root=store_b)
    assert snapshot(store_b) == before


def _rewrite(path: Path, *, manifest: dict[str, object] | None = None,
             extra: list[tarfile.TarInfo] | None = None) -> None:
    """Rebuild a pack with a changed manifest (checksum recomputed) and extra members."""
    import hashlib

    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else b"")  # type: ignore[union-attr]
                   for m in tar.getmembers()]
    doc = json.loads(members[0][1])
    doc.update(manifest or {})
    data = json.dumps(doc).encode()
    members[0] = (members[0][0], data)
    members[1] = (members[1][0], hashlib.sha256(data).hexdigest().encode())
    with tarfile.open(path, "w") as tar:
        for info, content in members:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        for info in extra or []:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("member", [
    _file("../evil"),
    _file("/etc/x"),
    _file("blobs/sha256/aa/../../../../evil"),
    _link("blobs/sha256/ab/" + "ab" * 32, "/etc/passwd", tarfile.SYMTYPE),
    _link("runs/link", "../../evil", tarfile.LNKTYPE),
    _link("dev", "", tarfile.CHRTYPE),
], ids=["dotdot", "absolute", "nested-dotdot", "symlink", "hardlink", "device"])
def test_a_crafted_member_is_refused_and_nothing_lands_outside_the_store(
        packed: Path, store_b: Path, member: tarfile.TarInfo) -> None:
    """Pins member-name safety: only the names the manifest implies, as regular files,
    are accepted; nothing is written in the target or next to it."""
    _rewrite(packed, extra=[member])
    parent = store_b.parent
    before = snapshot(parent)
    with pytest.raises(tracklake.FormatError):
        unpack(packed, root=store_b)
    assert snapshot(parent) == before
    assert not (parent / "evil").exists() and not Path("/etc/x").exists()


@pytest.mark.parametrize("field", ["project", "run"])
def test_a_manifest_naming_an_unsafe_path_is_refused(packed: Path, store_b: Path,
                                                     field: str) -> None:
    """Pins manifest validation: a project or run of `..` (or with a slash) never becomes a
    path, even with its checksum recomputed."""
    doc = json.loads(read_manifest_bytes(packed))
    for bad in ("..", "a/../../b"):
        doc["streams"][0][field] = bad
        _rewrite(packed, manifest={"streams": doc["streams"]})
        before = snapshot(store_b.parent)
        with pytest.raises(tracklake.FormatError, match="unsafe"):
            unpack(packed, root=store_b)
        assert snapshot(store_b.parent) == before


def read_manifest_bytes(path: Path) -> bytes:
    with tarfile.open(path) as tar:
        return tar.extractfile(MANIFEST).read()  # type: ignore[union-attr]


def test_a_pack_of_a_newer_major_format_is_refused(packed: Path, store_b: Path) -> None:
    """Pins versioning: format 2.x raises NewerFormatError; 1.x with a higher minor reads."""
    _rewrite(packed, manifest={"format": "2.0"})
    with pytest.raises(tracklake.NewerFormatError, match="upgrade tracklake"):
        unpack(packed, root=store_b)
    _rewrite(packed, manifest={"format": "1.7"})
    assert verify(packed).format == "1.7"


def test_records_that_differ_from_the_target_are_refused_naming_the_stream(
        tmp_path: Path) -> None:
    """Pins conflict detection: the same run id, rank and attempt logged on two machines
    with different values is refused, naming the stream, and nothing is overwritten."""
    a, b = tmp_path / "a", tmp_path / "b"
    for root, value in ((a, 1.0), (b, 2.0)):
        with tracklake.init(project="p", run_id="same", root=root,
                            capture_identity=False) as run:
            run.log({"x": value}, step=0)
    tracklake.compact(root=b)
    out = tmp_path / "a.pack"
    pack(root=a, all_runs=True, output=out)
    before = snapshot(b)
    with pytest.raises(PackConflictError, match="metrics/p/same/0/1"):
        unpack(out, root=b)
    assert snapshot(b) == before


def test_cli_pack_and_unpack(store_a: Path, tmp_path: Path) -> None:
    """Pins the commands: options, a summary on stderr, exit 1 with a message on a bad
    pack, and a usage error without a selection."""
    runner = CliRunner()
    out = tmp_path / "cli.pack"
    result = runner.invoke(pack_command, ["--root", str(store_a), "--project", "air",
                                          "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "packed 1 run(s)" in result.output
    b = tmp_path / "b"
    result = runner.invoke(unpack_command, [str(out), "--root", str(b)])
    assert result.exit_code == 0 and "unpacked" in result.output
    since = runner.invoke(pack_command, ["--root", str(store_a), "--all", "-o",
                                         str(tmp_path / "next.pack"), "--since", str(out)])
    assert since.exit_code == 0, since.output
    assert runner.invoke(pack_command, ["--root", str(store_a), "-o", str(out)]).exit_code == 2
    out.write_bytes(out.read_bytes()[:1000])
    bad = runner.invoke(unpack_command, [str(out), "--root", str(b)])
    assert bad.exit_code == 1 and "error:" in bad.output
    assert os.listdir(tmp_path / "b")  # the first unpack's store is still there


# -- the output of `pack` ---------------------------------------------------------------

def _make(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "char-device":
        if os.geteuid() != 0:
            pytest.skip("creating a device node needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # like /dev/full
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_bytes(b"keep")
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "char-device", "symlink", "directory"])
def test_pack_refuses_an_output_that_is_not_a_regular_file(store_a: Path, tmp_path: Path,
                                                           kind: str) -> None:
    """Pins `-o /dev/full`: an existing output that is not a regular file is left as it
    was, with an error saying what it is."""
    out = tmp_path / "out.pack"
    _make(kind, out, tmp_path)
    before = os.lstat(out)
    with pytest.raises(tracklake.StoreError, match=f"refusing to write the pack to {out}"):
        pack(root=store_a, all_runs=True, output=out)
    after = os.lstat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino,
                                                            before.st_rdev)
    assert not list(tmp_path.glob(".tracklake-pack-*")) and not list(tmp_path.glob(".*.tmp"))
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_bytes() == b"keep"


def test_pack_refuses_a_missing_or_non_directory_parent_instead_of_creating_it(
        store_a: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "out.pack"
    with pytest.raises(tracklake.StoreError, match=r"does not exist.*create the directory"):
        pack(root=store_a, all_runs=True, output=missing)
    assert not (tmp_path / "no").exists()
    (tmp_path / "afile").write_bytes(b"")
    with pytest.raises(tracklake.StoreError, match="cannot write the pack to"):
        pack(root=store_a, all_runs=True, output=tmp_path / "afile" / "out.pack")


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root writes anywhere permissions allow; sysfs refuses even root
        if not os.path.isdir("/sys") or os.access("/sys", os.W_OK) is False:
            pytest.skip("no directory that refuses root's writes")
        return Path("/sys")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return locked


def test_an_unwritable_output_directory_is_a_clear_error_not_a_traceback(
        store_a: Path, tmp_path: Path) -> None:
    directory = _unwritable_dir(tmp_path)
    out = directory / "out.pack"
    with pytest.raises(tracklake.StoreError, match=f"packing to {out} failed: "
                       "(Permission denied|Operation not permitted).*nothing was written"):
        pack(root=store_a, all_runs=True, output=out)
    result = CliRunner().invoke(pack_command, ["--root", str(store_a), "--all", "-o",
                                               str(out)])
    assert result.exit_code == 1
    assert result.output.startswith("tracklake: error: packing to") and \
        "Traceback" not in result.output, result.output
    assert not out.exists()


def test_pack_since_counts_only_the_runs_with_something_new(store_a: Path,
                                                           tmp_path: Path) -> None:
    """Pins the report of an incremental pack: of the 4 runs, only `multi` grew."""
    first = tmp_path / "first.pack"
    assert pack(root=store_a, all_runs=True, output=first).runs == 4
    log_multi_rank(store_a, range(40, 45), artifact=b"weights-v2")
    second = tmp_path / "second.pack"
    report = pack(root=store_a, all_runs=True, output=second, since=first)
    assert (report.runs, report.runs_unchanged) == (1, 3)
    assert str(report).startswith(f"packed 1 run(s) into {second} (1 with something new "
                                  "since first.pack, 3 unchanged and left out)")
    nothing = pack(root=store_a, all_runs=True, output=tmp_path / "third.pack", since=second)
    assert (nothing.runs, nothing.runs_unchanged) == (0, 4)
