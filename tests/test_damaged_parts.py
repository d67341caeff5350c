"""Damaged compacted parts: a flipped bit or a truncated file is reported with its path and
what it loses, never read as different values, and never takes the rest of the store
down (runs, show, sql, export, pack)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._format import parse_part_name
from tracklake._format.part import FOOTER_CRC_KEY, SUMMARY_KEY


def _write(root: Path, run_id: str, steps: int = 50) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False) as run:
        for step in range(steps):
            run.log({"loss": step * 0.5, "acc": step / 7}, step=step)
            run.log({"note": f"step {step}"}, step=step)


def _metrics_part(root: Path, run_id: str) -> Path:
    return next(root.glob(f"metrics/project=p/run={run_id}/**/*.parquet"))


def _sql_rows(root: Path) -> tuple[list[dict[str, Any]], tracklake.ReadProblems]:
    problems = tracklake.ReadProblems()
    rows = tracklake.query("SELECT run, step, key, value FROM metrics ORDER BY ALL",
                           root=root, problems=problems).to_pylist()
    return rows, problems


def _summary_rows(root: Path) -> tuple[list[dict[str, Any]], tracklake.ReadProblems]:
    problems = tracklake.ReadProblems()
    rows = tracklake.query("SELECT * FROM metric_summaries ORDER BY ALL", root=root,
                           problems=problems).to_pylist()
    return rows, problems


def _reader_rows(root: Path) -> tuple[list[dict[str, Any]], tracklake.ReadProblems]:
    problems = tracklake.ReadProblems()
    rows: list[dict[str, Any]] = []
    for run_id in ("a", "b"):
        for stream, batch in tracklake.read_run(root, tracklake.Cursor("p", run_id),
                                                kinds=("metrics",), problems=problems):
            rows += [{"run": stream.run, **r}
                     for r in batch.select(["step", "key", "value"]).to_pylist()]
    return sorted(rows, key=lambda r: (r["run"], r["step"], r["key"])), problems


READERS: dict[str, Callable[[Path], tuple[list[dict[str, Any]], tracklake.ReadProblems]]] = {
    "sql": _sql_rows, "summaries": _summary_rows, "reader": _reader_rows}


@pytest.fixture
def store(root: Path) -> Path:
    _write(root, "a")
    _write(root, "b")
    tracklake.compact(root=root)
    return root


def test_parts_carry_page_checksums_and_a_footer_checksum(store: Path) -> None:
    import pyarrow.parquet as pq

    part = _metrics_part(store, "a")
    meta = pq.ParquetFile(part).metadata
    assert meta.metadata[FOOTER_CRC_KEY.encode()].isdigit()
    # pyarrow only verifies what was written: a verified read of a flipped page fails
    data = bytearray(part.read_bytes())
    data[_page_byte(part)] ^= 0x01
    part.write_bytes(data)
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(part, page_checksum_verification=True)


def _page_byte(part: Path) -> int:
    """Offset of a byte inside the compressed data of a page of the `value` column."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(part).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index("value"))
    return int(chunk.data_page_offset + chunk.total_compressed_size - 2)


def _flip(part: Path, original: bytes, bit: int) -> None:
    data = bytearray(original)
    data[bit // 8] ^= 1 << (bit % 8)
    part.write_bytes(data)


@pytest.mark.parametrize("where", ["value page", "footer metadata", "footer end"])
@pytest.mark.parametrize("steps", [50, 3000])  # a summary computed from the rows, or stored
def test_a_flipped_bit_is_reported_as_damage_naming_the_part(root: Path, where: str,
                                                            steps: int) -> None:
    import pyarrow.parquet as pq

    store = root
    _write(store, "a")
    _write(store, "b", steps=steps)
    tracklake.compact(root=store)
    part = _metrics_part(store, "b")
    stored = SUMMARY_KEY.encode() in pq.ParquetFile(part).metadata.metadata
    assert stored == (steps == 3000)
    original = part.read_bytes()
    good = {name: read(store)[0] for name, read in READERS.items()}
    offset = {"value page": _page_byte(part),
              "footer metadata": original.rfind(b"tracklake.kind") + 3,
              "footer end": len(original) - 20}[where]
    _flip(part, original, offset * 8 + 2)
    for name, read in READERS.items():
        rows, problems = read(store)
        if name == "summaries" and where == "value page" and stored:
            # the summaries come from the (intact) footer: nothing to report, nothing changed
            assert (rows, problems.damaged) == (good[name], []), where
            continue
        assert [p for p, _ in problems.damaged] == [part], (where, name)
        why = problems.damaged[0][1]
        first, last, _ = parse_part_name(part.name) or (-1, -1, -1)
        assert "damaged Parquet part" in why and f"seq {first}..{last}" in why, why
        # run a is whole; none of b's compacted rows is read as another value
        assert [r for r in rows if r.get("run") == "a"] == [
            r for r in good[name] if r.get("run") == "a"], (where, name)
        assert all(r in good[name] for r in rows), (where, name)


@pytest.mark.slow
def test_random_single_bit_flips_are_never_read_as_different_values(store: Path) -> None:
    """Over a part, 100 random bit flips: every read either reports the part or returns
    exactly the original values (a flip in bytes no reader uses)."""
    part = _metrics_part(store, "b")
    original = part.read_bytes()
    good = {name: read(store)[0] for name, read in READERS.items() if name != "summaries"}
    rng = random.Random(12)
    changed = []
    for _ in range(100):
        bit = rng.randrange(len(original) * 8)
        _flip(part, original, bit)
        for name, want in good.items():
            rows, problems = READERS[name](store)
            if not problems.damaged and rows != want:
                changed.append((bit, name))
    assert changed == []


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("damage", ["truncated", "flipped footer", "empty"])
def test_every_command_skips_a_damaged_part_and_names_it(store: Path, tmp_path: Path,
                                                         damage: str) -> None:
    part = _metrics_part(store, "b")
    data = part.read_bytes()
    if damage == "truncated":
        part.write_bytes(data[: len(data) // 2])
    elif damage == "flipped footer":
        _flip(part, data, (len(data) - 40) * 8)
    else:
        part.write_bytes(b"")
    root = str(store)
    runs = _cli("runs", "--root", root, "--metric", "loss")
    show_a = _cli("show", "a", "--root", root)
    show_b = _cli("show", "b", "--root", root)
    sql = _cli("sql", "SELECT run, count(*) AS n FROM metrics GROUP BY run ORDER BY run",
               "--root", root, "--format", "json")
    export = _cli("export", "console", "--root", root, "--all")
    pack = _cli("pack", "--root", root, "--all", "-o", str(tmp_path / "x.tlpack"))
    report = _cli("report", "a", "b", "--root", root, "-o", str(tmp_path / "r.html"))
    for name, (code, _, err) in {"runs": runs, "show b": show_b, "sql": sql,
                                 "export": export, "report": report}.items():
        assert code == 0, (name, err)
        assert str(part) in err, (name, err)
    # showing run a reads only run a's files: b's damage is not its problem
    assert show_a[0] == 0 and str(part) not in show_a[2], show_a
    assert pack[0] == 0 and "1 damaged" in pack[1] + pack[2], pack
    assert "24.5" in runs[1]  # run a's last loss is still listed
    assert '{"run": "a", "n": 100}' in sql[1] and '"run": "b"' not in sql[1]
    assert "metrics=100" in show_a[1]


def test_a_segment_with_a_damaged_header_does_not_fail_sql_for_other_runs(root: Path) -> None:
    _write(root, "a", steps=5)
    _write(root, "b", steps=5)
    segment = next(root.glob("metrics/project=p/run=b/**/*.arrows"))
    segment.write_bytes(b"\x00" * 64 + segment.read_bytes()[64:])
    rows, problems = _sql_rows(root)
    assert {r["run"] for r in rows} == {"a"} and len(rows) == 10
    assert [p for p, _ in problems.damaged] == [segment]
    code, out, err = _cli("sql", "SELECT count(*) AS n FROM metrics", "--root", str(root),
                          "--format", "csv")
    assert code == 0 and "10" in out and str(segment) in err


def test_without_a_problems_list_damage_is_a_warning_naming_the_file(store: Path) -> None:
    part = _metrics_part(store, "b")
    part.write_bytes(part.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match=str(part)):
        rows = tracklake.query("SELECT count(*) AS n FROM metrics", root=store).to_pylist()
    assert rows == [{"n": 100}]


def test_compaction_leaves_a_segment_with_a_damaged_header_and_compacts_the_rest(
        root: Path) -> None:
    _write(root, "a", steps=5)
    _write(root, "b", steps=5)
    segment = next(root.glob("metrics/project=p/run=b/**/*.arrows"))
    segment.write_bytes(b"\x00" * 64 + segment.read_bytes()[64:])
    report = tracklake.compact(root=root)
    assert [p for p, _ in report.skipped] == [segment]
    assert "not an Arrow IPC stream" in report.skipped[0][1]
    assert segment.exists()
    assert list(root.glob("metrics/project=p/run=a/**/*.parquet"))
    code, _, err = _cli("compact", "--root", str(root))
    assert code == 0 and str(segment) in err


def test_a_damaged_first_segment_leaves_no_part_of_its_good_batches(root: Path) -> None:
    """The batches before the damage of a run's only segment: compaction wrote them as
    `part-…--00001.parquet`, a name no reader takes and fsck moved out of the store;
    they stay in the segment, kept for fsck, which reads them already."""
    with tracklake.init(project="p", run_id="r", root=root, compact=False) as run:
        for step in range(30):
            run.log({"loss": float(step)}, step=step)
            if step % 10 == 9:
                run.flush()
    segment = next(root.glob("metrics/project=p/run=r/**/*.arrows"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x10
    segment.write_bytes(bytes(data))
    report = tracklake.compact(root=root)
    assert [p for p, _ in report.skipped] == [segment]
    assert list(segment.parent.iterdir()) == [segment]
    assert not [p for p in report.parts_written if "metrics" in p.parts]
    assert report.records == sum(pq.read_metadata(p).num_rows for p in report.parts_written)
    code, out, _ = _cli("fsck", "--root", str(root))
    assert code == 1 and out.count("problem") == 1 and str(segment.name) in out, out
    assert tracklake.query("SELECT count(*) AS n FROM metrics", root=root,
                           problems=tracklake.ReadProblems()).to_pylist() == [{"n": 10}]


def test_an_error_in_the_sql_itself_does_not_read_every_part(root: Path) -> None:
    """Parts are read in full to look for damage only when reading data failed: a typo is
    reported as it is, and a damaged page no query read is not looked for. (A part too
    small to carry its summary is read whole by every connection, to summarise it: its
    damage is found at once; this one is large enough to carry it.)"""
    store = root
    _write(store, "a")
    _write(store, "b", steps=3000)
    tracklake.compact(root=store)
    part = _metrics_part(store, "b")
    original = part.read_bytes()
    _flip(part, original, _page_byte(part) * 8)
    problems = tracklake.ReadProblems()
    with pytest.raises(tracklake.QueryError, match="no_such_column") as caught:
        tracklake.query("SELECT no_such_column FROM metrics", root=store, problems=problems)
    assert problems.damaged == [] and "damaged" not in str(caught.value)
    _, problems = _sql_rows(store)
    assert [p for p, _ in problems.damaged] == [part]


@pytest.mark.parametrize("summary", [
    '[{"key":"loss","count":"x"}]', '[{"key":5,"count":1}]', '[{"count":3}]',
    '[{"key":"loss"}]', '[{"key":"loss","count":1e400}]',
    '[{"key":"loss","count":99999999999999999999999}]', '[{"key":"loss","count":1,"min":[]}]'])
def test_a_crafted_summary_is_named_and_never_takes_the_store_down(root: Path,
                                                                   summary: str) -> None:
    """A part whose footer carries a summary of the wrong shape or types, checksums and
    all (as a forger or another tool would write it): every reader names the part and
    what it loses, and answers for the rest of the store; before, every question over
    the store failed with Arrow's "Could not convert 'x'", naming no file."""
    import pyarrow.parquet as pq

    from tracklake._format.part import write_part_stream

    _write(root, "a")
    _write(root, "b")
    tracklake.compact(root=root)
    good = {name: read(root)[0] for name, read in READERS.items()}
    part = _metrics_part(root, "b")
    table = pq.read_table(part)
    meta = {k: v for k, v in pq.ParquetFile(part).metadata.metadata.items()
            if k != FOOTER_CRC_KEY.encode()}
    write_part_stream(part, table.schema.with_metadata({**meta, SUMMARY_KEY.encode():
                                                        summary.encode()}),
                      [table], "metrics")
    assert pq.ParquetFile(part).metadata.metadata[SUMMARY_KEY.encode()] == summary.encode()
    for name, read in READERS.items():
        rows, problems = read(root)
        if name == "reader":  # reads the rows; the summary is not its business
            assert rows == good[name]
            continue
        assert [p for p, _ in problems.damaged] == [part], (name, problems.damaged)
        assert "metric summary" in problems.damaged[0][1], problems.damaged
        assert [r for r in rows if r["run"] == "a"] == [r for r in good[name]
                                                        if r["run"] == "a"], name
    if summary not in ('[{"key":"loss","count":"x"}]', '[{"count":3}]'):
        return  # fsck and --repair for one summary of each fault: a type, the shape
    # fsck names the part and why, and --repair rebuilds the summary from its records
    _, out, err = _cli("fsck", "--root", str(root))
    found = [line for line in (out + err).splitlines() if part.name in line]
    assert len(found) == 1 and "metric summary" in found[0], out + err
    _cli("fsck", "--root", str(root), "--repair")
    assert "clean" in _cli("fsck", "--root", str(root))[1]
    assert {name: read(root)[0] for name, read in READERS.items()} == good
