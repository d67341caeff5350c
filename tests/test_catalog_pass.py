"""A bundle builder (the deriver's, a reader's, `tracklake compact`'s) brings the run
catalog up to date a file at a time: it never loads the whole catalog, reads each run
of one file only, rewrites only the files whose runs changed, trusts no file that holds
another file's run, and gives bundling each settled run's parts with the mtimes its
entry watched."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _crafted import catalog_path, catalogued_table, signed_catalog
from _settled import age

import tracklake
from tracklake._ops import bundle, catalog_pass
from tracklake._ops.bundle import build_bundles
from tracklake._ops.catalog_pass import settled_runs
from tracklake._ops.compact import compact_streams
from tracklake._read import bundles, catalog_shards
from tracklake._read.catalog_shards import CATALOG_DIR, shard_of
from tracklake._read.decoded import CACHE_FILE
from tracklake._read.listing import list_streams

#: Run ids of odd but valid shapes, in two projects.
RUNS = [("p", f"r{i}") for i in range(12)] + [("q", "a.b+c@d-1"), ("q", "0007"),
                                               ("q", "x_y")]
QUESTIONS = (
    "SELECT project, run, status FROM runs ORDER BY ALL",
    "SELECT project, run, key, count, last_value FROM metric_summaries ORDER BY ALL",
    "SELECT project, run, count(*) AS n, sum(value) AS total FROM metrics "
    "GROUP BY ALL ORDER BY ALL",
)


@pytest.fixture
def few(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bundle groups of a few runs, and no builder started by readers."""
    monkeypatch.setattr(bundle, "BUNDLE_MIN_RUNS", 3)
    monkeypatch.setattr(bundles, "BUILD_MIN_RUNS", 10**9)


def _store(root: Path) -> None:
    for i, (project, run_id) in enumerate(RUNS):
        with tracklake.init(project=project, run_id=run_id, root=root, compact=False,
                            capture_identity=False, system_metrics=False) as run:
            for step in range(2 + i):
                run.log({"loss": float(step * i), "acc": step / 10}, step=step)
    compact_streams(root, list_streams(root))  # no bundle yet
    age(root)


def _answers(root: Path) -> list[list[dict[str, Any]]]:
    return [tracklake.query(sql, root=root).to_pylist() for sql in QUESTIONS]


def _from_files(root: Path, tmp_path: Path) -> list[list[dict[str, Any]]]:
    copy = tmp_path / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".cache"))
    return _answers(copy)


def _catalog_files(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (root / CATALOG_DIR).glob("*.catalog")}


def test_a_builder_reads_the_catalog_a_file_at_a_time(
        tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    _store(root)
    expected = _from_files(root, tmp_path)

    def whole(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole catalog loaded")

    alone = catalog_shards.alone
    loaded: list[int] = []
    read: list[tuple[int | None, frozenset[tuple[str, str]] | None]] = []
    snapshot = catalog_pass.Snapshot

    def spied_alone(root: Path, schema: Any, shard: int) -> Any:
        loaded.append(shard)
        return alone(root, schema, shard)

    def spied_snapshot(root: Path, **kwargs: Any) -> Any:
        read.append((kwargs["scope"].shard, kwargs["scope"].runs))
        return snapshot(root, **kwargs)

    monkeypatch.setattr(catalog_shards, "load", whole)
    monkeypatch.setattr(catalog_shards, "alone", spied_alone)
    monkeypatch.setattr(catalog_pass, "Snapshot", spied_snapshot)
    report = build_bundles(root)
    shards = sorted({shard_of(run) for _, run in RUNS})
    assert loaded == shards  # each file of a run once (a file of no run: not looked for)
    assert [shard for shard, _ in read] == shards
    for shard, runs in read:  # each run read with its own file
        assert runs is not None and all(shard_of(run) == shard for _, run in runs)
    assert sorted(r for _, runs in read for r in runs or ()) == sorted(RUNS)
    assert report.runs == len(RUNS) and len(report.written) >= 2
    assert not (root / CACHE_FILE).exists()  # nor the decoded cache read and written 64 times
    monkeypatch.undo()
    table = catalogued_table(root)
    assert sorted(zip(table.column("project").to_pylist(), table.column("run").to_pylist(),
                      strict=True)) == sorted(RUNS)
    assert _answers(root) == expected


def test_a_pass_rewrites_only_the_file_of_a_run_that_changed(
        tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    build_bundles(root)
    before = _catalog_files(root)
    assert len(before) == len({shard_of(run) for _, run in RUNS})
    build_bundles(root)  # nothing changed: no file written
    assert _catalog_files(root) == before
    for kind in ("metrics", "runs"):
        shutil.rmtree(root / kind / "project=p" / "run=r3")
    report = build_bundles(root)
    after = _catalog_files(root)
    changed = {name for name in before if after.get(name) != before[name]}
    assert changed == {catalog_path(root, "r3").name}
    assert ("p", "r3") not in set(zip(catalogued_table(root).column("project").to_pylist(),
                                      catalogued_table(root).column("run").to_pylist(),
                                      strict=True))
    assert len(report.removed) == 1  # the bundle that held r3 is no longer vouched for
    assert _answers(root) == _from_files(root, tmp_path)


def test_settled_runs_give_each_runs_parts_their_mtimes_and_values(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    rows = settled_runs(root, lambda: None)[0].to_pylist()
    assert sorted((r["project"], r["run"]) for r in rows) == sorted(RUNS)
    for row in rows:
        i = RUNS.index((row["project"], row["run"]))
        assert row["values"] == 2 * (2 + i)  # two keys a step
        on_disk = sorted(str(p.relative_to(root)) for p in (
            root / "metrics" / f"project={row['project']}" / f"run={row['run']}"
        ).rglob("part-*.parquet"))
        assert sorted(row["parts"]) == on_disk and on_disk
        assert row["mtimes"] == [os.stat(root / p).st_mtime_ns for p in row["parts"]]


def test_a_planted_file_holding_another_files_run_is_written_anew(tmp_path: Path) -> None:
    """A file whose rows include a run of another file would give bundling that run
    twice (and a count of settled runs one too many)."""
    root = tmp_path / "store"
    _store(root)
    settled_runs(root, lambda: None)
    victim = next(run for _, run in RUNS if shard_of(run) != shard_of("r0"))
    target = catalog_path(root, "r0")
    target.write_bytes(signed_catalog(pa.concat_tables(
        [_file_table(target), _file_table(catalog_path(root, victim))])))
    age(root)
    rows = settled_runs(root, lambda: None)[0]
    counts = Counter(zip(rows.column("project").to_pylist(), rows.column("run").to_pylist(),
                         strict=True))
    assert sorted(counts) == sorted(RUNS) and set(counts.values()) == {1}
    rewritten = catalogued_table(root)
    assert sorted(rewritten.column("run").to_pylist()) == sorted(run for _, run in RUNS)


def _file_table(path: Path) -> pa.Table:
    return pa.ipc.open_stream(path.read_bytes().partition(b"\n")[2]).read_all()


def test_an_empty_store_and_a_store_of_no_runs_pass(tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    root.mkdir()
    report = build_bundles(root)
    assert report.runs == 0 and not report.written
    assert settled_runs(root, lambda: None)[0].num_rows == 0
    (root / "runs" / "project=p").mkdir(parents=True)
    (root / "metrics").mkdir()
    assert build_bundles(root).runs == 0


def test_a_file_whose_runs_are_all_gone_is_removed(tmp_path: Path, few: None) -> None:
    root = tmp_path / "store"
    _store(root)
    build_bundles(root)
    path = catalog_path(root, "r3")
    assert path.exists()
    gone = [(p, r) for p, r in RUNS if shard_of(r) == shard_of("r3")]
    for project, run in gone:
        for kind in ("metrics", "runs"):
            shutil.rmtree(root / kind / f"project={project}" / f"run={run}")
    build_bundles(root)
    assert not path.exists()
    left = settled_runs(root, lambda: None)[0]
    assert sorted(zip(left.column("project").to_pylist(), left.column("run").to_pylist(),
                      strict=True)) == sorted(set(RUNS) - set(gone))


def test_a_bundle_holds_at_most_its_count_of_parts(tmp_path: Path, few: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder reads each part of a bundle as a table of its own (about 12 KB held
    each): a bundle of 50,000 tiny runs held 0.6 GB."""
    monkeypatch.setattr(bundle, "BUNDLE_MAX_PARTS", 4)
    root = tmp_path / "store"
    _store(root)
    report = build_bundles(root)
    sources = [len(bundles.read_bundle(path).sources) for path in report.written]
    assert sources and max(sources) <= 4 and sum(sources) == len(RUNS)  # a part a run
    assert report.runs == len(RUNS)
    assert _answers(root) == _from_files(root, tmp_path)
