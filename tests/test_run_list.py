"""`tracklake runs` on a store with more runs than a screen: the newest shown, the rest
counted, and plain `tsv` / `json` renderings that scripts can parse."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._cli.run_list import DEFAULT_LIMIT


def _runs(root: Path, count: int) -> list[str]:
    """`count` finished runs, started one after the other; their ids, oldest first."""
    return _runs_named(root, [f"r{i:03d}" for i in range(count)], offset=0)


def _runs_named(root: Path, ids: list[str], offset: int) -> list[str]:
    """Finished runs `ids`, one after the other, the i-th logging `offset + i + 0.5` at
    step `offset + i`."""
    for i, run_id in enumerate(ids, start=offset):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False) as run:
            run.log({"critic/score/mean": i + 0.5}, step=i)
    return ids


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _table_runs(out: str, ids: list[str]) -> list[str]:
    return [i for i in ids if f" {i} " in out]


@pytest.fixture
def many(root: Path) -> list[str]:
    return _runs(root, DEFAULT_LIMIT + 3)


def test_table_shows_the_newest_runs_and_counts_the_hidden(root: Path,
                                                           many: list[str]) -> None:
    code, out = _cli("runs", "--root", str(root))
    assert code == 0
    assert _table_runs(out, many) == many[3:]
    assert "(3 older runs not shown; --limit N or --all lists them)" in out


def test_limit_and_all_choose_how_many(root: Path, many: list[str]) -> None:
    code, out = _cli("runs", "--root", str(root), "--limit", "2")
    assert code == 0 and _table_runs(out, many) == many[-2:]
    assert f"({len(many) - 2} older runs not shown" in out
    code, out = _cli("runs", "--root", str(root), "--all")
    assert code == 0 and _table_runs(out, many) == many and "not shown" not in out


def test_all_and_limit_together_is_a_usage_error(root: Path, many: list[str]) -> None:
    code, out = _cli("runs", "--root", str(root), "--all", "--limit", "3")
    assert code == 2 and "--all and --limit exclude each other" in out
    code, out = _cli("runs", "--root", str(root), "--limit", "0")
    assert code == 2


def test_tsv_lists_every_run_with_its_last_metric(root: Path, many: list[str]) -> None:
    code, out = _cli("runs", "--root", str(root), "--format", "tsv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out), delimiter="\t"))
    assert [r["run"] for r in rows] == many
    assert rows[0]["status"] == "finished" and rows[0]["last step"] == "0"
    assert rows[-1]["critic/score/mean"] == f"{len(many) - 1 + 0.5:.4g}"


def test_json_lines_carry_unformatted_values(root: Path, many: list[str]) -> None:
    code, out = _cli("runs", "--root", str(root), "--format", "json", "--limit", "1")
    assert code == 0
    (line,) = out.splitlines()
    row = json.loads(line)
    assert row["run"] == many[-1] and row["last_step"] == len(many) - 1
    assert row["metrics"] == {"critic/score/mean": len(many) - 1 + 0.5}


def test_an_empty_store_prints_a_header_or_nothing(root: Path) -> None:
    _runs(root, 1)
    code, out = _cli("runs", "--root", str(root), "--project", "other", "--format", "tsv")
    assert code == 0 and out.splitlines() == [
        "project\trun\tstatus\tattempts\tranks\tlast step\tstart\tduration"]
    code, out = _cli("runs", "--root", str(root), "--project", "other", "--format", "json")
    assert code == 0 and out == ""
    code, out = _cli("runs", "--root", str(root), "--project", "other")
    assert code == 0 and "no runs in" in out


def test_a_run_logging_only_on_a_higher_rank_shows_its_last_step(root: Path) -> None:
    with tracklake.init(project="p", run_id="multi", root=root, rank=0,
                        capture_identity=False):
        pass
    with tracklake.init(project="p", run_id="multi", root=root, rank=3,
                        capture_identity=False) as run:
        run.log({"critic/score/mean": 1.0}, step=7)
    code, out = _cli("runs", "--root", str(root), "--format", "json")
    row = json.loads(out)
    assert code == 0 and row["ranks"] == 2 and row["last_step"] == 7
    assert row["metrics"] == {"critic/score/mean": 1.0}


def test_tsv_keeps_one_line_per_run_when_a_key_holds_a_tab(root: Path) -> None:
    with tracklake.init(project="p", run_id="odd", root=root, capture_identity=False) as run:
        run.log({"critic/a\tb": 1.0, "critic/c\nd": 2.0}, step=0)
    code, out = _cli("runs", "--root", str(root), "--format", "tsv", "--metric", "critic/*")
    assert code == 0
    header, row = out.splitlines()
    assert header.split("\t")[-2:] == ["critic/a b", "critic/c d"]
    assert row.split("\t")[-2:] == ["1", "2"]


def test_a_process_listing_again_asks_the_runs_view_and_sees_the_runs_added(
        root: Path, many: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first listing of a process reads the newest runs alone (`newest_runs`); the
    next ones ask the runs view, whose catalog the process keeps: the same table, and
    the runs written in between."""
    from tracklake._cli import run_list

    asked: list[Path] = []
    newest = run_list.newest_runs
    monkeypatch.setattr(run_list, "newest_runs",
                        lambda at, *args: asked.append(at) or newest(at, *args))
    code, first = _cli("runs", "--root", str(root))
    assert code == 0 and len(asked) == 1
    code, again = _cli("runs", "--root", str(root))
    assert code == 0 and len(asked) == 1  # not read alone again
    assert again == first
    added = _runs_named(root, ["s0", "s1"], offset=len(many))
    code, later = _cli("runs", "--root", str(root))
    assert code == 0 and len(asked) == 1
    assert _table_runs(later, [*many, *added]) == [*many, *added][5:]
    assert "(5 older runs not shown" in later
    assert " s1 " in later and f"{len(many) + 1.5:.4g}" in later  # its last value
