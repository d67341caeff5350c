"""The SwanLab destination, offline, read back from the ``.swanlab`` run files it makes with
SwanLab's own reader and record types: every metric once at its step, texts and config;
a second export lands in the same SwanLab run and repeats nothing; sessions after the
last commit are set aside; clear errors for bad input and a missing SwanLab."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from _optional import optional
from _records import records_by_kind, run_info, send
from click.testing import CliRunner

import tracklake
from tracklake import ExportError

optional("swanlab")

import _swanlab_log as slog

from tracklake.exporters import Destination, RunInfo, Selection, export
from tracklake.exporters.swanlab import session as sessions
from tracklake.exporters.swanlab.destination import SwanlabDestination, swanlab_run_id

PROJECT = "proj"
CONFIG = {"lr": 0.001, "model": {"layers": 4, "name": "gpt"}, "flag": True}
SPECIAL = [math.nan, math.inf, -math.inf, 0.5, -0.0]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No SwanLab credentials or settings from the developer's home or directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-home"))


# -- reading SwanLab's run files ------------------------------------------------------------


def _sessions(logdir: Path, run_id: str = "r1") -> list[Path]:
    """The committed-looking session directories of a run, in order."""
    wid = swanlab_run_id(_info(run_id))
    return sorted(logdir.glob(f"run-{wid}-tracklake[0-9]*"))


def _texts(directories: list[Path]) -> dict[str, list[tuple[int, str, str]]]:
    """Per key: (step, content, caption) of every text, contents read from the session's
    media directory."""
    found: dict[str, list[tuple[int, str, str]]] = {}
    for d in directories:
        for r in slog.records(slog.run_file(d)):
            if r.WhichOneof("record_type") == "media":
                for item in r.media.value.items:
                    content = (d / "media" / "text" / item.filename).read_text()
                    found.setdefault(r.media.key, []).append(
                        (r.media.step, content, item.caption))
    return found


def _finish_states(directory: Path) -> list[str]:
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    return [RunState.Name(r.finish.state) for r in slog.records(slog.run_file(directory))
            if r.WhichOneof("record_type") == "finish"]


def _expected(metrics: pa.Table) -> Counter[tuple[int, str, object]]:
    return Counter((s, k, slog.same(v)) for s, k, v in zip(
        metrics.column("step").to_pylist(), metrics.column("key").to_pylist(),
        metrics.column("value").to_pylist(), strict=True))


# -- the store side ---------------------------------------------------------------------------


def _log_steps(run: Any, steps: range) -> None:
    for step in steps:
        run.log({"loss": 1.0 / (step + 1), "special": SPECIAL[step % len(SPECIAL)]}, step=step)
        if step % 10 == 0:
            run.log_generations([{"input": "2+2?", "output": f"4 at {step}", "score": 1.0},
                                 ("q2", "a2", None)], step=step, key="val")
            with run.span("rollout", turn=step), run.span("generate"):
                pass


def _make_run(root: Path, run_id: str = "r1", steps: int = 20) -> None:
    with tracklake.init(project=PROJECT, run_id=run_id, root=root, capture_identity=False,
                        config=CONFIG) as run:
        _log_steps(run, range(steps))
        run.log_text("notes", "hello *markdown*")
        run.alert("loss spike", "loss went up", level="error", step=5)


def _info(run_id: str = "r1", **changes: Any) -> RunInfo:
    return run_info(PROJECT, run_id, **changes)


@pytest.fixture
def tables(root: Path) -> dict[str, pa.Table]:
    _make_run(root)
    return records_by_kind(root, PROJECT, "r1")


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "swanlog"


@pytest.fixture
def dest(logdir: Path) -> SwanlabDestination:
    return SwanlabDestination(logdir=str(logdir))


# -- tests ------------------------------------------------------------------------------------


def test_it_is_a_destination_described_without_secrets(dest: SwanlabDestination,
                                                        logdir: Path) -> None:
    assert isinstance(dest, Destination)
    assert dest.describe() == f"swanlab:offline:{logdir}"
    assert [o.name for o in SwanlabDestination.cli_options()] == [
        "mode", "logdir", "swanlab_project", "workspace"]


def test_every_metric_arrives_once_at_its_step_with_config_texts_and_status(
        dest: SwanlabDestination, logdir: Path, tables: dict[str, pa.Table]) -> None:
    state = send(dest, _info(), tables, {})
    dest.finish_run(_info())
    wid = swanlab_run_id(_info())
    assert state["targets"] == [{"id": wid, "attempt": None, "sessions": 1, "last_step": 19}]
    assert state["last_steps"][wid]["loss"] == 19
    commit, finish = _sessions(logdir)  # the commit's session and finish_run()'s
    assert slog.points([commit]) == _expected(tables["metrics"])
    steps = [r.scalar.step for r in slog.records(slog.run_file(commit))
             if r.WhichOneof("record_type") == "scalar" and r.scalar.key == "loss"]
    assert steps == list(range(20))

    start = next(slog.records(slog.run_file(commit))).start
    assert start.id == swanlab_run_id(_info()) and start.project == PROJECT
    assert start.name == "a name" and start.group == "r1" and list(start.tags) == ["t1"]
    config = yaml.safe_load((commit / "files" / "config.yaml").read_text())
    assert config["model"]["value"] == {"layers": 4, "name": "gpt"}
    assert config["lr"]["value"] == 0.001

    texts = _texts([commit])
    generations = [t for t in texts["generations/val"] if t[0] == 10]
    assert len(generations) == 2 and "4 at 10" in generations[0][1]
    assert generations[0][2].startswith("sample 0 · score 1.0")
    assert [t[1] for t in texts["texts/notes"]] == ["hello *markdown*"]
    (alert,) = texts["alerts"]
    assert alert[0] == 5 and "loss went up" in alert[1] and alert[2] == "ERROR · loss spike"
    assert sorted(t[2].split(" · ")[0] for t in texts["traces"]) == [
        "generate", "generate", "rollout", "rollout"]
    status = _texts([finish])["tracklake/status"]
    assert "**finished**" in status[0][1]
    assert _finish_states(finish) == ["RUN_STATE_FINISHED"]


def test_out_of_order_steps_within_a_batch_arrive_in_order(
        dest: SwanlabDestination, logdir: Path, tables: dict[str, pa.Table]) -> None:
    metrics = tables["metrics"]
    shuffled = metrics.take(pa.array(list(reversed(range(metrics.num_rows)))))
    send(dest, _info(), {"metrics": shuffled}, {})
    (session,) = _sessions(logdir)
    steps = [r.scalar.step for r in slog.records(slog.run_file(session))
             if r.WhichOneof("record_type") == "scalar"]
    assert steps == sorted(steps) and slog.points([session]) == _expected(metrics)


def test_a_second_export_after_more_steps_lands_in_the_same_run_and_repeats_nothing(
        root: Path, logdir: Path) -> None:
    """Through the export loop: a live run exported, grown, finished and exported again."""
    selection = Selection(all_runs=True)
    run = tracklake.init(project=PROJECT, run_id="r1", root=root, capture_identity=False,
                         config=CONFIG)
    _log_steps(run, range(10))
    run.flush()
    export(SwanlabDestination(logdir=str(logdir)), root=root, selection=selection,
           log=lambda _: None)
    _log_steps(run, range(10, 25))
    run.log_config({"extra": {"beta": 0.5}})
    run.finish()
    export(SwanlabDestination(logdir=str(logdir)), root=root, selection=selection,
           log=lambda _: None)
    summary = export(SwanlabDestination(logdir=str(logdir)), root=root, selection=selection,
                     log=lambda _: None)
    assert summary.records == 0  # a third export finds nothing new
    directories = _sessions(logdir)
    starts = {next(slog.records(slog.run_file(d))).start.id for d in directories}
    assert starts == {swanlab_run_id(_info())}
    expected = _expected(records_by_kind(root, PROJECT, "r1")["metrics"])
    assert slog.points(directories) == expected and sum(expected.values()) == 50
    generations = Counter(step for step, _, _ in _texts(directories)["generations/val"])
    assert generations == {0: 2, 10: 2, 20: 2}
    config = yaml.safe_load((directories[-1] / "files" / "config.yaml").read_text())
    assert config["extra"]["value"] == {"beta": 0.5} and config["lr"]["value"] == 0.001


def test_values_at_or_before_a_keys_last_step_are_dropped_and_texts_move_on(
        dest: SwanlabDestination, logdir: Path, tables: dict[str, pa.Table]) -> None:
    """A later attempt restarting at an earlier step: SwanLab would drop those values, so
    they are counted; a late text goes to its key's next step, saying where it belongs."""
    metrics = tables["metrics"]
    state = send(dest, _info(), {"metrics": metrics, "texts": tables["texts"]}, {})
    state = send(dest, _info(), {"metrics": metrics.slice(0, 4),
                                  "texts": tables["texts"]}, state)
    assert state["dropped_values"] == 4 and state["targets"][0]["sessions"] == 2
    assert slog.points(_sessions(logdir)) == _expected(metrics)
    notes = _texts(_sessions(logdir))["texts/notes"]
    assert [(s, c) for s, c, _ in notes] == [(19, "hello *markdown*"), (20, "hello *markdown*")]
    assert notes[1][2].endswith("logged at step 19")


def test_sessions_after_the_last_commit_are_set_aside_and_sent_again_once(
        dest: SwanlabDestination, logdir: Path, tables: dict[str, pa.Table]) -> None:
    """An exporter killed after a session finished but before the loop saved its cursor:
    the restarted exporter sets that session aside and sends its records again once."""
    metrics = tables["metrics"]
    half = metrics.num_rows // 2
    state = send(dest, _info(), {"metrics": metrics.slice(0, half)}, {})
    send(dest, _info(), {"metrics": metrics.slice(half)}, state)  # its state is lost
    assert len(_sessions(logdir)) == 2
    fresh = SwanlabDestination(logdir=str(logdir))  # the restarted exporter process
    send(fresh, _info(), {"metrics": metrics.slice(half)}, state)
    assert len(_sessions(logdir)) == 2
    assert len(list(logdir.glob("uncommitted-run-*"))) == 1
    assert slog.points(_sessions(logdir)) == _expected(metrics)


def test_a_session_that_fails_is_retryable_set_aside_and_resent_once(
        dest: SwanlabDestination, logdir: Path, tables: dict[str, pa.Table],
        monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = tables["metrics"]

    def broken(directory: Path) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(sessions, "_fsync_tree", broken)
        with pytest.raises(ExportError, match="Input/output error") as err:
            send(dest, _info(), {"metrics": metrics}, {})
    assert err.value.retryable and _sessions(logdir) == []
    state = send(dest, _info(), {"metrics": metrics}, {})
    assert state["targets"][0]["sessions"] == 1
    assert slog.points(_sessions(logdir)) == _expected(metrics)


def test_an_empty_state_sets_aside_every_earlier_session(
        dest: SwanlabDestination, logdir: Path, tables: dict[str, pa.Table]) -> None:
    send(dest, _info(), tables, {})
    send(dest, _info(), tables, {})  # the export state was lost: export from the start
    assert len(_sessions(logdir)) == 1
    assert slog.points(_sessions(logdir)) == _expected(tables["metrics"])


def test_a_state_this_exporter_did_not_write_is_refused(dest: SwanlabDestination) -> None:
    with pytest.raises(ExportError, match="not one this exporter wrote") as err:
        dest.open_run(_info(), {"id": "other", "sessions": 1})
    assert not err.value.retryable
    with pytest.raises(ExportError, match="not one this exporter wrote"):
        dest.open_run(_info(), {"id": swanlab_run_id(_info()), "last_steps": {"a": "x"}})


def test_names_swanlab_refuses_are_clear_errors(logdir: Path) -> None:
    with pytest.raises(ExportError, match="--swanlab-project 'a b'"):
        SwanlabDestination(logdir=str(logdir), swanlab_project="a b")
    with pytest.raises(ExportError, match="not a SwanLab project name") as err:
        SwanlabDestination(logdir=str(logdir)).open_run(run_info("x" * 101), {})
    assert not err.value.retryable
    with pytest.raises(ValueError, match="mode must be one of cloud, offline, local"):
        SwanlabDestination(mode="online")


def test_cloud_mode_without_an_api_key_says_how_to_give_one(logdir: Path) -> None:
    with pytest.raises(ExportError, match="SWANLAB_API_KEY") as err:
        SwanlabDestination(mode="cloud", logdir=str(logdir))
    assert not err.value.retryable


def test_a_login_swanlab_refuses_is_not_retried_and_names_what_to_check(
        logdir: Path, tables: dict[str, pa.Table], monkeypatch: pytest.MonkeyPatch) -> None:
    """SwanLab reports a wrong key and an unreachable server with one exception; the
    login itself is replaced by that fault (the real one retries for about 15 s)."""
    from swanlab.exceptions import AuthenticationError

    def refuse(**_: Any) -> None:
        raise AuthenticationError("Failed to initialize the SwanLab client.")

    monkeypatch.setenv("SWANLAB_API_KEY", "not-a-key")
    dest = SwanlabDestination(mode="cloud", logdir=str(logdir))
    monkeypatch.setattr(sessions.swanlab, "init", refuse)
    with pytest.raises(ExportError, match="SWANLAB_API_KEY, SWANLAB_API_HOST") as err:
        send(dest, _info(), {"metrics": tables["metrics"]}, {})
    assert not err.value.retryable


def test_local_mode_without_swanlabs_dashboard_package_says_what_to_install(
        logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "swanboard", None)  # find_spec: not installed
    with pytest.raises(ExportError, match=r"pip install 'swanlab\[dashboard\]'"):
        SwanlabDestination(mode="local", logdir=str(logdir))


@pytest.mark.parametrize("installed", [None, "0.9.4", "0.11.0"])
def test_a_missing_or_unsupported_swanlab_is_a_clear_error(
        installed: str | None, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import PackageNotFoundError

    def version(name: str) -> str:
        if installed is None:
            raise PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(sessions, "version", version)
    expected = "not installed" if installed is None else f"SwanLab {installed} is installed"
    with pytest.raises(ExportError, match=expected) as err:
        SwanlabDestination(logdir=str(logdir))
    assert "pip install 'tracklake[swanlab]'" in str(err.value)


def test_the_cli_marks_the_exporter_unavailable_when_swanlab_cannot_be_imported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._cli.main import main

    monkeypatch.setitem(sys.modules, "swanlab", None)
    monkeypatch.delitem(sys.modules, "tracklake.exporters.swanlab.destination")
    result = CliRunner().invoke(main, ["export", "swanlab", "--all"])
    assert result.exit_code == 1
    assert "pip install 'tracklake[swanlab]'" in result.output


def test_a_resumed_attempt_that_logs_steps_again_gets_a_swanlab_run_of_its_own(
        dest: SwanlabDestination, root: Path, logdir: Path) -> None:
    """Attempt 1 logs steps 0..29 and dies; attempt 2 logs 20..39 again. SwanLab keeps
    one value per key and step: the base run keeps attempt 1, ``<id>-a2`` gets all of
    attempt 2 (one export or two, the same), and nothing is dropped."""
    for offset, steps in ((0.0, range(30)), (100.0, range(20, 40))):
        with tracklake.init(project=PROJECT, run_id="r1", root=root,
                            capture_identity=False) as run:
            for step in steps:
                run.log({"loss": offset + step}, step=step)
    state = send(dest, _info(attempts=2), records_by_kind(root, PROJECT, "r1"), {})
    base = swanlab_run_id(_info())
    assert [(t["id"], t["attempt"]) for t in state["targets"]] == [
        (base, None), (f"{base}-a2", 2)]
    assert state["dropped_values"] == 0
    assert slog.points(_sessions(logdir)) == Counter(
        (s, "loss", float(s)) for s in range(30))
    branch = sorted(logdir.glob(f"run-{base}-a2-tracklake[0-9]*"))
    assert slog.points(branch) == Counter((s, "loss", 100.0 + s) for s in range(20, 40))
    start = next(slog.records(slog.run_file(branch[0]))).start
    assert start.id == f"{base}-a2" and start.name == "a name (attempt 2)"
    assert "attempt-2" in start.tags


#: `tracklake export swanlab` with a bug injected into the code that builds what a session
#: logs (inside the SDK error boundary): a TypeError, as a mistake of ours would raise.
_BROKEN_EXPORT = """
import sys
from tracklake.exporters.swanlab import destination

def broken(*args, **kwargs):
    raise TypeError("injected bug in building SwanLab rows")

destination._value = broken
from tracklake._cli.main import main
sys.argv = ["tracklake", *sys.argv[1:]]
main()
"""


def test_a_bug_in_building_rows_stops_the_export_at_once_with_its_traceback(
        root: Path, logdir: Path) -> None:
    """Only the SDK's transport and service errors are retried: our own TypeError is not
    turned into a retryable error, and the export ends with exit code 1."""
    _make_run(root)
    done = subprocess.run(
        [sys.executable, "-c", _BROKEN_EXPORT, "export", "swanlab", "--root", str(root),
         "--all", "--logdir", str(logdir), "--give-up-after", "30"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().endswith("TypeError: injected bug in building SwanLab rows")
    assert "retry" not in done.stderr
