"""The W&B destination, offline, read back from the `.wandb` transaction logs it makes
(LevelDB-log framing, wandb's own `Record` protobuf): every metric once at its step,
steps in order, nested config, tables; a second export session appends to the same run
and repeats nothing; sessions after the last commit are set aside."""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _records import records_by_kind

import tracklake

pytest.importorskip("wandb")

from wandb.proto import wandb_internal_pb2

from tracklake.exporters import Destination, RunInfo
from tracklake.exporters.wandb import WandbDestination, wandb_run_id

PROJECT = "proj"
CONFIG = {"lr": 0.001, "model": {"layers": 4, "name": "gpt"}, "flag": True}
SPECIAL = [math.nan, math.inf, -math.inf, 0.5, -0.0]


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-default"))


def _make_run(root: Path, run_id: str = "r1", steps: int = 20) -> None:
    with tracklake.init(project=PROJECT, run_id=run_id, root=root, capture_identity=False,
                        config=CONFIG) as run:
        for step in range(steps):
            run.log({"loss": 1.0 / (step + 1), "special": SPECIAL[step % len(SPECIAL)]},
                    step=step)
            if step % 10 == 0:
                run.log_generations([{"input": "2+2?", "output": f"4 at {step}", "score": 1.0},
                                     ("q2", "a2", None)], step=step, key="val")
        run.log_text("notes", "hello")
        run.alert("loss spike", "loss went up", level="error", step=5)


def _tables(root: Path, run_id: str = "r1") -> dict[str, pa.Table]:
    return records_by_kind(root, PROJECT, run_id)


def _info(run_id: str = "r1", **changes: Any) -> RunInfo:
    fields: dict[str, Any] = {"project": PROJECT, "run": run_id, "name": "a name",
                              "status": "finished", "attempts": 1, "ranks": (0,),
                              "tags": ("t1",), "started_at": None}
    fields.update(changes)
    return RunInfo(**fields)


def _send(dest: WandbDestination, info: RunInfo, tables: Mapping[str, pa.Table],
          state: Mapping[str, Any]) -> dict[str, Any]:
    dest.open_run(info, state)
    for kind in tracklake.KINDS:
        if kind in tables:
            dest.write(info, kind, tables[kind])
    kept: dict[str, Any] = json.loads(json.dumps(dest.commit(info)))  # the loop keeps JSON
    return kept


# -- reading .wandb files ------------------------------------------------------------------

BLOCK = 32768


def _records(path: Path) -> Iterator[Any]:
    """wandb's transaction log: a 7-byte header (":W&B", magic, version), then LevelDB
    log records (CRC-32 seeded with the type, length, type FULL/FIRST/MIDDLE/LAST) in
    32 KiB blocks; each complete record is a serialised `Record`."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:
            pos += room  # the block's zero trailer
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        payload = data[pos + 7:pos + 7 + length]
        assert len(payload) == length, "a torn record"
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pos += 7 + length
        chunks += payload
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record
            chunks = b""


def _files(tmp_path: Path, run_id: str = "r1", suffix: str = ".wandb") -> list[Path]:
    wid = wandb_run_id(_info(run_id))
    return sorted((tmp_path / "out" / "wandb").glob(f"offline-run-*-{wid}-tracklake*/*"
                                                    f"{suffix}"))


def _history(files: list[Path]) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for f in files:
        for r in _records(f):
            if r.WhichOneof("record_type") == "history":
                values: dict[str, Any] = {}
                for item in r.history.item:  # dict values come as items with nested keys
                    *parents, last = [item.key] if item.key else list(item.nested_key)
                    node = values
                    for part in parents:
                        node = node.setdefault(part, {})
                    node[last] = json.loads(item.value_json)
                rows.append((r.history.step.num,
                             {k: v for k, v in values.items() if not k.startswith("_")}))
    return rows


def _same(value: float) -> object:
    """Comparable: NaN equals NaN; W&B's history JSON writes -0.0 as 0."""
    return "nan" if math.isnan(value) else value + 0.0


def _points(history: list[tuple[int, dict[str, Any]]]) -> Counter[tuple[int, str, object]]:
    return Counter((step, k, _same(float(v))) for step, values in history
                   for k, v in values.items() if not isinstance(v, dict))


def _expected(metrics: pa.Table) -> Counter[tuple[int, str, object]]:
    return Counter((s, k, _same(v)) for s, k, v in zip(
        metrics.column("step").to_pylist(), metrics.column("key").to_pylist(),
        metrics.column("value").to_pylist(), strict=True))


def _config(files: list[Path]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for f in files:
        for r in _records(f):
            if r.WhichOneof("record_type") == "config":
                config.update((i.key, json.loads(i.value_json)) for i in r.config.update)
    return config


# -- tests -------------------------------------------------------------------------------


@pytest.fixture
def tables(root: Path) -> dict[str, pa.Table]:
    _make_run(root)
    return _tables(root)


@pytest.fixture
def dest(tmp_path: Path) -> WandbDestination:
    return WandbDestination(dir=str(tmp_path / "out"))


def test_it_is_a_destination_described_without_secrets(dest: WandbDestination,
                                                        tmp_path: Path) -> None:
    assert isinstance(dest, Destination)
    assert dest.describe() == f"wandb:offline:{tmp_path / 'out'}"
    assert [o.name for o in WandbDestination.cli_options()] == [
        "mode", "dir", "entity", "wandb_project", "proxy"]


def test_every_metric_arrives_once_at_its_step_with_config_and_tables(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    state = _send(dest, _info(), tables, {})
    dest.finish_run(_info())
    assert state["sessions"] == 1 and state["last_step"] == 19
    files = _files(tmp_path)
    assert len(files) == 2  # the commit's session and finish_run()'s
    history = _history(files[:1])
    assert [s for s, _ in history] == list(range(20))
    assert _points(history) == _expected(tables["metrics"])

    run = next(r.run for r in _records(files[0]) if r.WhichOneof("record_type") == "run")
    assert run.run_id == wandb_run_id(_info()) and run.project == PROJECT
    assert run.run_group == "r1" and run.display_name == "a name" and list(run.tags) == ["t1"]
    config = _config(files[:1])
    assert config["model"] == {"layers": 4, "name": "gpt"} and config["lr"] == 0.001

    by_step = dict(history)
    generations = by_step[10]["generations/val"]
    assert generations["_type"] == "table-file" and generations["nrows"] == 2
    table = json.loads((files[0].parent / "files" / generations["path"]).read_text())
    assert table["columns"][:5] == ["step", "sample", "input", "output", "score"]
    assert [row[:5] for row in table["data"]] == [[10, 0, "2+2?", "4 at 10", 1.0],
                                                  [10, 1, "q2", "a2", None]]
    assert by_step[5]["alerts"]["nrows"] == 1
    assert "texts/notes" in by_step[19] or "texts/notes" in by_step[0]


def test_out_of_order_steps_within_a_batch_arrive_in_order(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    metrics = tables["metrics"]
    shuffled = metrics.take(pa.array(list(reversed(range(metrics.num_rows)))))
    _send(dest, _info(), {"metrics": shuffled}, {})
    history = _history(_files(tmp_path))
    assert [s for s, _ in history] == list(range(20))
    assert _points(history) == _expected(metrics)


def test_a_second_session_appends_to_the_same_run_and_repeats_nothing(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    metrics = tables["metrics"]
    half = metrics.num_rows // 2
    state = _send(dest, _info(), {"metrics": metrics.slice(0, half)}, {})
    fresh = WandbDestination(dir=str(tmp_path / "out"))  # a later export process
    state = _send(fresh, _info(), {"metrics": metrics.slice(half)}, state)
    # the loop re-sends an overlapping batch (e.g. a later attempt restarting at step 0)
    state = _send(fresh, _info(), {"metrics": metrics.slice(0, 4)}, state)
    files = _files(tmp_path)
    assert len(files) == 3 and state["sessions"] == 3
    assert _points(_history(files)) == _expected(metrics)
    assert state["dropped_steps"] == 2 and state["dropped_records"] == 4


def test_sessions_after_the_last_commit_are_set_aside_and_sent_again_once(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    """A session that finished but whose state the loop never saved (killed just after
    commit()) is renamed on reopening, and its records are sent again in a new one."""
    metrics = tables["metrics"]
    half = metrics.num_rows // 2
    state = _send(dest, _info(), {"metrics": metrics.slice(0, half)}, {})
    _send(dest, _info(), {"metrics": metrics.slice(half)}, state)  # its state is lost
    assert len(_files(tmp_path)) == 2
    fresh = WandbDestination(dir=str(tmp_path / "out"))
    _send(fresh, _info(), {"metrics": metrics.slice(half)}, state)
    assert len(_files(tmp_path)) == 2
    assert len(_files(tmp_path, suffix=".wandb.uncommitted")) == 1
    assert _points(_history(_files(tmp_path))) == _expected(metrics)


def test_an_empty_state_sets_aside_every_earlier_session(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    _send(dest, _info(), tables, {})
    _send(dest, _info(), tables, {})  # the export state was lost: export from the start
    assert len(_files(tmp_path)) == 1
    assert _points(_history(_files(tmp_path))) == _expected(tables["metrics"])


def test_a_state_this_exporter_did_not_write_is_refused(dest: WandbDestination) -> None:
    from tracklake import ExportError
    with pytest.raises(ExportError, match="not one this exporter wrote") as err:
        dest.open_run(_info(), {"id": "other", "sessions": 1})
    assert not err.value.retryable
