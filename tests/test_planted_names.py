"""Directories and files planted in a store under names that are not UTF-8 (another
user's, or a restored backup's: POSIX names are bytes): no run of tracklake's has such a
name, so every listing passes over them, and no question, listing or compaction stops
on one. Before, any such directory under ``runs/`` or ``metrics/`` made every SQL
question, `tracklake runs` and `tracklake compact` stop with a UnicodeEncodeError."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _many_runs import PROJECTS, catalogued_store
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._read import catalog_shards, run_index

PLANTED = [b"runs/project=\xff/run=x", b"metrics/project=\xfe",
           b"runs/project=p/run=\xfd/rank=0", b"runs/project=p/run=p01/rank=\xfc",
           b"metrics/project=p/run=\xf8/rank=0/attempt=1",
           b"metrics/project=p/run=p01/rank=\xf9/attempt=1",
           b"metrics/project=p/run=p01/rank=0/attempt=\xf7"]


@pytest.fixture
def store(root: Path) -> Path:
    catalogued_store(root)
    for rel in PLANTED:
        os.makedirs(os.path.join(os.fsencode(root), rel))
    attempt = os.path.join(os.fsencode(root), b"runs/project=p/run=p01/rank=0")
    with open(os.path.join(attempt, b"attempt=\xfb.json"), "w") as f:
        f.write("{}")
    return root


def _fresh_process() -> None:
    catalog_shards._read_before.clear()
    run_index._streamed.clear()


@pytest.mark.parametrize("sql", [
    "SELECT count(*) AS n FROM runs", "SELECT count(DISTINCT run) AS n FROM run_attempts",
    "SELECT count(DISTINCT run) AS n FROM metrics",
    "SELECT count(DISTINCT run) AS n FROM metric_summaries"])
def test_every_question_passes_over_names_that_are_no_text(store: Path, sql: str) -> None:
    """Asked as a process's first question (the catalog's files one at a time, where
    the runs view alone is asked) and again (the catalog whole): the runs written."""
    _fresh_process()
    for _ in range(2):
        answer = tracklake.query(sql, root=store)
        assert answer.column("n").to_pylist() == [sum(PROJECTS.values())], sql


def test_listing_and_compacting_pass_over_names_that_are_no_text(store: Path) -> None:
    _fresh_process()
    runner = CliRunner()
    for args in (["runs", "--limit", "3"], ["runs", "--all", "--format", "tsv"],
                 ["compact"]):
        result = runner.invoke(main, [*args, "--root", str(store)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    listed = runner.invoke(main, ["runs", "--all", "--format", "tsv", "--root", str(store)])
    assert len(listed.output.strip().splitlines()) == 1 + sum(PROJECTS.values())
    assert "(11 older runs not shown" in runner.invoke(
        main, ["runs", "--limit", "3", "--root", str(store)]).output
