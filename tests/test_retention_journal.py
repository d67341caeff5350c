"""A journal in the trash is input from outside (a restored backup or another user can
plant one): one that names a path outside what its action moves, or whose fields do not
fit, is reported and never acted on, and never stops later applies; a run directory
reached through a link is never moved out of another store."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main


def _runs(root: Path, *names: str) -> None:
    for name in names:
        with tracklake.init(project="p", run_id=name, root=root, compact=False) as run:
            run.log({"loss": 1.0}, step=0)


def _plant(root: Path, action_id: str, journal: object) -> Path:
    folder = root / "trash" / action_id
    folder.mkdir(parents=True)
    (folder / "action.json").write_text(json.dumps(journal))
    return folder


def _retain(root: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["retain", "--root", str(root), *args, "--apply"])
    assert result.exit_code == 0, result.output
    return result.output


def _action(run: str) -> dict[str, object]:
    return {"verb": "drop", "project": "p", "run": run, "kinds": ["metrics"], "bytes": 1,
            "rule": "keep-last", "why": "planted", "forced": False}


def test_a_journal_naming_a_path_outside_the_store_is_never_acted_on(
        tmp_path: Path) -> None:
    root, victim = tmp_path / "store", tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    _runs(root, "a", "b")
    folder = _plant(root, "20260101T000000-deadbeef", {
        "id": "20260101T000000-deadbeef", "action": _action("a"),
        "moves": ["../victim", "metrics/project=p/run=a"], "blob_bytes": 0, "every": 0})
    _retain(root, "--keep-last", "1")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert (folder / "action.json").exists()  # left for a person to look at
    # the planted journal did not move run a's metrics; the policy's own action ran
    left = tracklake.query("SELECT DISTINCT run FROM metrics ORDER BY run", root=root)
    assert left.column(0).to_pylist() == ["b"]


def test_a_journal_whose_fields_do_not_fit_does_not_wedge_later_applies(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    _runs(root, "a", "b")
    _plant(root, "x", {"id": 5, "action": "?", "moves": "all"})
    (root / "trash" / "y").mkdir()
    (root / "trash" / "y" / "action.json").write_bytes(b"\xff" * 10)
    for _ in range(2):  # each apply gets through, and says what it left alone
        _retain(root, "--keep-last", "1")
    assert sorted(p.name for p in (root / "trash").iterdir()) == ["x", "y"]
    left = tracklake.query("SELECT DISTINCT run FROM metrics ORDER BY run", root=root)
    assert left.column(0).to_pylist() == ["b"]


def test_a_run_directory_linked_into_another_store_is_not_moved_out_of_it(
        tmp_path: Path) -> None:
    root, other = tmp_path / "store", tmp_path / "other"
    _runs(root, "a", "b")
    _runs(other, "c")
    outside = other / "metrics" / "project=p" / "run=c"
    # plant a link to the other store's project as a project directory of this store
    os.symlink(other / "metrics" / "project=p", root / "metrics" / "project=q")
    journal = {"id": "z", "action": {**_action("c"), "project": "q"},
               "moves": ["metrics/project=q/run=c"], "blob_bytes": 0, "every": 0}
    _plant(root, "z", journal)
    _retain(root, "--keep-last", "5")
    assert outside.is_dir() and any(outside.rglob("*.arrows"))
