"""JSON files planted in a store (a restored backup, another user): nesting that raises
RecursionError, and small values that cost a Python object each, are refused like any
other file that is not one tracklake wrote; no question or command fails over them."""

from __future__ import annotations

import json
import os
import threading
import zlib
from pathlib import Path

import pytest
from _settled import age

import tracklake
from tracklake._format import bounded_json
from tracklake._read.bundles import BUNDLE_DIR, CHECKED
from tracklake._read.decoded import CACHE_FILE

NESTED = b"[" * 3000


def test_loads_refuses_what_would_take_more_than_its_budget() -> None:
    honest = json.dumps({"runs/project=p/run=r/rank=0/attempt=1.json":
                         [120, 1796470490064455000, {"status": "running", "tags": []}]})
    assert bounded_json.loads(honest, 1 << 20) == json.loads(honest)
    lists = b"[" + b"[]," * 100_000 + b"[]]"  # 300 KB: 100,000 lists of 64 bytes
    assert bounded_json.parse_cost(lists) > 100_000 * 64
    with pytest.raises(ValueError, match="would take more than 1,048,576 bytes"):
        bounded_json.loads(lists, 1 << 20)
    assert len(bounded_json.loads(lists, 64 << 20)) == 100_001
    with pytest.raises(ValueError, match="nested too deep"):
        bounded_json.loads(NESTED)


def _store(root: Path) -> None:
    for i in range(3):
        with tracklake.init(project="p", run_id=f"r{i}", root=root, compact=False,
                            capture_identity=False) as run:
            run.log({"loss": float(i)}, step=0)
    tracklake.compact(root=root)
    age(root)


QUESTION = "SELECT run, value FROM metrics ORDER BY run"


@pytest.mark.parametrize("planted", ["bundle marker", "catalog header", "decoded cache"])
def test_a_question_passes_over_a_planted_nested_file(
        root: Path, planted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file is read by every question over every run of a settled store (the
    bundle marker once 64 runs are not bundled; here 3): 3 KB of `[` made each of them
    fail with RecursionError."""
    from tracklake._read import bundles

    monkeypatch.setattr(bundles, "BUILD_MIN_RUNS", 3)
    started: list[list[str]] = []
    monkeypatch.setattr(bundles.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    _store(root)
    expected = tracklake.query(QUESTION, root=root).to_pylist()
    assert [r["run"] for r in expected] == ["r0", "r1", "r2"]
    if planted == "bundle marker":
        path = root / BUNDLE_DIR / CHECKED  # when the bundle builder last looked
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(NESTED)
        os.utime(path, (0, 0))  # long ago: the next question reads it
    elif planted == "catalog header":
        from tracklake._read.catalog_shards import catalog_file

        (root / catalog_file("r0")).write_bytes(NESTED + b"\n")
    else:
        (root / CACHE_FILE).write_bytes(_signed(NESTED))
        with tracklake.init(project="p", run_id="live", root=root, compact=False,
                            capture_identity=False) as run:  # read from its files
            run.log({"loss": 9.0}, step=0)
        expected.insert(0, {"run": "live", "value": 9.0})  # ordered by run
    assert tracklake.query(QUESTION, root=root).to_pylist() == expected
    if planted == "bundle marker":
        assert started  # the marker was read, and taken for none


def _signed(body: bytes) -> bytes:
    return json.dumps({"version": 2, "crc32": zlib.crc32(body)}).encode() + b"\n" + body


def test_a_decoded_cache_of_small_values_is_not_parsed(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 60 MiB decoded cache of ``[],`` with its checksum right would take about 1.4 GB
    of Python lists to parse: it is judged from its bytes and passed over."""
    _store(root)
    with tracklake.init(project="p", run_id="live", root=root, compact=False,
                        capture_identity=False) as run:
        run.log({"loss": 9.0}, step=0)
    body = b"{\"x\":[" + b"[]," * (20 << 20) + b"[]]}"
    (root / CACHE_FILE).write_bytes(_signed(body))
    parsed: list[int] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(len(s)) or real(
        s, *a, **k))
    rows = tracklake.query(QUESTION, root=root).to_pylist()
    assert [r["run"] for r in rows] == ["live", "r0", "r1", "r2"]
    assert max(parsed, default=0) < 1 << 20  # the cache's body was never handed over


def test_a_backup_manifest_nested_too_deep_is_named(root: Path, tmp_path: Path) -> None:
    from tracklake._ops.backup import BackupError, backup
    from tracklake._ops.backup.manifest import MANIFEST

    _store(root)
    target = tmp_path / "backup"
    backup(root, target)
    (target / MANIFEST).write_bytes(NESTED)
    with pytest.raises(BackupError, match=rf"{MANIFEST} is damaged .*nested too deep"):
        backup(root, target)


def test_export_status_reads_no_fifo_and_follows_no_link(root: Path, tmp_path: Path) -> None:
    """A destination's description planted as a FIFO made `export status` wait for a
    writer for ever; an exports directory planted as a link had it read state outside
    the store."""
    from tracklake.exporters import export_status

    _store(root)
    fifo_dir = root / "exports" / "fifo"
    fifo_dir.mkdir(parents=True)
    os.mkfifo(fifo_dir / "destination.json")
    outside = tmp_path / "outside"
    (outside / "project=p").mkdir(parents=True)
    (outside / "destination.json").write_text(json.dumps({"description": "outside"}))
    (outside / "project=p" / "run=r0.json").write_text("{}")
    (root / "exports" / "linked").symlink_to(outside, target_is_directory=True)
    done: list[list[dict[str, object]]] = []
    worker = threading.Thread(target=lambda: done.append(export_status(root)), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "export status still waits on the FIFO"
    assert all(row["destination"] != "outside" for row in done[0]), done


def test_an_exporter_reads_and_writes_no_state_through_a_planted_link(
        root: Path, tmp_path: Path) -> None:
    """An exporter keeps each run's state in ``ROOT/exports/<destination>/project=P/``.
    A link planted at ``exports`` or at ``project=P`` led its reads and writes to the
    link's target, outside the store; it is refused, naming the link."""
    from tracklake import ExportError
    from tracklake.exporters import Exporter, MemoryDestination, Selection

    _store(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "exports").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ExportError, match=r"exports is a symbolic link"):
        Exporter(MemoryDestination(), root=root, selection=Selection(all_runs=True),
                 log=lambda m: None).run()
    assert list(outside.iterdir()) == []
    (root / "exports").unlink()
    exporter = Exporter(MemoryDestination(), root=root, selection=Selection(all_runs=True),
                        log=lambda m: None)
    exporter.state_dir.mkdir(parents=True, exist_ok=True)
    (exporter.state_dir / "project=p").symlink_to(outside, target_is_directory=True)
    summary = exporter.run()
    assert list(outside.iterdir()) == []  # nothing read or written there
    errors = [o.error for o in summary.failed]
    assert len(errors) == 3 and all("project=p is a symbolic link" in (e or "")
                                    for e in errors), errors
