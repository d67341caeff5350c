"""`init()` says, in one line each, when the identity it resolved may not be what the user
meant, and the CLI finds a run by the names the user gave (before: all silent, and
`show "my run 1"` found nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main


def _init(root: Path, **kwargs: object) -> None:
    with tracklake.init(root=root, capture_identity=False, **kwargs) as run:  # type: ignore[arg-type]
        run.log({"loss": 1.0}, step=0)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("TRACKLAKE_RUN_ID", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "JOB_ID",
                "MLP_TASK_ID"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_world_size_without_master_addr_says_each_rank_makes_its_own_run(
        root: Path, clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "1")
    _init(root, project="p")
    err = capfd.readouterr().err
    assert "WORLD_SIZE=2 but no MASTER_ADDR" in err and "TRACKLAKE_RUN_ID" in err
    clean_env.setenv("MASTER_ADDR", "10.0.0.1")
    _init(root, project="p")
    assert "MASTER_ADDR" not in capfd.readouterr().err  # the job's ranks agree: nothing said


def test_a_stale_tracklake_run_id_says_it_continues_an_old_run(
        root: Path, clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("TRACKLAKE_RUN_ID", "exp-1")
    _init(root, project="p")
    assert "TRACKLAKE_RUN_ID" not in capfd.readouterr().err  # a new run: as asked
    _init(root, project="p")
    err = capfd.readouterr().err
    assert "$TRACKLAKE_RUN_ID=exp-1 names an existing run: this is attempt 2 of p/exp-1" in err
    assert "unset TRACKLAKE_RUN_ID" in err


def test_rewritten_names_are_said_and_the_cli_finds_the_run_by_the_given_ones(
        root: Path, clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    _init(root, project="a/b", run_id="my run 1")
    err = capfd.readouterr().err
    assert "project 'a/b' is stored as 'a_b'" in err
    assert "run id 'my run 1' is stored as 'my_run_1'" in err
    assert tracklake.find_run(root, "my run 1").run == "my_run_1"
    assert tracklake.find_run(root, "my run 1", "a/b").project == "a_b"
    result = CliRunner().invoke(main, ["show", "my run 1", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "my_run_1" in result.output
    _init(root, project="p", run_id="plain")
    assert "stored as" not in capfd.readouterr().err  # nothing rewritten: nothing said


@pytest.mark.parametrize("command", [
    ["export", "console", "--run", "my run 1", "--project", "a/b"],
    ["pack", "--run", "my run 1", "--project", "a/b", "-o", "{tmp}/out.tlpack"],
    ["compact", "--run", "my run 1", "--project", "a/b"],
    ["runs", "--project", "a/b", "--format", "tsv"],
])
def test_options_that_select_runs_take_the_names_given_at_init(
        root: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch, command: list[str]) -> None:
    """Before: `export console --run "my run 1"` said "no run my run 1" for the run that
    `init(run_id="my run 1")` made."""
    _init(root, project="a/b", run_id="my run 1")
    args = [a.replace("{tmp}", str(tmp_path)) for a in command] + ["--root", str(root)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "no run" not in result.output
    if command[0] in ("export", "runs"):
        assert "my_run_1" in result.output
    if command[0] == "pack":
        assert (tmp_path / "out.tlpack").stat().st_size > 0
    if command[0] == "compact":
        assert "compacted 0 segments" not in result.output and "compacted " in result.output
