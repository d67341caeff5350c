"""`tracklake export` on the command line: destinations as subcommands, console output in
verl's format, status, and the errors a user meets first."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def store(root: Path) -> Path:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step in range(3):
            run.log({"critic/score/mean": step / 2, "actor/pg_loss": -1.0}, step=step)
        run.alert("diverging", "pg_loss is -1", level="warning", step=2)
    return root


def test_console_prints_each_step_in_verls_format(store: Path) -> None:
    code, out = _invoke("export", "console", "--root", str(store), "--run", "r",
                        "--keys", "critic/*")
    assert code == 0
    lines = out.splitlines()
    assert "step:0 - critic/score/mean:0" in lines
    assert "step:2 - critic/score/mean:1" in lines
    assert "[warning] diverging: pg_loss is -1" in lines
    assert not any("actor/pg_loss" in line for line in lines)


def test_the_console_prints_the_run_every_time_and_keeps_nothing_in_the_store(
        store: Path) -> None:
    """The console is for looking: a second `export console` (or `--follow`) shows the run
    again from its start (before: nothing, its cursor kept like a destination's)."""
    for follow in ((), ("--follow", "--poll-interval", "0.1"), ()):
        code, out = _invoke("export", "console", "--root", str(store), "--run", "r",
                            "--keys", "critic/*", *follow)
        assert code == 0, out
        assert "step:0 - critic/score/mean:0" in out.splitlines(), out
    assert not (store / "exports").exists()  # nothing of the console's kept in the store


def test_status_shows_each_destination_and_how_far_behind_it_is(store: Path,
                                                                 tmp_path: Path) -> None:
    code, _ = _invoke("export", "tensorboard", "--root", str(store), "--all",
                      "--logdir", str(tmp_path / "tb"))
    assert code == 0
    with tracklake.init(project="p", run_id="r", root=store, capture_identity=False) as run:
        run.log({"critic/score/mean": 9.0}, step=3)  # a new attempt: one record behind
    code, out = _invoke("export", "status", "--root", str(store))
    assert code == 0
    assert "tensorboard:" in out and "p/r" in out
    row = next(line for line in out.splitlines() if "p/r" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[2:4] == ["7", "1"]  # exported (6 metrics + the alert), behind


def test_export_without_a_selection_is_a_usage_error(store: Path) -> None:
    code, out = _invoke("export", "console", "--root", str(store))
    assert code == 2
    assert "--project" in out and "--all" in out


def test_an_unknown_destination_lists_the_installed_ones(store: Path) -> None:
    code, out = _invoke("export", "nowhere", "--root", str(store), "--all")
    assert code == 2
    assert "No such command 'nowhere'" in out


def test_a_failed_run_exits_1_and_names_the_error(store: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")
    code, out = _invoke("export", "tensorboard", "--root", str(store), "--all",
                        "--logdir", str(blocker), "--give-up-after", "0")
    assert code == 1
    assert str(blocker) in out


@pytest.mark.parametrize("selection", [["--run", "TYPO"], ["--project", "nope"],
                                       ["--run", "r", "--run", "TYPO"], ["--tag", "none"],
                                       ["--since", "2999-01-01"]])
def test_a_selection_that_matches_nothing_is_an_error(store: Path, tmp_path: Path,
                                                       selection: list[str]) -> None:
    """As in `show`: a typo in a run id is not "0 records from 0 runs" and exit code 0."""
    result = CliRunner().invoke(main, ["export", "tensorboard", "--root", str(store),
                                       *selection, "--logdir", str(tmp_path / "tb")])
    assert result.exit_code == 1, result.output
    assert "no run" in result.output
    assert "TYPO" in result.output or "matches" in result.output
    assert not (tmp_path / "tb").exists()  # nothing was exported, not even the run that exists


@pytest.mark.parametrize("name", ["mlflow", "wandb", "swanlab"])
def test_a_destination_whose_sdk_is_missing_is_marked_unavailable(
        name: str, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the extra installed, `export --help` says so and `export NAME` tells what to
    install, with exit code 1 and no traceback."""
    import sys

    monkeypatch.setitem(sys.modules, name, None)
    package = f"tracklake.exporters.{name}"
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, module)
    listed = CliRunner().invoke(main, ["export", "--help"])
    assert listed.exit_code == 0
    line = next(line for line in listed.output.splitlines() if line.strip().startswith(name))
    assert "(unavailable)" in line
    result = CliRunner().invoke(main, ["export", name, "--root", str(store), "--all"])
    assert result.exit_code == 1
    assert f"pip install 'tracklake[{name}]'" in result.output
    assert "Traceback" not in result.output
