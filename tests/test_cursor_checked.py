"""An exporter's state is input from the store: a cursor past what the store holds (planted,
or restored from another store) would skip records never delivered, and let retention
take them for exported. The exporter refuses it naming the file, fsck reports it, and
retention does not trust it."""

from __future__ import annotations

import json
from pathlib import Path

from _tensorboard_log import scalar_steps
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._ops.fsck import fsck
from tracklake._ops.retention import Policy, make_plan


def _log(root: Path, steps: range) -> None:
    with tracklake.init(project="p", run_id="r", root=root) as run:
        for step in steps:
            run.log({"loss": float(step)}, step=step)


def _export(root: Path, logdir: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["export", "tensorboard", "--root", str(root),
                                       "--run", "r", "--logdir", str(logdir)])
    return result.exit_code, result.output


def _steps(logdir: Path) -> list[int]:
    return sorted(set(scalar_steps(logdir)))


def _exported_state(root: Path, logdir: Path) -> tuple[Path, dict[str, object]]:
    """50 steps of run p/r exported to TensorBoard: its state file, and what it holds."""
    _log(root, range(50))
    code, out = _export(root, logdir)
    assert code == 0, out
    [state] = root.glob("exports/*/project=p/run=r.json")
    return state, json.loads(state.read_text())


def test_a_cursor_planted_ahead_of_a_new_attempt_is_refused_reported_and_not_trusted(
        root: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    state, data = _exported_state(root, logdir)
    data["positions"]["0/2/metrics"] = 10**12  # ahead of an attempt not yet started
    state.write_text(json.dumps(data))
    _log(root, range(50, 100))  # attempt 2

    code, out = _export(root, logdir)
    assert code != 0
    assert str(state) in out and "0/2/metrics" in out and "up to seq 1000000000000" in out
    assert _steps(logdir) == list(range(50))  # nothing of attempt 2 was taken as sent

    report = fsck(root)
    assert any("exporter state past the end" in p.what and p.path == state
               for p in report.problems), [p.what for p in report.problems]

    plan = make_plan(root, Policy(keep_last=0), 2e9)
    assert not plan.actions
    [skip] = plan.skipped
    assert "0/2/metrics" in skip.reason and "not trusted" in skip.reason

    state.rename(tmp_path / "moved-away.json")  # what the error says to do
    code, out = _export(root, logdir)
    assert code == 0, out
    assert _steps(logdir) == list(range(100))


def test_a_cursor_past_the_end_of_an_existing_stream_is_refused(
        root: Path, tmp_path: Path) -> None:
    _log(root, range(10))
    assert _export(root, tmp_path / "tb")[0] == 0
    [state] = root.glob("exports/*/project=p/run=r.json")
    data = json.loads(state.read_text())
    data["positions"]["0/1/metrics"] += 1
    state.write_text(json.dumps(data))
    code, out = _export(root, tmp_path / "tb")
    assert code != 0 and "0/1/metrics" in out and str(state) in out


def test_an_exporter_state_that_is_a_fifo_is_refused_not_waited_on(
        root: Path, tmp_path: Path) -> None:
    import os

    _log(root, range(10))
    assert _export(root, tmp_path / "tb")[0] == 0
    [state] = root.glob("exports/*/project=p/run=r.json")
    state.unlink()
    os.mkfifo(state)
    code, out = _export(root, tmp_path / "tb")
    assert code != 0 and "FIFO" in out and str(state) in out
    assert any("FIFO" in p.what for p in fsck(root).problems)


def test_a_state_with_a_field_of_the_wrong_type_is_damaged_for_every_reader(
        root: Path, tmp_path: Path) -> None:
    """One parser checks a state file for the exporter, fsck and retention alike (before:
    each read its own fields; the exporter took the list as the rank mode "['all']",
    and fsck called the file clean)."""
    logdir = tmp_path / "tb"
    state, data = _exported_state(root, logdir)
    data["ranks"] = ["all"]  # not a rank mode tracklake writes
    state.write_text(json.dumps(data))

    code, out = _export(root, logdir)
    assert code != 0 and str(state) in out and "'ranks'" in out, out
    found = [p for p in fsck(root).problems if p.path == state]
    assert found and "damaged exporter state" in found[0].what and "'ranks'" in found[0].what
    plan = make_plan(root, Policy(keep_last=0), 2e9)
    assert not plan.actions
    [skip] = plan.skipped
    assert "unreadable" in skip.reason and "'ranks'" in skip.reason
