"""A run catalog names files by path, and its entries are checked by mtimes, which `stat`
takes through a link: a catalog planted in a restored backup (or left behind by a run
whose part was later swapped for a link or a FIFO, its mtimes set back) must not make a
question or the bundle builder read a file outside the store, nor wait on a FIFO."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from _crafted import catalogued_table, plant_catalog
from _settled import age

import tracklake
from tracklake._ops import bundle
from tracklake._ops.bundle import build_bundles
from tracklake._read import bundles
from tracklake._read.bundles import bundle_paths, read_bundle
from tracklake._read.catalog_shards import CATALOG_DIR

QUESTIONS = (
    "SELECT project, run, status FROM runs ORDER BY ALL",
    "SELECT project, run, count(*) AS n, max(value) AS top FROM metrics GROUP BY ALL "
    "ORDER BY ALL",
    "SELECT run, step, value FROM metrics WHERE run = 'r0' ORDER BY ALL",
)


def _store(root: Path, project: str, runs: int, scale: float, prefix: str = "r") -> None:
    for i in range(runs):
        with tracklake.init(project=project, run_id=f"{prefix}{i}", root=root,
                            capture_identity=False) as run:
            for step in range(5):
                run.log({"loss": scale * (step + i)}, step=step)
    tracklake.compact(root=root)
    age(root)
    tracklake.query(QUESTIONS[1], root=root)  # writes the catalog
    assert list((root / CATALOG_DIR).glob("*.catalog"))


def _catalog(root: Path) -> pa.Table:
    return catalogued_table(root)


def _put_catalog(root: Path, table: pa.Table) -> None:
    """`table` signed as the store's catalog, in new files (as a reader writes them)."""
    plant_catalog(root, table)


def _answers(root: Path) -> list[list[dict[str, object]]]:
    return [tracklake.query(sql, root=root).to_pylist() for sql in QUESTIONS]


def _without_catalog(root: Path) -> list[list[dict[str, object]]]:
    """The answers of a reader with no catalog (it writes one: put the planted back)."""
    planted = {p.name: p.read_bytes() for p in (root / CATALOG_DIR).glob("*.catalog")}
    shutil.rmtree(root / ".cache")
    answers = _answers(root)
    for path in (root / CATALOG_DIR).glob("*.catalog"):
        path.unlink()
    for name, data in planted.items():
        (root / CATALOG_DIR / name).write_bytes(data)
    return answers


def _part_of(root: Path, run: str) -> Path:
    [part] = root.glob(f"metrics/project=p/run={run}/rank=0/attempt=1/part-*.parquet")
    return part


def _swap(part: Path, make: str, outside: Path) -> None:
    """Put a link to a file outside the store, or a FIFO, in place of `part`, with the
    mtimes the catalog recorded: the link's target's and the part's directory's."""
    st, dir_st = part.stat(), part.parent.stat()
    part.unlink()
    if make == "fifo":
        os.mkfifo(part)
        os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(outside, ns=(st.st_atime_ns, st.st_mtime_ns))
        part.symlink_to(outside)
    os.utime(part.parent, ns=(dir_st.st_atime_ns, dir_st.st_mtime_ns))


def _with_a_project_linked_out(tmp_path: Path) -> Path:
    """A store of project `p`, its `project=evil` directories links to another store's,
    and that store's catalog rows planted in its catalog."""
    root, other = tmp_path / "store", tmp_path / "other"
    _store(root, "p", 3, 1.0)
    _store(other, "evil", 3, 1000.0)
    for kind in ("metrics", "runs"):
        (root / kind / "project=evil").symlink_to(other / kind / "project=evil")
    _put_catalog(root, pa.concat_tables([_catalog(root), _catalog(other)]))
    return root


@pytest.fixture(autouse=True)
def bounded_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that waits on a FIFO would end in 20 s (failing the test), not 30."""
    monkeypatch.setenv("TRACKLAKE_READ_TIMEOUT", "20")


def test_a_planted_catalog_naming_a_project_linked_out_of_the_store_reads_none_of_it(
        tmp_path: Path) -> None:
    """Before, the catalog's rows for `project=evil` passed (their mtimes are the linked
    files'), and every question answered the other store's rows as this one's."""
    root = _with_a_project_linked_out(tmp_path)
    expected = _without_catalog(root)
    assert {r["project"] for r in expected[1]} == {"p"}
    # the questions over the metrics read every catalogued part, and find the link
    assert _answers(root)[1:] == expected[1:]
    assert _answers(root) == expected
    assert set(_catalog(root).column("project").to_pylist()) == {"p"}  # written anew


def test_the_runs_of_a_planted_catalog_under_a_linked_project_are_not_listed(
        tmp_path: Path) -> None:
    """A question on the `runs` view alone reads no part, so the parts' check never
    came: `tracklake runs` listed the other store's runs from the planted rows."""
    root = _with_a_project_linked_out(tmp_path)
    listed = subprocess.run([sys.executable, "-m", "tracklake._cli.main", "runs",
                             "--format", "tsv", "--root", str(root)],
                            capture_output=True, text=True, check=True).stdout
    assert "r0" in listed and "evil" not in listed
    answer = tracklake.query("SELECT project, run FROM runs ORDER BY ALL", root=root)
    assert answer.to_pylist() == [{"project": "p", "run": f"r{i}"} for i in range(3)]
    assert set(_catalog(root).column("project").to_pylist()) == {"p"}  # written anew


@pytest.mark.parametrize("make", ["link", "fifo"])
def test_a_catalogued_part_swapped_for_a_link_or_fifo_is_neither_read_nor_waited_on(
        tmp_path: Path, make: str) -> None:
    """r0's part made a link to a copy of r2's outside the store, or a FIFO, with every
    mtime the catalog recorded kept: before, the link's rows were answered as r0's, and
    the FIFO failed every question over the metrics (pyarrow: "exists but its type is
    unknown")."""
    root = tmp_path / "store"
    _store(root, "p", 3, 1.0)
    outside = tmp_path / "outside.parquet"
    shutil.copy(_part_of(root, "r2"), outside)
    catalog = _catalog(root)
    _swap(_part_of(root, "r0"), make, outside)
    _put_catalog(root, catalog)  # the catalog as it was, as if written before the swap
    expected = _without_catalog(root)
    assert {r["run"] for r in expected[1]} == {"r1", "r2"}  # no reader takes r0's now
    _put_catalog(root, catalog)
    assert _answers(root) == expected


def test_the_bundle_builder_copies_no_part_a_planted_catalog_names_through_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run directories of the store's own project linked to another store's, and that
    store's rows planted: they pass the check of the project's directories, and before,
    the builder copied their parts into a bundle that every later question read."""
    monkeypatch.setattr(bundle, "BUNDLE_MIN_RUNS", 2)
    monkeypatch.setattr(bundles, "BUILD_MIN_RUNS", 10**9)
    root, other = tmp_path / "store", tmp_path / "other"
    _store(root, "p", 3, 1.0)
    _store(other, "p", 3, 1000.0, prefix="x")
    for kind in ("metrics", "runs"):
        for i in range(3):
            (root / kind / "project=p" / f"run=x{i}").symlink_to(
                other / kind / "project=p" / f"run=x{i}")
    _put_catalog(root, pa.concat_tables([_catalog(root), _catalog(other)]))
    report = build_bundles(root)
    [made] = bundle_paths(root)
    assert {p.split("/")[2] for p in read_bundle(made).paths} == {"run=r0", "run=r1", "run=r2"}
    assert len(report.damaged) == 3 and all("/run=x" in str(p) for p in report.damaged)
    answers = _answers(root)
    assert {r["run"] for r in answers[1]} == {"r0", "r1", "r2"}
    assert [r["n"] for r in answers[1]] == [5, 5, 5]
