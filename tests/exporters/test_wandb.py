"""The W&B destination, offline, read back from the `.wandb` transaction logs it makes
(LevelDB-log framing, wandb's own `Record` protobuf): every metric once at its step,
steps in order, nested config, tables; a second export session appends to the same run
and repeats nothing; sessions after the last commit are set aside."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _optional import optional
from _records import records_by_kind, run_info, send

import tracklake

optional("wandb")

import _wandb_log as wlog
import wandb
from _probe_proxy import ProbeProxy

from tracklake.exporters import Destination, ExportContext, RunInfo
from tracklake.exporters.wandb.destination import WandbDestination, wandb_run_id

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
    return run_info(PROJECT, run_id, **changes)


def _files(tmp_path: Path, run_id: str = "r1", suffix: str = ".wandb") -> list[Path]:
    wid = wandb_run_id(_info(run_id))
    return sorted((tmp_path / "out" / "wandb").glob(f"offline-run-*-{wid}-tracklake*/*"
                                                    f"{suffix}"))


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
        "mode", "dir", "entity", "wandb_project", "proxy", "error_reporting"]


def test_every_metric_arrives_once_at_its_step_with_config_and_tables(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    state = send(dest, _info(), tables, {})
    dest.finish_run(_info())
    assert state["targets"] == [{"id": wandb_run_id(_info()), "attempt": None, "sessions": 1,
                                 "last_step": 19}]
    files = _files(tmp_path)
    assert len(files) == 2  # the commit's session and finish_run()'s
    history = wlog.history(files[:1])
    assert [s for s, _ in history] == list(range(20))
    assert wlog.points(history) == wlog.expected(tables["metrics"])

    run = next(r.run for r in wlog.records(files[0]) if r.WhichOneof("record_type") == "run")
    assert run.run_id == wandb_run_id(_info()) and run.project == PROJECT
    assert run.run_group == "r1" and run.display_name == "a name" and list(run.tags) == ["t1"]
    config = wlog.config(files[:1])
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
    send(dest, _info(), {"metrics": shuffled}, {})
    history = wlog.history(_files(tmp_path))
    assert [s for s, _ in history] == list(range(20))
    assert wlog.points(history) == wlog.expected(metrics)


def test_a_second_session_appends_to_the_same_run_and_repeats_nothing(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    metrics = tables["metrics"]
    half = metrics.num_rows // 2
    state = send(dest, _info(), {"metrics": metrics.slice(0, half)}, {})
    fresh = WandbDestination(dir=str(tmp_path / "out"))  # a later export process
    state = send(fresh, _info(), {"metrics": metrics.slice(half)}, state)
    # the loop re-sends an overlapping batch (e.g. a later attempt restarting at step 0)
    state = send(fresh, _info(), {"metrics": metrics.slice(0, 4)}, state)
    files = _files(tmp_path)
    assert len(files) == 3 and state["targets"][0]["sessions"] == 3
    assert wlog.points(wlog.history(files)) == wlog.expected(metrics)
    assert state["dropped_steps"] == 2 and state["dropped_records"] == 4


def test_sessions_after_the_last_commit_are_set_aside_and_sent_again_once(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    """A session that finished but whose state the loop never saved (killed just after
    commit()) is renamed on reopening, and its records are sent again in a new one."""
    metrics = tables["metrics"]
    half = metrics.num_rows // 2
    state = send(dest, _info(), {"metrics": metrics.slice(0, half)}, {})
    send(dest, _info(), {"metrics": metrics.slice(half)}, state)  # its state is lost
    assert len(_files(tmp_path)) == 2
    fresh = WandbDestination(dir=str(tmp_path / "out"))
    send(fresh, _info(), {"metrics": metrics.slice(half)}, state)
    assert len(_files(tmp_path)) == 2
    assert len(_files(tmp_path, suffix=".wandb.uncommitted")) == 1
    assert wlog.points(wlog.history(_files(tmp_path))) == wlog.expected(metrics)


def test_an_empty_state_sets_aside_every_earlier_session(
        dest: WandbDestination, tmp_path: Path, tables: dict[str, pa.Table]) -> None:
    send(dest, _info(), tables, {})
    send(dest, _info(), tables, {})  # the export state was lost: export from the start
    assert len(_files(tmp_path)) == 1
    assert wlog.points(wlog.history(_files(tmp_path))) == wlog.expected(tables["metrics"]), \
        _what_wandb_wrote(tmp_path)


def _what_wandb_wrote(tmp_path: Path) -> str:
    """Each session's records by type and the end of W&B's internal log: what a failure
    of a test reading the transaction logs back needs to say (one failed once in CI with
    no history in the second session's log)."""
    said = []
    for log in sorted((tmp_path / "out" / "wandb").glob("offline-run-*/*.wandb*")):
        kinds = Counter(r.WhichOneof("record_type") for r in wlog.records(log))
        internal = log.parent / "logs" / "debug-internal.log"
        tail = internal.read_text(errors="replace")[-3000:] if internal.is_file() else ""
        said.append(f"{log} ({log.stat().st_size} bytes): {dict(kinds)}\n{tail}")
    return "\n".join(said)


def test_a_state_this_exporter_did_not_write_is_refused(dest: WandbDestination) -> None:
    from tracklake import ExportError
    with pytest.raises(ExportError, match="not one this exporter wrote") as err:
        dest.open_run(_info(), {"id": "other", "sessions": 1})
    assert not err.value.retryable


@pytest.mark.parametrize("state", [
    {"rules": [{"name": "a*b", "step_metric": "s"}]},  # a glob W&B refuses
    {"rules": [{"name": "x", "step_metric": 3}]},
    {"rules": [{"name": f"k{i}"} for i in range(10_001)]},  # more than MAX_RULES
    {"waiting": {"tlr1": [["eval/step", "3", None, {}]]}},
    {"waiting": {"tlr1": [["eval/step", 3, None]]}},
    {"tops": {"tlr1": "9"}},
    {"seen": [["0"]]},
])
def test_a_crafted_axis_state_is_refused(dest: WandbDestination, state: dict[str, Any]
                                         ) -> None:
    from tracklake import ExportError
    base = {"id": wandb_run_id(_info()), "targets": [], "attempts": {}}
    with pytest.raises(ExportError, match="not one this exporter wrote"):
        dest.open_run(_info(), {**base, **state})


def test_axis_rows_take_steps_above_the_run_and_wait_above_its_own_axis() -> None:
    """`place`: an axis row goes at the latest own step written before it, above the
    last step and its axis' previous row; above the own axis' top it waits (while live),
    and so do the later rows of its axis; the last session places everything."""
    from tracklake.exporters.wandb.axes import AxisRow, place
    rows = {("e", 0): AxisRow(15, {"e": 0.0}), ("e", 1): AxisRow(16, {"e": 1.0}),
            ("c", 9000): AxisRow(25, {"c": 9000.0}), ("e", 2): AxisRow(40, {"e": 2.0}),
            ("c", 10000): AxisRow(None, {"c": 10000.0})}
    own = {11: 10, 12: 20, 13: 30}
    placed, waiting = place(rows, own, last_step=10, top=13, final=False)
    assert placed == {11: {"c": 10000.0, "e": 0.0}, 12: {"e": 1.0, "c": 9000.0},
                      13: {"e": 2.0}}
    assert waiting == {}
    placed, waiting = place(rows, {11: 10}, last_step=10, top=11, final=False)
    assert placed == {11: {"c": 10000.0, "e": 0.0}} and set(waiting) == {
        ("e", 1), ("e", 2), ("c", 9000)}
    placed, waiting = place(rows, {}, last_step=None, top=None, final=False)
    assert not waiting and sorted(placed) == [0, 1, 2]


def test_a_crafted_define_metric_event_is_left_out() -> None:
    from tracklake.exporters.wandb.axes import valid_rule
    assert valid_rule({"name": "eval/*", "step_metric": "eval/step", "goal": "x"}) == {
        "name": "eval/*", "step_metric": "eval/step"}
    for bad in ({"name": ""}, {"name": "a*b*"}, {"name": 3}, [], {"name": "a", "hidden": 1},
                {"name": "a", "step_metric": ""}, {"name": "a", "summary": ["min"]}):
        assert valid_rule(bad) is None


# -- resumed attempts ---------------------------------------------------------------------


def _attempt(root: Path, steps: range, offset: float) -> None:
    """One attempt of run r1 (a second call is the job resumed from a checkpoint)."""
    with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                        config=CONFIG) as run:
        for step in steps:
            run.log({"loss": offset + step}, step=step)
        run.log_text("notes", f"attempt at {offset}", step=steps[-1])


def _branch_files(tmp_path: Path, attempt: int) -> list[Path]:
    wid = f"{wandb_run_id(_info())}-a{attempt}"
    return sorted((tmp_path / "out" / "wandb").glob(f"offline-run-*-{wid}-tracklake*/*.wandb"))


def _losses(files: list[Path]) -> Counter[tuple[int, str, object]]:
    return wlog.points([(s, {k: v for k, v in row.items() if k == "loss"})
                        for s, row in wlog.history(files)])


def test_a_resumed_attempt_that_logs_steps_again_gets_a_w_and_b_run_of_its_own(
        dest: WandbDestination, root: Path, tmp_path: Path) -> None:
    """Attempt 1 logs steps 0..29 and dies; attempt 2 logs 20..39 again. W&B takes only
    increasing steps: the base run keeps attempt 1, ``<id>-a2`` gets all of attempt 2, in
    the same group; nothing is dropped."""
    _attempt(root, range(30), 0.0)
    _attempt(root, range(20, 40), 100.0)
    state = send(dest, _info(attempts=2), _tables(root), {})
    base = wandb_run_id(_info())
    assert [(t["id"], t["attempt"], t["last_step"]) for t in state["targets"]] == [
        (base, None, 29), (f"{base}-a2", 2, 39)]
    assert state["attempts"] == {"1": 0, "2": 1} and state["dropped_steps"] == 0
    assert _losses(_files(tmp_path)) == Counter((s, "loss", float(s)) for s in range(30))
    branch = _branch_files(tmp_path, 2)
    assert _losses(branch) == Counter((s, "loss", 100.0 + s) for s in range(20, 40))
    run = next(r.run for r in wlog.records(branch[0]) if r.WhichOneof("record_type") == "run")
    assert run.run_group == "r1" and run.display_name == "a name (attempt 2)"
    assert list(run.tags) == ["t1", "attempt-2"]
    assert wlog.config(branch)["model"] == {"layers": 4, "name": "gpt"}


def test_an_attempt_keeps_its_w_and_b_run_across_exports(
        dest: WandbDestination, root: Path, tmp_path: Path) -> None:
    """Export attempt 1, then (a new process, from the state) attempt 2 that restarts at
    step 10, then more of attempt 2: its later records follow it to its own W&B run."""
    _attempt(root, range(20), 0.0)
    state = send(dest, _info(), _tables(root), {})
    _attempt(root, range(10, 30), 100.0)
    metrics = _tables(root)["metrics"]
    later = metrics.filter(pc.equal(metrics.column("attempt"), 2))
    assert later.num_rows == 20
    state = send(WandbDestination(dir=str(tmp_path / "out")), _info(attempts=2),
                  {"metrics": later.slice(0, 5)}, state)
    state = send(WandbDestination(dir=str(tmp_path / "out")), _info(attempts=2),
                  {"metrics": later.slice(5)}, state)
    assert [t["sessions"] for t in state["targets"]] == [1, 2]
    assert _losses(_files(tmp_path)) == Counter((s, "loss", float(s)) for s in range(20))
    assert _losses(_branch_files(tmp_path, 2)) == Counter(
        (s, "loss", 100.0 + s) for s in range(10, 30))


def test_an_attempt_that_continues_after_the_last_step_stays_in_the_same_run(
        dest: WandbDestination, root: Path, tmp_path: Path) -> None:
    _attempt(root, range(20), 0.0)
    _attempt(root, range(20, 30), 0.0)
    state = send(dest, _info(attempts=2), _tables(root), {})
    assert len(state["targets"]) == 1 and state["attempts"] == {"1": 0, "2": 0}
    assert _losses(_files(tmp_path)) == Counter((s, "loss", float(s)) for s in range(30))
    assert not _branch_files(tmp_path, 2)


def test_wandb_sync_finds_every_committed_session_and_no_set_aside_one(
        dest: WandbDestination, root: Path, tmp_path: Path) -> None:
    """What `wandb sync` would upload (its --dry-run needs no network or login): each
    committed session once, in session order by start time (sync replays one run's
    files in start-time order); a set-aside session is not a .wandb file."""
    _attempt(root, range(20), 0.0)
    _attempt(root, range(10, 30), 100.0)
    tables = _tables(root)
    metrics = tables["metrics"]
    state = send(dest, _info(attempts=2), {"metrics": metrics.slice(0, 20)}, {})
    send(dest, _info(attempts=2), {"metrics": metrics.slice(20, 5)}, state)  # state lost
    state = send(WandbDestination(dir=str(tmp_path / "out")), _info(attempts=2),
                  {"metrics": metrics.slice(20)}, state)
    committed = _files(tmp_path) + _branch_files(tmp_path, 2)
    assert len(committed) == 2 and len(list((tmp_path / "out").rglob("*.uncommitted"))) == 1
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(wandb_cli), "sync", "--dry-run", str(tmp_path / "out" / "wandb")],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "WANDB_RESUME": "allow"})
    listed = {(tmp_path / "out" / "wandb" / line.split("wandb/", 1)[1]).resolve()
              for line in (out.stdout + out.stderr).splitlines() if line.endswith(".wandb")}
    assert listed == {f.resolve() for f in committed}


def test_online_without_credentials_is_a_clear_error_that_is_not_retried(
        tables: dict[str, pa.Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key: wandb refuses before any network; retrying cannot help."""
    from tracklake import ExportError
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    dest = WandbDestination(mode="online", dir=str(tmp_path / "out"))
    with pytest.raises(ExportError, match=r"run proj/r1: wandb\.init refused.*WANDB_API_KEY"
                       ) as err:
        send(dest, _info(), tables, {})
    assert not err.value.retryable


def test_every_rank_of_a_live_run_arrives_although_one_rank_lags(
        root: Path, tmp_path: Path) -> None:
    """--ranks all on a live run: rank 1 is 10 steps behind rank 0 when the exporter runs.
    Steps above the watermark wait (in the export state) until every rank passed them, so
    rank 1's later steps are not refused by W&B as going backwards."""
    from tracklake.exporters import ExportOptions, Selection, export
    runs = [tracklake.init(project=PROJECT, run_id="r1", root=root, rank=rank,
                           capture_identity=False) for rank in (0, 1)]
    for step in range(20):
        runs[0].log({"loss": float(step)}, step=step)
    for step in range(10):
        runs[1].log({"loss": 100.0 + step}, step=step)
    for run in runs:
        run.flush()
    options = ExportOptions(ranks="all")
    select = Selection(runs=("r1",))

    def once() -> None:
        export(WandbDestination(dir=str(tmp_path / "out")), root=root, selection=select,
               options=options, log=lambda _: None)

    once()
    assert {s for s, _ in wlog.history(_files(tmp_path))} == set(range(10))
    for step in range(10, 20):
        runs[1].log({"loss": 100.0 + step}, step=step)
    for run in runs:
        run.finish()
    once()
    files = _files(tmp_path)
    want = Counter((s, "rank0/loss", float(s)) for s in range(20)) + Counter(
        (s, "rank1/loss", 100.0 + s) for s in range(20))
    assert wlog.points(wlog.history(files)) == want


def _offline_service_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B online against a host that does not exist; wandb's settings read afresh."""
    wandb.teardown()  # its settings (base URL, ...) are read from the environment once
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.example.invalid")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_online_mode_goes_through_the_proxy_option_and_an_unreachable_service_is_retried(
        tables: dict[str, pa.Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online, W&B's requests go through the proxy given with --proxy (verl's
    wandb_proxy); W&B being unreachable beyond it is a retryable error."""
    from tracklake import ExportError
    _offline_service_env(tmp_path, monkeypatch)
    proxy = ProbeProxy()
    dest = WandbDestination(mode="online", dir=str(tmp_path / "out"), proxy=proxy.url)
    try:
        for _ in range(2):  # a retry in the same process fails the same way
            with pytest.raises(ExportError, match=r"run proj/r1: wandb\.init failed") as err:
                send(dest, _info(), tables, {})
            assert err.value.retryable and "in use" not in str(err.value)
    finally:
        proxy.close()
        wandb.teardown()
    assert b"POST http://wandb.example.invalid/graphql HTTP/1.1" in proxy.requests


def test_the_exporter_honours_http_proxy_from_the_environment(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tracklake export wandb --mode online` in a process whose environment names the
    proxy (wandb-core reads it when it starts); it gives up after --give-up-after."""
    _make_run(root)
    _offline_service_env(tmp_path, monkeypatch)
    proxy = ProbeProxy()
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "tracklake"), "export", "wandb", "--root",
             str(root), "--all", "--mode", "online", "--dir", str(tmp_path / "out"),
             "--give-up-after", "1"], capture_output=True, text=True, timeout=120,
            env={**os.environ, "HTTP_PROXY": proxy.url, "WANDB_SILENT": "true"})
    finally:
        proxy.close()
    assert done.returncode == 1, done.stderr
    assert "proj/r1" in done.stderr and "wandb.init failed" in done.stderr
    assert b"POST http://wandb.example.invalid/graphql HTTP/1.1" in proxy.requests


def test_artifacts_become_w_and_b_artifacts_referencing_the_stores_blobs(
        root: Path, tmp_path: Path) -> None:
    """A file and a directory become W&B artifacts (one version per name and step) whose
    files are the store's blobs, referenced, not copied; a blob missing from the store is
    left out and counted."""
    import base64
    import hashlib

    from tracklake.read import blob_path
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.bin").write_bytes(b"weights" * 100)
    (tmp_path / "ckpt" / "optim.bin").write_bytes(b"adam")
    with tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False) as run:
        run.log({"loss": 1.0}, step=5)
        run.log_artifact(tmp_path / "ckpt", name="ckpt", step=5)
        run.log_artifact(b"{}", name="eval results.json", media_type="application/json",
                         step=6)
        lost = run.log_artifact(b"gone", name="lost.txt", step=6)
    assert lost is not None
    blob_path(root, lost).unlink()
    dest = WandbDestination(dir=str(tmp_path / "out"))
    dest.start(ExportContext(root=root, ranks="0"))
    state = send(dest, _info(), _tables(root), {})
    assert state["targets"][0]["sessions"] == 1
    found, summary = {}, {}
    for record in wlog.records(_files(tmp_path)[0]):
        if record.WhichOneof("record_type") == "artifact" and record.artifact.type == "tracklake":
            art = record.artifact
            found[art.name] = (set(art.aliases), {e.path: (e.digest, e.local_path)
                                                  for e in art.manifest.contents})
        if record.WhichOneof("record_type") == "summary":
            summary.update((i.key or "/".join(i.nested_key), i.value_json)
                           for i in record.summary.update)

    def entry(content: bytes, digest: str) -> tuple[str, str]:
        return (base64.b64encode(hashlib.md5(content).digest()).decode(),
                str(blob_path(root, digest)))

    digests = {r["name"]: r["digest"] for r in _tables(root)["artifacts"].to_pylist()}
    assert found == {
        "ckpt": ({"latest", "step-5"}, {
            "ckpt/model.bin": entry(b"weights" * 100, digests["ckpt/model.bin"]),
            "ckpt/optim.bin": entry(b"adam", digests["ckpt/optim.bin"])}),
        "eval_results.json": ({"latest", "step-6"}, {
            "eval_results.json": entry(b"{}", digests["eval_results.json"])}),
    }
    assert summary.get("tracklake/missing_artifact_files") == "1"


#: `tracklake export wandb` with a bug injected into the code that builds what a session
#: sends (inside the SDK error boundary): a TypeError, as a mistake of ours would raise.
_BROKEN_EXPORT = """
import sys
from tracklake.exporters.wandb import destination

def broken(*args, **kwargs):
    raise TypeError("injected bug in building W&B rows")

destination.nest = broken
from tracklake._cli.main import main
sys.argv = ["tracklake", *sys.argv[1:]]
main()
"""


def test_a_bug_in_building_rows_stops_the_export_at_once_with_its_traceback(
        root: Path, tmp_path: Path) -> None:
    """Only the SDK's transport and service errors are retried: our own TypeError is not
    turned into a retryable error, and the export ends with exit code 1."""
    _make_run(root)
    done = subprocess.run(
        [sys.executable, "-c", _BROKEN_EXPORT, "export", "wandb", "--root", str(root), "--all",
         "--dir", str(tmp_path / "out"), "--give-up-after", "30"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_SILENT": "true"})
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().endswith("TypeError: injected bug in building W&B rows")
    assert "retry" not in done.stderr


@pytest.mark.parametrize("mode", ["all", "0", "1", "mean"])
def test_every_value_of_a_finished_run_arrives_whatever_the_batch_size(
        root: Path, tmp_path: Path, mode: str) -> None:
    """4 ranks, 150 steps, 2 keys, exported with 100 rows a commit: each commit is a W&B
    session, and the ranks are read one after another, so with --ranks all a later
    session would bring rank 1's step 0 after rank 0's step 149 (before: W&B's increasing
    steps made the exporter drop 3 of the 4 ranks but for the last commit)."""
    from tracklake.exporters import ExportOptions, Selection, export
    for rank in range(4):
        with tracklake.init(project=PROJECT, run_id="r1", root=root, rank=rank,
                            capture_identity=False) as run:
            for step in range(150):
                run.log({"loss": rank * 1000.0 + step, "acc": step / 150}, step=step)
    export(WandbDestination(dir=str(tmp_path / "out")), root=root,
           selection=Selection(runs=("r1",)), options=ExportOptions(ranks=mode, batch_rows=100),
           log=lambda _: None)
    points = wlog.points(wlog.history(_files(tmp_path)))
    if mode == "all":
        want = Counter((s, f"rank{r}/{k}", v) for r in range(4) for s in range(150)
                       for k, v in (("loss", r * 1000.0 + s), ("acc", s / 150)))
    elif mode == "mean":
        want = Counter((s, k, v) for s in range(150)
                       for k, v in (("loss", 1500.0 + s), ("acc", s / 150)))
    else:
        r = int(mode)
        want = Counter((s, k, v) for s in range(150)
                       for k, v in (("loss", r * 1000.0 + s), ("acc", s / 150)))
    assert sum(points.values()) == sum(want.values())
    assert points == want
