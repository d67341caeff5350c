"""`tracklake runs` on a store of many catalogued runs: the count and the newest runs come
from the run catalog's files read a few at a time (`run_index`), and only the runs shown
are read; what it prints is what reading every run prints."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from _crafted import age_catalog, catalog_path, catalogued_table, plant_catalog, signed_catalog
from _listings import record_listings
from _many_runs import PROJECTS, catalogued_store, plant_forged_status
from _many_runs import changed as _changed
from _many_runs import run as _run
from _settled import age
from click.testing import CliRunner

import tracklake
from tracklake._cli import run_list
from tracklake._cli.main import main
from tracklake._read import catalog_shards, run_index, snapshot
from tracklake._read.run_index import newest_runs


@pytest.fixture(autouse=True)
def _runs_view_from_the_whole_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQL these answers are checked against reads the catalog whole, as it did
    before `run_index` (tests/test_runs_view_streamed.py checks the other way)."""
    monkeypatch.setattr(snapshot, "runs_view_streamed", lambda root: False)


@pytest.fixture
def store(root: Path) -> Path:
    return catalogued_store(root)


def _by_sql(root: Path, project: str | None, limit: int) -> tuple[int, list[tuple[str, str]]]:
    where = f"WHERE project = '{project}'" if project else ""
    total = tracklake.query(f"SELECT count(*) AS n FROM runs {where}", root=root)
    newest = tracklake.query(f"""SELECT project, run FROM runs {where}
        ORDER BY started_at DESC, project DESC, run DESC LIMIT {limit}""", root=root)
    return (total.column("n")[0].as_py(),
            [(r["project"], r["run"]) for r in newest.to_pylist()])


def _cli_json(root: Path, *args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(main, ["runs", "--root", str(root), "--format", "json",
                                       *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


@pytest.mark.parametrize("changed", [False, True], ids=["settled", "changed"])
@pytest.mark.parametrize("project", [None, "p", "q"])
def test_the_count_and_the_newest_runs_are_the_runs_views(
        store: Path, changed: bool, project: str | None) -> None:
    if changed:
        _changed(store)
    for limit in (1, 3):
        found = newest_runs(store, project, limit)
        assert found is not None
        assert (found.total, found.newest) == _by_sql(store, project, limit)


@pytest.mark.parametrize("changed", [False, True], ids=["settled", "changed"])
def test_the_listing_prints_what_reading_every_run_prints(
        store: Path, changed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if changed:
        _changed(store)
    for args in (("--limit", "3"), ("--project", "q", "--limit", "2"),
                 ("--metric", "loss", "--limit", "4")):
        shown = _cli_json(store, *args)
        with monkeypatch.context() as m:
            m.setattr(run_list, "newest_runs", lambda *args: None)  # every run read
            every = _cli_json(store, *args)
        assert shown == every and shown
    result = CliRunner().invoke(main, ["runs", "--root", str(store), "--limit", "3"])
    total = sum(PROJECTS.values())  # changed: one run more, one less
    assert f"({total - 3} older runs not shown" in result.output


def test_only_the_runs_shown_are_read_the_others_counted_by_their_paths_under_runs(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracklake._read import catalog, decoded

    def whole(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole catalog was loaded")
    monkeypatch.setattr(catalog_shards, "load", whole)
    stated: list[str] = []
    for module in (catalog, run_index):
        def spy(paths: list[str], real: object = module.mtimes_of) -> object:
            stated.extend(paths)
            return real(paths)  # type: ignore[operator]
        monkeypatch.setattr(module, "mtimes_of", spy)
    decoded_paths: list[str] = []
    real_get = decoded.DecodedCache.get

    def get(self: decoded.DecodedCache, path: Path, decode: object) -> object:
        decoded_paths.append(str(path))
        return real_get(self, path, decode)  # type: ignore[arg-type]
    monkeypatch.setattr(decoded.DecodedCache, "get", get)
    listed = record_listings(monkeypatch)
    shown = _cli_json(store, "--limit", "2")
    assert [r["run"] for r in shown] == ["p08", "p09"]

    def runs_of(paths: list[str]) -> set[str]:
        return {p.split("/run=")[1].split("/")[0] for p in paths}
    # every run's paths under runs/ stat'ed (to count them), no metrics path
    assert runs_of(stated) == {f"{project}{i:02d}" for project, count in PROJECTS.items()
                               for i in range(count)}
    assert not [p for p in stated if "/metrics/" in p]
    # the shown runs read from their files: their attempt files and parts alone
    assert runs_of(decoded_paths) == {"p08", "p09"}
    assert any("/metrics/" in p for p in decoded_paths)
    runs_listed = {part for rel in listed for part in rel.split("/") if part.startswith("run=")}
    assert runs_listed <= {"run=p08", "run=p09"}, runs_listed


def test_runs_the_catalog_does_not_vouch_for_are_read_from_their_attempt_files_alone(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many runs the catalog does not vouch for (here every run: no catalog at
    all), the count and the newest come from their attempt files, a few runs at a time,
    each file read once and no metric file opened; nothing is catalogued in the process
    (a builder is asked to do it), and past `FRESH_AT_MOST` runs the decoded cache is
    neither read nor written."""
    from tracklake._read import decoded

    assert newest_runs(store, None, sum(PROJECTS.values())) is None  # nothing left out
    _run(store, "p", "new1", 30.0)
    _run(store, "p", "new2", 31.0)
    shutil.rmtree(store / ".cache")
    monkeypatch.setattr(run_index, "FRESH_AT_MOST", 3)
    monkeypatch.setattr(run_index, "_READ_AT", 4)  # 16 runs: 4 groups
    asked: list[int] = []
    monkeypatch.setattr(run_index, "start_builder",
                        lambda root, uncatalogued_runs: asked.append(uncatalogued_runs))
    opened: list[str] = []
    real_get = decoded.DecodedCache.get

    def get(self: decoded.DecodedCache, path: Path, decode: object) -> object:
        assert not self.enabled  # more than FRESH_AT_MOST: no cache
        opened.append(str(path.relative_to(store)))
        return real_get(self, path, decode)  # type: ignore[arg-type]
    monkeypatch.setattr(decoded.DecodedCache, "get", get)
    found = newest_runs(store, None, 2)
    total = sum(PROJECTS.values()) + 2
    assert found is not None and found.total == total
    assert found.newest == [("p", "new2"), ("p", "new1")]
    assert len(opened) == len(set(opened)) == total  # one attempt file a run
    assert all(p.startswith("runs/") and "/attempt=" in p for p in opened)
    assert asked == [total]
    assert not (store / ".cache").exists()  # neither catalog nor cache written
    monkeypatch.setattr(decoded.DecodedCache, "get", real_get)
    assert (found.total, found.newest) == _by_sql(store, None, 2)
    monkeypatch.setenv("TRACKLAKE_TRUST_MTIMES", "0")
    assert newest_runs(store, None, 2) is None


@pytest.mark.parametrize("bundles", ["on", "off"])
def test_the_builder_a_listing_starts_catalogs_the_runs_it_read_from_their_files(
        store: Path, bundles: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs the catalog lacks, past `BUILD_MIN_RUNS`: `tracklake runs` starts a builder
    in the background, which catalogs them (bundles off too: then it bundles nothing),
    so that the next listing reads none of them from their files; and marks what it
    left uncatalogued, so that the next listing starts none for the same runs."""
    from tracklake._read import bundles as bundles_module

    monkeypatch.setenv("TRACKLAKE_BUNDLES", bundles)
    shutil.rmtree(store / ".cache")
    age(store)
    monkeypatch.setattr(bundles_module, "BUILD_MIN_RUNS", 4)
    shown = _cli_json(store, "--limit", "2")
    builder = bundles_module._builders.pop(str(store))
    assert builder.wait(timeout=120) == 0
    vouched = {r for r in catalogued_table(store).column("run").to_pylist()}
    assert vouched == {f"{p}{i:02d}" for p, count in PROJECTS.items() for i in range(count)}
    assert not list((store / ".cache" / "bundles").glob("bundle-*"))  # too few to bundle
    marker = json.loads((store / ".cache" / "bundles" / ".checked").read_bytes())
    assert marker["uncatalogued"] == 0
    assert _cli_json(store, "--limit", "2") == shown
    assert str(store) not in bundles_module._builders  # within BUILD_EVERY_SECONDS
    monkeypatch.setattr(bundles_module, "BUILD_EVERY_SECONDS", -60.0)
    assert not bundles_module.start_builder(store, uncatalogued_runs=4 - 1)
    marker["uncatalogued"] = 10  # as many left as a listing finds: none started
    (store / ".cache" / "bundles" / ".checked").write_text(json.dumps(marker))
    assert not bundles_module.start_builder(store, uncatalogued_runs=10 + 4 - 1)
    assert bundles_module.start_builder(store, uncatalogued_runs=10 + 4)
    assert bundles_module._builders.pop(str(store)).wait(timeout=120) == 0


@pytest.mark.parametrize("planted", ["another file's run", "a null run"])
def test_a_catalog_file_not_to_be_trusted_is_not_used_and_those_beside_it_are(
        store: Path, planted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged entry of the newest run, its start said to be the earliest of all (a run
    starts when its first attempt did), planted in the file of another shard; or the
    newest run's entry with its name null: that file is not trusted (its runs are read
    from their files), the files checked with it are (their runs are not read), and the
    newest run stays the newest."""
    table = catalogued_table(store)
    runs = table.column("run").to_pylist()
    if planted == "a null run":
        plant_catalog(store, table.set_column(
            table.schema.get_field_index("run"), "run",
            pa.array([None if r == "p09" else r for r in runs], pa.string())),
            null_run="p09")
        distrusted = "p09"
    else:
        forged = table.filter(pa.array([r == "p09" for r in runs]))
        attempts = forged.column("attempts").to_pylist()
        attempts[0][0]["started_at"] = "1970-01-01T00:00:00+00:00"
        forged = forged.set_column(forged.schema.get_field_index("attempts"), "attempts",
                                   pa.array(attempts, forged.schema.field("attempts").type))
        distrusted = next(r for r in runs
                          if catalog_shards.shard_of(r) != catalog_shards.shard_of("p09"))
        plant_catalog(store, table)
        path = catalog_path(store, distrusted)
        rows = pa.ipc.open_stream(path.read_bytes().partition(b"\n")[2]).read_all()
        path.write_bytes(signed_catalog(pa.concat_tables([rows, forged])))
    age_catalog(store)
    read: list[tuple[str, str]] = []
    real = run_index._fresh_attempts

    def noted(root: Path, fresh: list[tuple[str, str]]) -> Iterator[pa.Table]:
        read.extend(fresh)  # the runs read from their attempt files
        return real(root, fresh)
    monkeypatch.setattr(run_index, "_fresh_attempts", noted)
    found = newest_runs(store, None, 3)
    assert found is not None and (found.total, found.newest) == _by_sql(store, None, 3)
    assert found.newest[0] == ("p", "p09") and found.total == sum(PROJECTS.values())
    in_that_file = [r for r in runs if catalog_shards.shard_of(r) == catalog_shards.shard_of(
        distrusted)]
    assert sorted(r for _, r in read) == sorted(in_that_file) and len(read) < len(runs)


def test_a_shown_runs_entry_planted_in_another_shown_runs_file_is_not_used(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest run's entry, its status forged, planted in the file of the run shown
    beside it: the runs shown are as their files say."""
    assert catalog_shards.shard_of("p08") != catalog_shards.shard_of("p09")
    plant_forged_status(store, "p09", beside="p08", status="crashed")
    shown = _cli_json(store, "--limit", "2")
    assert [(r["run"], r["status"]) for r in shown] == [("p08", "finished"),
                                                        ("p09", "finished")]


def test_a_linked_project_and_a_fifo_for_a_catalog_file_are_passed_over(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project directory that is a link to another store's runs, and a FIFO where a
    catalog file goes: neither is followed nor opened (the count is of this store's own
    runs, the answer comes back), and what is printed is what reading every run prints."""
    import os

    other = tmp_path / "other"
    _run(other, "evil", "e0", 99.0)
    for kind in ("runs", "metrics"):
        os.symlink(other / kind / "project=evil", store / kind / "project=evil")
    fifo = store / catalog_shards.shard_file(catalog_shards.shard_of("p08"))
    fifo.unlink()
    os.mkfifo(fifo)
    found = newest_runs(store, None, 3)
    assert found is not None and found.total == sum(PROJECTS.values())
    assert (found.total, found.newest) == _by_sql(store, None, 3)
    shown = _cli_json(store, "--limit", "3")
    monkeypatch.setattr(run_list, "newest_runs", lambda *args: None)  # every run read
    assert shown == _cli_json(store, "--limit", "3")
    assert [r["run"] for r in shown] == ["p07", "p08", "p09"]
