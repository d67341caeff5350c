"""fsck: every injected fault in a segment, part, blob or attempt file is reported with
its path, or the file still reads exactly as before; repair quarantines (never deletes),
salvages the readable batches of a segment, is idempotent, and leaves a store that
queries without error and holds only records it held before."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from _crafted import endianness_slot, message_spans
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracklake
from tracklake._cli.main import main
from tracklake._format.attempt import read_attempt
from tracklake._ops.backup import backup
from tracklake._ops.fsck import fsck
from tracklake._read.reader import ReadProblems, list_streams, read_stream


def _rows(root: Path) -> dict[str, set[tuple[Any, ...]]]:
    """Every record of every stream, as the reader gives them (a file the reader finds
    damaged is left out, as every reader of the store does)."""
    out: dict[str, set[tuple[Any, ...]]] = {}
    for s in list_streams(root):
        rows: set[tuple[Any, ...]] = set()
        for batch in read_stream(root, s, problems=ReadProblems()):
            rows.update(tuple(repr(v) for v in r.values()) for r in batch.to_pylist())
        out[f"{s.project}/{s.run}/{s.key()}"] = rows
    return out


def _attempts(root: Path) -> dict[str, Any]:
    out = {}
    for p in sorted((root / "runs").rglob("*.json")):
        try:
            out[str(p.relative_to(root))] = read_attempt(p)
        except tracklake.FormatError:
            out[str(p.relative_to(root))] = "unreadable"
    return out


def _files(root: Path, kind: str) -> list[Path]:
    pattern = {"segment": "*.arrows", "part": "*.parquet", "blob": "blobs/sha256/*/*",
               "attempt": "runs/**/*.json", "backup record": "backups/*.json"}[kind]
    found = root.glob(pattern) if "/" in pattern else root.rglob(pattern)
    return sorted(p for p in found if "exports" not in p.parts)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run compacted into parts, one finished run left in segments of several batches,
    artifacts in blobs."""
    root = tmp_path_factory.mktemp("fsck") / "store"
    with tracklake.init(project="p", run_id="parts", root=root, config={"lr": 0.1},
                        capture_identity=False) as run:
        for step in range(30):
            run.log({"loss": 1 / (step + 1), "acc": step / 30}, step=step)
        run.log_text("note", "hello", step=29)
        run.log_artifact(b"weights" * 100, name="ckpt.bin")
    tracklake.compact(root=root, run="parts")
    with tracklake.init(project="p", run_id="segs", root=root, capture_identity=False) as run:
        for step in range(30):
            run.log({"loss": float(step)}, step=step)
            if step % 10 == 9:
                run.flush()  # several batches in the segment
        run.log_artifact(b"other" * 50, name="b.bin")
    backup(root, root.parent / "backup")  # the store records what the backup holds
    return root


def test_a_clean_store_is_clean(template: Path, tmp_path: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(template, root)
    report = fsck(root)
    assert report.clean, [p.line(root) for p in report.problems]
    assert set(report.checked) == {"segments", "parts", "blobs", "attempt files",
                                   "backup records"}
    result = CliRunner().invoke(main, ["fsck", "--root", str(root)])
    assert result.exit_code == 0 and "clean" in result.output


def _inject_and_check(template: Path, kind: str, which: int, where: float, flip: int,
                      truncate: bool) -> None:
    """Damage one file; fsck must report it by path or the store must read as before;
    repair must quarantine it, keep only records the store held, and be idempotent."""
    if kind in ("attempt", "backup record") or (kind == "part"
                                                and not PARTS_HAVE_PAGE_CHECKSUMS):
        # JSON has no checksum, so a flipped digit can still parse; parts written without
        # page checksums cannot tell a flipped bit in a data page from a value (see
        # test_a_flipped_bit_in_a_part_data_page_is_found)
        truncate = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "s"
        shutil.copytree(template, root)
        before, attempts = _rows(root), _attempts(root)
        files = _files(root, kind)
        path = files[which % len(files)]
        data = bytearray(path.read_bytes())
        at = int(where * len(data))
        if truncate:
            del data[at:]
        else:
            data[at] ^= flip
        path.write_bytes(bytes(data))

        report = fsck(root)
        if path not in {p.path for p in report.problems}:
            # not reported: then it must read exactly as before
            assert _rows(root) == before and _attempts(root) == attempts, (
                f"{kind} {path.name} damaged at {at} reads differently and fsck missed it")
            return
        assert not report.clean
        result = CliRunner().invoke(main, ["fsck", "--root", str(root), "--repair"])
        assert result.exit_code == 1 and "repaired" in result.output
        assert (root / "quarantine" / path.relative_to(root)).exists()  # never deleted
        assert fsck(root).clean
        after = _rows(root)
        for stream, rows in after.items():
            assert rows <= before.get(stream, set()), f"{stream} holds records it never had"
        tracklake.query("SELECT count(*) FROM metrics", root=root)  # queries without error
        once = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        assert fsck(root, repair=True).clean  # idempotent
        assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == once


@pytest.mark.parametrize("kind", ["segment", "part", "blob", "attempt", "backup record"])
@pytest.mark.parametrize(("where", "truncate"), [(0.5, False), (0.6, True), (0.0, True)])
def test_a_damaged_file_of_each_kind_is_found_and_repaired(template: Path, kind: str,
                                                           where: float,
                                                           truncate: bool) -> None:
    _inject_and_check(template, kind, 0, where, 0x40, truncate)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["segment", "part", "blob", "attempt", "backup record"]),
       which=st.integers(0, 99),
       where=st.floats(0, 1, exclude_max=True), flip=st.integers(1, 255),
       truncate=st.booleans())
def test_every_fault_is_found_or_harmless_and_repair_keeps_only_what_was_there(
        template: Path, kind: str, which: int, where: float, flip: int,
        truncate: bool) -> None:
    _inject_and_check(template, kind, which, where, flip, truncate)



#: Compaction (store/_ops/compact.py) writes parts without Parquet page checksums, so
#: reading cannot verify their data pages. Set to True once it writes them.
PARTS_HAVE_PAGE_CHECKSUMS = True


@pytest.mark.slow
def test_a_flipped_bit_in_a_part_data_page_is_found(template: Path, tmp_path: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(template, root)
    before = _rows(root)
    part = next((root / "metrics").rglob("*.parquet"))
    original = part.read_bytes()
    missed = []
    for at in range(4, len(original) - 8, 5):
        data = bytearray(original)
        data[at] ^= 0x01
        part.write_bytes(bytes(data))
        if part not in {p.path for p in fsck(root).problems} and _rows(root) != before:
            missed.append(at)
    part.write_bytes(original)
    assert not missed, f"flips at bytes {missed[:10]} read as other values unnoticed"


def _metric_rows(root: Path) -> int:
    return sum(batch.num_rows for _, batch in tracklake.read_run(
        root, tracklake.Cursor("p", "segs"), kinds=("metrics",)))


def test_a_torn_segment_keeps_every_batch_before_the_tear(template: Path,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(template, root)
    (seg,) = (root / "metrics" / "project=p" / "run=segs").rglob("*.arrows")
    data = seg.read_bytes()
    seg.write_bytes(data[: len(data) - 20])  # into the last batch (and past the end marker)
    before = _metric_rows(root)
    (problem,) = fsck(root).problems
    assert problem.path == seg and "torn tail" in problem.what
    report = fsck(root, repair=True)
    assert report.problems[0].repaired and "sealed segment" in report.problems[0].repaired
    after = _metric_rows(root)
    assert after == before == 20  # the two batches before the torn third one
    assert fsck(root).clean


def test_a_damaged_exporter_state_is_reported_not_moved(template: Path,
                                                        tmp_path: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(template, root)
    state = root / "exports" / "memory-x" / "project=p" / "run=parts.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"format": "1.0", "positions": {"0/1/metrics": "lots"}}')
    report = fsck(root, repair=True)
    (problem,) = report.problems
    assert problem.path == state and problem.repaired is None
    assert "move it away to export the run again" in problem.todo
    assert state.exists()


@pytest.mark.parametrize(("field", "value"), [("heartbeat_at", "not-a-date"),
                                              ("world_size", -3), ("tags", "not-a-list")])
def test_an_attempt_file_the_readers_refuse_is_damage(template: Path, tmp_path: Path,
                                                      field: str, value: object) -> None:
    """fsck judges attempt files by the readers' own validator: a file they skip as
    invalid is reported with the field, even when its attempt has no records yet."""
    root = tmp_path / "s"
    shutil.copytree(template, root)
    source = next((root / "runs").rglob("attempt=1.json"))
    record = json.loads(source.read_bytes())
    record.update(run="ghost", attempt=1, rank=0, **{field: value})
    ghost = root / "runs" / f"project={record['project']}" / "run=ghost" / "rank=0"
    ghost.mkdir(parents=True)
    (ghost / "attempt=1.json").write_text(json.dumps(record))
    report = fsck(root)
    (problem,) = report.problems
    assert problem.path == ghost / "attempt=1.json" and field in problem.what


def _segs_copy(template: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the template store, and the metrics segment of its run `segs`."""
    root = tmp_path / "s"
    shutil.copytree(template, root)
    return root, next((root / "metrics" / "project=p" / "run=segs").rglob("*.arrows"))


def _big_endian(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[endianness_slot(data)] = 4  # one bit: `endianness` read from the table's 4th byte
    return bytes(flipped)


def _unreadable(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[8:40] = bytes(32)  # the flatbuffer's root and vtable gone
    return bytes(flipped)


def _another_runs(data: bytes) -> bytes:
    """The header of the same kind's stream of run `other`, in as many bytes."""
    return data.replace(b"segs", b"othr", 1)


@pytest.mark.parametrize("damage", [_big_endian, _unreadable, _another_runs])
def test_a_segment_whose_header_alone_is_damaged_is_repaired_losing_nothing(
        template: Path, tmp_path: Path, damage: Any) -> None:
    """The schema header of a segment has no checksum and its batches each have one: when
    every batch verifies under the header its stream's writer writes, fsck says nothing
    is lost once repaired, and repair rebuilds the header (the original in quarantine)."""
    root, seg = _segs_copy(template, tmp_path)
    data = seg.read_bytes()
    before = _rows(root)
    seg.write_bytes(damage(data))
    if damage is not _another_runs:  # readers know a segment's stream by its path
        assert _rows(root) != before  # readers leave the damaged segment out
    (problem,) = fsck(root).problems
    assert problem.path == seg
    assert "verify under the stream's own header" in problem.what
    assert problem.lost == "nothing once repaired"
    result = CliRunner().invoke(main, ["fsck", "--root", str(root), "--repair"])
    assert result.exit_code == 1, result.output
    assert "rebuilt its header and kept 3 readable batches (30 rows)" in result.output
    assert (root / "quarantine" / seg.relative_to(root)).read_bytes() == damage(data)
    assert fsck(root).clean
    assert _rows(root) == before
    assert seg.read_bytes() == data  # the very bytes its writer wrote


def test_a_damaged_header_over_batches_that_do_not_verify_is_quarantined(
        template: Path, tmp_path: Path) -> None:
    root, seg = _segs_copy(template, tmp_path)
    data = bytearray(_big_endian(seg.read_bytes()))
    for at in range(8 + int.from_bytes(data[4:8], "little") + 64, len(data) - 8, 97):
        data[at] ^= 0x10  # every batch damaged as well
    seg.write_bytes(bytes(data))
    (problem,) = fsck(root).problems
    assert problem.lost == "every record of the file"
    assert fsck(root, repair=True).problems[0].repaired.startswith("moved to quarantine/")
    assert fsck(root).clean


#: Runs `fsck --repair` in a child that kills itself with SIGKILL at one step of the
#: header's repair: after the original's copy to the quarantine, once the new segment is
#: written under its temporary name, or once it is renamed over the original.
_KILLED_REPAIR = """
import os, shutil, signal, sys
from tracklake._cli.main import main
step, target = sys.argv[1], sys.argv[2]

def killing(name, fn):
    def wrapper(*args, **kwargs):
        done = fn(*args, **kwargs)
        if name == step and any(str(a).endswith(target) for a in args):
            os.kill(os.getpid(), signal.SIGKILL)
        return done
    return wrapper

shutil.copy2 = killing("copied", shutil.copy2)
os.replace = killing("replaced", os.replace)
if step == "written":
    from tracklake._format import segment
    seal = segment.SegmentWriter.seal
    def sealed(self):
        seal(self)
        os.kill(os.getpid(), signal.SIGKILL)
    segment.SegmentWriter.seal = sealed
sys.argv = ["tracklake", "fsck", "--root", sys.argv[3], "--repair"]
main()
"""


@pytest.mark.parametrize("step", ["copied", "written", "replaced"])
def test_a_header_repair_killed_at_any_step_loses_nothing_and_finishes_on_the_next(
        template: Path, tmp_path: Path, step: str) -> None:
    import signal
    import subprocess
    import sys

    root, seg = _segs_copy(template, tmp_path)
    data = seg.read_bytes()
    before = _rows(root)
    seg.write_bytes(_big_endian(data))
    killed = subprocess.run([sys.executable, "-c", _KILLED_REPAIR, step, seg.name, str(root)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert seg.exists()  # the original, or the repaired segment: never neither
    assert seg.read_bytes() in (_big_endian(data), data)
    again = CliRunner().invoke(main, ["fsck", "--root", str(root), "--repair"])
    assert again.exit_code in (0, 1), again.output
    assert fsck(root).clean  # a temporary left by the killed repair is no problem yet
    assert _rows(root) == before
    assert seg.read_bytes() == data
    assert _big_endian(data) in [p.read_bytes() for p in (root / "quarantine").rglob("*.arrows*")]


@pytest.mark.parametrize("damage", ["a flipped bit", "its length field"])
def test_a_damaged_batch_in_the_middle_of_a_segment_costs_that_batch_alone(
        template: Path, tmp_path: Path, damage: str) -> None:
    """Each batch carries its own checksum and seqs: once its writer is gone, repair
    keeps the batches after a damaged one too (before, only those before it)."""
    root, seg = _segs_copy(template, tmp_path)
    data = bytearray(seg.read_bytes())
    spans = message_spans(bytes(data))[1:]  # the batches, after the header
    assert len(spans) == 3
    start, _, end = spans[1]
    if damage == "a flipped bit":
        data[(start + end) // 2] ^= 0x04
    else:
        data[start + 4 : start + 8] = (1 << 30).to_bytes(4, "little")
    seg.write_bytes(bytes(data))
    (problem,) = fsck(root).problems
    assert problem.path == seg
    assert problem.lost == f"{end - start:,} bytes at byte {start}"
    result = CliRunner().invoke(main, ["fsck", "--root", str(root), "--repair"])
    assert "kept 2 readable batches (20 rows)" in result.output, result.output
    assert fsck(root).clean
    steps = sorted(r["step"] for b in read_stream(root, tracklake.StreamId(
        "p", "segs", 0, 1, "metrics"), problems=ReadProblems()) for r in b.to_pylist())
    assert steps == [*range(10), *range(20, 30)]


def test_a_live_writers_damaged_segment_is_repaired_only_once_the_writer_has_finished(
        tmp_path: Path) -> None:
    """Repair replaced the file under a writer still appending to it: the writer went on
    in a new segment and said its run was incomplete. Now fsck names the damage and
    leaves the file; once the writer has finished, repair loses the damaged batch alone."""
    root = tmp_path / "s"
    run = tracklake.init(project="p", run_id="live", root=root, capture_identity=False,
                         system_metrics=False, compact=False)
    for step in range(20):
        run.log({"loss": float(step)}, step=step)
        if step in (9, 19):
            run.flush()  # two batches
    (seg,) = (root / "metrics").rglob("*.arrows")
    start, _, end = message_spans(seg.read_bytes())[1]  # the first batch
    with open(seg, "r+b") as f:  # in place: the writer's file stays its file
        f.seek((start + end) // 2)
        byte = f.read(1)
        f.seek((start + end) // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    before = seg.read_bytes()
    report = fsck(root, repair=True)
    (problem,) = report.problems
    assert problem.path == seg and "its writer still appends to it" in problem.what
    assert problem.repaired is None and not problem.repairable
    assert seg.read_bytes() == before and not (root / "quarantine").exists()
    for step in range(20, 30):
        run.log({"loss": float(step)}, step=step)
    done = run.finish()
    assert done.complete, done
    assert "once its writer has finished" not in CliRunner().invoke(
        main, ["fsck", "--root", str(root), "--repair"]).output
    assert fsck(root).clean
    steps = sorted(r["step"] for b in read_stream(root, tracklake.StreamId(
        "p", "live", 0, 1, "metrics"), problems=ReadProblems()) for r in b.to_pylist())
    assert steps == list(range(10, 30))  # the damaged batch's steps alone are lost


#: `fsck --repair` in a child whose copy to the quarantine pauses until `go` exists.
_SLOW_REPAIR = """
import shutil, sys, time
from pathlib import Path
from tracklake._cli.main import main
started, go = Path(sys.argv[1]), Path(sys.argv[2])
copy = shutil.copy2

def paused(*args, **kwargs):
    started.touch()
    while not go.exists():
        time.sleep(0.05)
    return copy(*args, **kwargs)

shutil.copy2 = paused
sys.argv = ["tracklake", "fsck", "--root", sys.argv[3], "--repair"]
main()
"""


def test_a_second_repair_while_one_works_is_refused_and_touches_nothing(
        template: Path, tmp_path: Path) -> None:
    """Two repairs at once each copied the file to the quarantine under a name they had
    both found free: the second could put the repaired copy where the original was."""
    import subprocess
    import sys

    root, seg = _segs_copy(template, tmp_path)
    data = seg.read_bytes()
    seg.write_bytes(_big_endian(data))
    started, go = tmp_path / "started", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", _SLOW_REPAIR, str(started), str(go),
                              str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        for _ in range(1200):
            if started.exists() or first.poll() is not None:
                break
            __import__("time").sleep(0.05)
        assert started.exists(), first.communicate()
        second = CliRunner().invoke(main, ["fsck", "--root", str(root), "--repair"])
        assert second.exit_code == 1
        assert "another `tracklake fsck --repair` holds" in second.output, second.output
        assert seg.read_bytes() == _big_endian(data)  # left to the first
        assert [p.name for p in (root / "quarantine").rglob("*") if p.is_file()] == [
            ".repairing"]
    finally:
        go.touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 1, err
    assert "rebuilt its header and kept 3 readable batches" in out
    assert seg.read_bytes() == data
    (kept,) = (p for p in (root / "quarantine").rglob("*") if p.is_file())
    assert kept.read_bytes() == _big_endian(data)  # the original, and the claim is gone
    assert fsck(root).clean


def test_a_file_removed_between_its_check_and_its_repair_is_no_error(
        template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._ops.fsck import check

    root, seg = _segs_copy(template, tmp_path)
    seg.write_bytes(_big_endian(seg.read_bytes()))
    checked = check._check

    def then_removed(*args: Any) -> Any:
        found = checked(*args)
        seg.unlink()  # a retention, say, between the check and the repair
        return found

    monkeypatch.setattr(check, "_check", then_removed)
    (problem,) = fsck(root, repair=True).problems
    assert problem.repaired.startswith("gone since it was checked")
    assert not (root / "quarantine").exists() or not [
        p for p in (root / "quarantine").rglob("*.arrows*")]


def test_a_salvaged_copy_a_killed_repair_left_is_removed_by_the_next_repair(
        template: Path, tmp_path: Path) -> None:
    """A repair killed while it wrote the salvaged segment aside left `.SEG.PID.tmp`.
    The next repair holds the store's repair claim, so no other repair is writing one:
    it removes such copies of the segment it repairs at once, whatever their age."""
    root, seg = _segs_copy(template, tmp_path)
    data = seg.read_bytes()
    seg.write_bytes(_big_endian(data))
    killed = seg.with_name(f".{seg.name}.4194303.tmp")
    killed.write_bytes(data[:100])  # half written
    unrelated = seg.with_name(".another-file.12.tmp")
    unrelated.write_bytes(b"x")
    (problem,) = fsck(root, repair=True).problems
    assert problem.repaired.startswith("rebuilt its header")
    assert not killed.exists() and unrelated.exists()
    assert seg.read_bytes() == data


@pytest.mark.parametrize("window", [None, 300])
def test_damaged_batches_in_a_row_cost_those_batches_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int | None) -> None:
    """70 damaged batches in a row, more than the 64 message markers tried after a
    damaged one: repair follows the damaged batches' length fields and keeps the 30
    intact ones on either side (before, it kept the 10 before the damage). The same with
    the batches after the damage decoded a few at a time (a window of 300 bytes)."""
    if window is not None:
        from tracklake._format import segment_salvage

        monkeypatch.setattr(segment_salvage, "_FIRST_WINDOW_BYTES", window)
        monkeypatch.setattr(segment_salvage, "_WINDOW_BYTES", window)
    root = tmp_path / "s"
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        compact=False, system_metrics=False) as run:
        for step in range(100):
            run.log({"loss": float(step)}, step=step)
            run.flush()  # a batch a step
    (seg,) = (root / "metrics").rglob("*.arrows")
    data = bytearray(seg.read_bytes())
    spans = message_spans(bytes(data))[1:]
    assert len(spans) == 100
    for start, _, end in spans[10:80]:
        data[(start + end) // 2] ^= 0x01
    seg.write_bytes(bytes(data))
    (problem,) = fsck(root, repair=True).problems
    assert problem.repaired.startswith("kept 30 readable batches (30 rows)"), problem.repaired
    assert fsck(root).clean
    steps = sorted(r["step"] for b in read_stream(root, tracklake.StreamId(
        "p", "r", 0, 1, "metrics"), problems=ReadProblems()) for r in b.to_pylist())
    assert steps == [*range(10), *range(80, 100)]
