"""What a launcher or a careless user hands `init` is refused by name when it cannot be
right: a rank variable that is not a whole number (two such processes would write as one
rank), a root that is a file or a FIFO; and an empty $TRACKLAKE_ROOT means unset for
readers and writers alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tracklake
from tracklake._format.naming import resolve_rank, world_size
from tracklake.read import list_runs


@pytest.mark.parametrize("var", ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])
@pytest.mark.parametrize("value", ["abc", "-1", " 3 ", "3.0", "2147483648", "٣"])
def test_a_rank_variable_that_is_not_a_rank_is_refused_by_name(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=rf"{var}='{value}' is not a rank"):
        resolve_rank(None, {var: value})


def test_good_and_unset_rank_variables_still_work() -> None:
    assert resolve_rank(None, {"RANK": "7"}) == 7
    assert resolve_rank(None, {"RANK": "", "SLURM_PROCID": "2"}) == 2
    assert resolve_rank(None, {}) == 0
    assert world_size({"WORLD_SIZE": "8"}) == 8 and world_size({}) == 1


@pytest.mark.parametrize("value", ["0", "x", "-4"])
def test_a_world_size_that_is_not_one_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="WORLD_SIZE="):
        world_size({"WORLD_SIZE": value})


def test_init_refuses_a_bad_rank_variable(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "abc")
    with pytest.raises(ValueError, match="RANK='abc'"):
        tracklake.init(project="p", root=tmp_path / "store", compact=False)
    assert not (tmp_path / "store" / "runs").exists()


def test_an_empty_tracklake_root_is_unset_for_readers_and_writers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACKLAKE_ROOT", "")
    with tracklake.init(project="p", run_id="r", compact=False) as run:
        run.log({"loss": 1.0}, step=0)
    assert (tmp_path / "tracklake-store").is_dir()
    assert [r.run for r in list_runs()] == ["r"]


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_root_that_is_not_a_directory_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "root"
    if kind == "file":
        root.write_text("x")
    else:
        os.mkfifo(root)
    with pytest.raises(NotADirectoryError, match=f"{root} is a .*not a directory"):
        tracklake.init(project="p", root=root, compact=False)


def test_run_ids_that_collapse_onto_another_runs_directory_are_refused(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`a b`, `a/b` and `a\nb` are all stored as run `a_b`: the first to write it keeps it,
    the others are refused by name instead of becoming its next attempt (and hiding its
    steps); the same id, given again or through $TRACKLAKE_RUN_ID, resumes it."""
    with tracklake.init(project="p", run_id="a b", root=root) as run:
        run.log({"loss": 1.0}, step=0)
    for other in ("a/b", "a\nb", "a_b"):
        with pytest.raises(tracklake.InvalidNameError,
                           match=r"run id .* is stored as 'a_b', which already holds run 'a b'"):
            tracklake.init(project="p", run_id=other, root=root)
    monkeypatch.setenv("TRACKLAKE_RUN_ID", "a:b")
    with pytest.raises(tracklake.InvalidNameError, match="'a:b'"):
        tracklake.init(project="p", root=root)
    monkeypatch.setenv("TRACKLAKE_RUN_ID", "a b")
    with tracklake.init(project="p", root=root) as again:
        assert (again.id, again.attempt) == ("a_b", 2)
    monkeypatch.delenv("TRACKLAKE_RUN_ID")
    with tracklake.init(project="p", run_id="a b", root=root, rank=1) as other_rank:
        assert other_rank.attempt == 1
    answer = tracklake.query("SELECT run, attempt, value FROM metrics", root=root)
    assert answer.to_pylist() == [{"run": "a_b", "attempt": 1, "value": 1.0}]


def test_a_project_whose_first_runs_recorded_no_name_is_checked_by_the_next(
        root: Path) -> None:
    """The project's name is read from the first run that recorded one: runs written
    before names were recorded (their attempt files without `project_given`) are passed
    over, wherever the directory lists them."""
    import json

    for run_id in ("a", "b", "c"):
        with tracklake.init(project="p", run_id=run_id, root=root, compact=False) as run:
            run.log({"loss": 1.0}, step=0)
    for run_id in ("a", "b"):  # as written before names were recorded
        [path] = (root / "runs" / "project=p" / f"run={run_id}").glob("rank=0/attempt=*.json")
        record = json.loads(path.read_text())
        del record["project_given"]
        path.write_text(json.dumps(record))
    with pytest.raises(tracklake.InvalidNameError, match=r"stored as 'p'.*project 'p'"):
        tracklake.init(project="p!", run_id="d", root=root, compact=False)
    assert sorted(p.name for p in (root / "runs" / "project=p").iterdir()) == [
        "run=a", "run=b", "run=c"]


def test_names_that_collapse_onto_another_projects_directory_are_refused(root: Path) -> None:
    """`pé ü`, `p!`, `ü p` and `p` are all stored as project `p`: the first to write it
    keeps it, the others are refused by name, so no run's attempts mix across projects."""
    with tracklake.init(project="p", run_id="shared", root=root) as run:
        run.log({"loss": 1.0}, step=0)
    for other in ("pé ü", "p!", "ü p"):
        with pytest.raises(tracklake.InvalidNameError, match=r"stored as 'p'.*project 'p'"):
            tracklake.init(project=other, run_id="shared", root=root)
    with tracklake.init(project="p", run_id="shared", root=root) as again:  # the same name
        assert again.attempt == 2
    with tracklake.init(project="my run", run_id="a", root=root) as spaced:
        spaced.log({"loss": 1.0}, step=0)
    with tracklake.init(project="my run", run_id="b", root=root) as spaced_again:
        assert spaced_again.project == "my_run"
    with pytest.raises(tracklake.InvalidNameError, match="'my run'"):
        tracklake.init(project="my_run", run_id="c", root=root)
    assert tracklake.query("SELECT DISTINCT run FROM runs WHERE project = 'p'",
                           root=root).to_pylist() == [{"run": "shared"}]
