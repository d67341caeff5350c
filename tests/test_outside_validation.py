"""Everything that comes from outside (attempt files, pack manifests and members, cursors)
is validated field by field: one bad file is one reported problem naming its path, never a
crash of every reader of the store."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tracklake
from tracklake import Cursor, CursorError
from tracklake._cli.main import main as cli
from tracklake._format import StreamId, part_name, stream_dir
from tracklake._format.attempt import check_attempt, validate_attempt
from tracklake._ops.pack.manifest import parse_manifest
from tracklake._ops.pack.pack import (
    MANIFEST,
    MANIFEST_SUM,
    PackConflictError,
    pack,
    unpack,
    verify,
)
from tracklake.exporters import MemoryDestination
from tracklake.exporters._loop.loop import export
from tracklake.exporters._loop.select import Selection


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """Set a (dotted) field of an attempt record."""
    def change(record: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            record = record.setdefault(p, {})
        record[last] = value
    return change


#: Attempt records as a pack, a bad disk or a hand edit could leave them.
BAD_RECORDS: dict[str, Callable[[dict[str, Any]], None]] = {
    "heartbeat-not-a-date": _set("heartbeat_at", "not-a-date"),
    "heartbeat-no-timezone": _set("heartbeat_at", "2026-11-30T07:23:18"),
    "heartbeat-number": _set("heartbeat_at", 1764487398),
    "started-missing": _set("started_at", None),
    "finished-feb-30": _set("finished_at", "2026-02-30T00:00:00+00:00"),
    "status-unknown": _set("status", "exploded"),
    "rank-text": _set("rank", "0"),
    "rank-beyond-int32": _set("rank", 2**31),
    "attempt-zero": _set("attempt", 0),
    "world-size-huge": _set("world_size", 2**40),
    "world-size-bool": _set("world_size", True),
    "tags-text": _set("tags", "a,b"),
    "tags-numbers": _set("tags", [1, 2]),
    "name-number": _set("name", 5),
    "config-list": _set("config", [1, 2]),
    "identity-text": _set("identity", "me"),
    "command-text": _set("identity.command", "rm -rf /"),
    "command-numbers": _set("identity.command", [1, 2]),
    "host-number": _set("identity.host", 7),
    "git-dirty-text": _set("identity.git.dirty", "yes"),
    "env-values-numbers": _set("identity.env", {"A": 1}),
    "report-counts-text": _set("write_report.dropped_values", "none"),
    "project-of-another-path": _set("project", "elsewhere"),
    "run-unsafe": _set("run", "../../x"),
    "format-missing": _set("format", None),
}
BAD_BYTES = {
    "not-json": b"{not json",
    "a-list": b"[1, 2]",
    "not-utf8": b'{"format": "1.0", "run": "\xff\xfe"}',
    "deeply-nested": b"[" * 100_000 + b"]" * 100_000,
}


def _good_record(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_bytes())
    return record


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "store"
    for run_id in ("good", "bad"):
        with tracklake.init(project="p", run_id=run_id, root=root, config={"lr": 0.1},
                            capture_identity=True) as run:
            run.log({"loss": 1.0}, step=0)
    return root


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    """Two finished runs; `bad` will have its attempt file damaged."""
    root = tmp_path / "store"
    shutil.copytree(template, root)
    return root


def _bad_file(root: Path) -> Path:
    return next(root.glob("runs/project=p/run=bad/rank=0/attempt=1.json"))


def _damage(root: Path, case: str) -> Path:
    path = _bad_file(root)
    if case in BAD_BYTES:
        path.write_bytes(BAD_BYTES[case])
    else:
        record = _good_record(path)
        BAD_RECORDS[case](record)
        path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize("case", [*BAD_RECORDS, *BAD_BYTES])
def test_a_bad_attempt_file_is_refused_by_the_validator_naming_it(store: Path,
                                                                  case: str) -> None:
    path = _damage(store, case)
    with pytest.raises(tracklake.FormatError, match=str(path)):
        check_attempt(path)


@pytest.mark.parametrize("case", ["heartbeat-not-a-date", "rank-beyond-int32",
                                  "command-numbers", "not-json", "deeply-nested"])
def test_one_bad_attempt_file_is_one_reported_problem_not_a_crash_of_every_reader(
        store: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """runs, show, sql, compact and export go on with the rest of the store, and the bad
    file is named once on stderr."""
    path = _damage(store, case)
    runs = tracklake.query("SELECT run, status FROM runs ORDER BY run", root=store)
    assert runs.to_pylist() == [{"run": "good", "status": "finished"}]
    assert tracklake.query("SELECT count(*) AS n FROM metrics WHERE run = 'good'",
                           root=store).to_pylist() == [{"n": 1}]
    cli_runs = CliRunner().invoke(cli, ["runs", "--root", str(store)])
    assert cli_runs.exit_code == 0 and "good" in cli_runs.output, cli_runs.output
    shown = CliRunner().invoke(cli, ["show", "good", "--root", str(store)])
    assert shown.exit_code == 0, shown.output
    tracklake.compact(root=store)
    summary = export(MemoryDestination(), root=store, selection=Selection(all_runs=True),
                     log=lambda _: None)
    assert list(summary.runs) == ["p/good"] and not summary.failed
    err = capsys.readouterr().err
    assert err.count(str(path)) == 1, err


def test_a_pack_carrying_a_bad_attempt_file_is_refused_and_nothing_is_written(
        store: Path, tmp_path: Path) -> None:
    """The attempt file is checked like any member: its sha256 matches the manifest (the
    pack was made that way), but its content is not a valid record."""
    packed = tmp_path / "p.pack"
    pack(root=store, all_runs=True, output=packed)
    member = "runs/project=p/run=bad/rank=0/attempt=1.json"
    record = _good_record(store / member)
    record["heartbeat_at"] = "not-a-date"
    _replace_member(packed, member, json.dumps(record).encode())
    verify(packed)  # checksums and sizes agree: only the content is wrong
    target = tmp_path / "target"
    with pytest.raises(tracklake.FormatError, match=r"attempt=1\.json.*heartbeat_at"):
        unpack(packed, root=target)
    assert not target.exists() or not any(p.is_file() for p in target.rglob("*"))


@pytest.mark.parametrize(("field", "value"), [("rank", 2**31), ("attempt", 0)])
def test_a_manifest_with_ranks_or_attempts_out_of_range_is_refused(
        store: Path, tmp_path: Path, field: str, value: int) -> None:
    """A rank beyond int32 would break every query of the target (an int32 partition)."""
    packed = tmp_path / "p.pack"
    pack(root=store, all_runs=True, output=packed)
    doc = json.loads(_member(packed, MANIFEST))
    entry = doc["streams"][0]
    entry[field] = value
    entry["member"] = (stream_dir(Path(), StreamId(
        entry["project"], entry["run"], entry["rank"], entry["attempt"], entry["kind"]))
        / part_name(entry["first_seq"], entry["last_seq"], 0)).as_posix()
    with pytest.raises(tracklake.FormatError, match=f"{field} must be an integer in"):
        parse_manifest(json.dumps(doc).encode(), packed)


@pytest.mark.parametrize(("where", "value"), [
    ("created_at", "yesterday"),
    ("covered.streams", {"metrics/p/../../x/0/1": 3}),
    ("covered.attempts", {"p/good/0": "ab" * 32}),
    ("source", ["not", "an", "object"]),
    ("since", {"created_at": 5}),
])
def test_a_manifest_with_malformed_fields_is_refused(store: Path, tmp_path: Path,
                                                     where: str, value: object) -> None:
    packed = tmp_path / "p.pack"
    pack(root=store, all_runs=True, output=packed)
    doc = json.loads(_member(packed, MANIFEST))
    *parents, last = where.split(".")
    node = doc
    for p in parents:
        node = node[p]
    node[last] = value
    _write_manifest(packed, doc)
    with pytest.raises(tracklake.FormatError, match="malformed"):
        verify(packed)


@pytest.mark.parametrize("positions", [{f"{2**31}/1/metrics": 3}, {"0/1/metrics": 2**63},
                                       {"0/1/metrics": 10**30}])
def test_a_cursor_out_of_the_columns_range_is_refused(positions: dict[str, int]) -> None:
    with pytest.raises(CursorError):
        Cursor.from_json(json.dumps({"project": "p", "run": "r", "positions": positions}))


def test_a_cursor_nested_too_deep_is_a_cursor_error() -> None:
    with pytest.raises(CursorError):
        Cursor.from_json("[" * 100_000 + "]" * 100_000)


def test_validate_attempt_keeps_fields_it_does_not_know(store: Path) -> None:
    record = _good_record(_bad_file(store))
    record["added_in_a_later_minor"] = {"x": 1}
    assert validate_attempt(record, "here") is record


# -- rebuilding packs -------------------------------------------------------------------

def _member(path: Path, name: str) -> bytes:
    with tarfile.open(path) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


def _rebuild(path: Path, contents: dict[str, bytes]) -> None:
    """Write the pack again with some members' bytes replaced (manifest checksum kept in
    step with the manifest)."""
    with tarfile.open(path) as tar:
        members = []
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is not None
            members.append((m, contents.get(m.name, f.read())))
    manifest = dict(members)[MANIFEST] if MANIFEST not in contents else contents[MANIFEST]
    digest = hashlib.sha256(manifest).hexdigest().encode() + b"\n"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            data = digest if info.name == MANIFEST_SUM else data
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _write_manifest(path: Path, doc: dict[str, Any]) -> None:
    _rebuild(path, {MANIFEST: json.dumps(doc).encode()})


def _replace_member(path: Path, name: str, data: bytes) -> None:
    doc = json.loads(_member(path, MANIFEST))
    for entry in doc["attempts"] + doc["streams"] + doc["blobs"]:
        if entry["member"] == name:
            entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
    _rebuild(path, {name: data, MANIFEST: json.dumps(doc).encode()})


def test_a_metric_summary_in_a_packed_part_is_not_taken_from_the_pack(
        store: Path, tmp_path: Path) -> None:
    """Part metadata other than the stream's identity is recomputed on unpack, so a
    crafted `tracklake.summary` cannot reach the target's `metric_summaries`."""
    import pyarrow.parquet as pq

    packed = tmp_path / "p.pack"
    pack(root=store, all_runs=True, output=packed)
    doc = json.loads(_member(packed, MANIFEST))
    member = next(e["member"] for e in doc["streams"] if e["kind"] == "metrics")
    table = pq.read_table(io.BytesIO(_member(packed, member)))
    meta = {**(table.schema.metadata or {}), b"tracklake.summary": b'[{"key": 5}] not json'}
    out = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), out)
    _replace_member(packed, member, out.getvalue())
    target = tmp_path / "target"
    unpack(packed, root=target)
    tracklake.compact(root=target)
    rows = tracklake.query("SELECT run, key, count FROM metric_summaries ORDER BY run",
                           root=target).to_pylist()
    assert rows == [{"run": "bad", "key": "loss", "count": 1},
                    {"run": "good", "key": "loss", "count": 1}]


@pytest.mark.parametrize(("present", "error", "message"), [
    (b"", PackConflictError, "claimed in .* by a writer"),
    (b"{broken", tracklake.FormatError, r"attempt=1\.json: not a valid attempt record.*"
                                        "repair or move away"),
])
def test_an_attempt_file_the_target_cannot_vouch_for_is_never_overwritten(
        store: Path, tmp_path: Path, present: bytes, error: type[Exception],
        message: str) -> None:
    """A claimed (empty) or damaged attempt file in the target stops the unpack, naming
    it, before anything is written."""
    packed = tmp_path / "p.pack"
    pack(root=store, all_runs=True, output=packed)
    target = tmp_path / "target"
    mine = target / "runs/project=p/run=bad/rank=0/attempt=1.json"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(present)
    with pytest.raises(error, match=message):
        unpack(packed, root=target)
    assert _files_of(target) == [mine] and mine.read_bytes() == present


def _files_of(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]
