"""The `tracklake` command line: every command, its output formats and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._cli.sparkline import ASCII_LEVELS, UNICODE_LEVELS, WIDTH, sparkline


def _run(root: Path, run_id: str, *, lr: float, steps: int = 20) -> None:
    with tracklake.init(project="p", run_id=run_id, root=root, config={"optim": {"lr": lr}},
                        capture_identity=True) as run:
        for step in range(steps):
            run.log({"critic/score/mean": step / 10, "actor/pg_loss": -step}, step=step)


@pytest.fixture
def store(root: Path) -> Path:
    _run(root, "run-a", lr=1e-3)
    _run(root, "run-b", lr=1e-4, steps=30)
    return root


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_runs_lists_every_run_with_status_last_step_and_chosen_metrics(store: Path) -> None:
    code, out = invoke("runs", "--root", str(store), "--metric", "critic/*")
    assert code == 0
    assert "run-a" in out and "run-b" in out and "finished" in out
    assert "critic/score/mean" in out
    assert "2.9" in out and "29" in out  # run-b's last value and last step


def test_show_prints_identity_attempts_and_metric_summaries(store: Path) -> None:
    code, out = invoke("show", "run-b", "--root", str(store))
    assert code == 0
    assert "p/run-b" in out and "attempts" in out
    assert "0..29" in out and "metrics=60" in out
    assert "optim/lr" in out


def test_diff_shows_the_config_key_that_differs(store: Path) -> None:
    code, out = invoke("diff", "run-a", "run-b", "--root", str(store), "--section", "config")
    assert code == 0
    assert "optim/lr" in out and "0.001" in out and "0.0001" in out


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_sql_prints_results_in_each_format(store: Path, fmt: str) -> None:
    code, out = invoke("sql", "SELECT run, count(*) AS n FROM metrics GROUP BY run ORDER BY run",
                       "--root", str(store), "--format", fmt)
    assert code == 0
    if fmt == "json":
        assert [json.loads(line) for line in out.splitlines()] == [
            {"run": "run-a", "n": 40}, {"run": "run-b", "n": 60}]
    else:
        assert "run-a" in out and "40" in out and "60" in out


def test_sql_writes_lists_structs_maps_and_intervals_as_text_in_csv_and_json(
        store: Path) -> None:
    """`SELECT * FROM runs` has a list (tags) and an interval (duration), which pyarrow's
    CSV writer refuses: they are written as JSON and as DuckDB's text of an interval."""
    import csv
    import io

    tracklake.init(project="p", run_id="tagged", root=store, tags=["a", "b,c"],
                   capture_identity=False).finish()
    sql = ("SELECT run, tags, duration, {'x': 1, 'y': [2, NULL]} AS s, map(['k'], [1.5::DOUBLE]) "
           "AS m, INTERVAL 1 DAY + to_microseconds(1500000) AS i, NULL::INTEGER[] AS n, "
           "[INTERVAL 2 DAY, NULL] AS li FROM runs ORDER BY run")
    code, out = invoke("sql", sql, "--root", str(store), "--format", "csv")
    assert code == 0, out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["run"] for r in rows] == ["run-a", "run-b", "tagged"]
    assert json.loads(rows[2]["tags"]) == ["a", "b,c"]
    assert json.loads(rows[0]["s"]) == {"x": 1, "y": [2, None]}
    assert json.loads(rows[0]["m"]) == [["k", 1.5]]
    assert rows[0]["i"] == "1 day 00:00:01.5" and rows[0]["n"] == ""
    assert json.loads(rows[0]["li"]) == ["2 days", None]
    assert all(r["duration"].count(":") == 2 for r in rows), rows  # 00:00:00.123456
    code, out = invoke("sql", sql, "--root", str(store), "--format", "json")
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["i"] == "1 day 00:00:01.5" and lines[2]["tags"] == ["a", "b,c"]
    assert lines[0]["li"] == ["2 days", None] and lines[0]["s"] == {"x": 1, "y": [2, None]}
    code, out = invoke("sql", sql, "--root", str(store))
    assert code == 0 and "['2 days', None]" in out and "MonthDayNano" not in out, out
    assert [r["duration"] for r in lines] == [r["duration"] for r in rows]


def test_an_interval_is_written_as_duckdb_writes_it() -> None:
    import duckdb

    from tracklake._cli.cells import interval_text

    sql = ("SELECT INTERVAL 1 YEAR + INTERVAL 14 MONTH + INTERVAL 3 DAY + "
           "to_microseconds(3661500000) AS a, -to_microseconds(1250000) AS b, "
           "to_microseconds(0) AS c, INTERVAL 1 DAY AS d, -INTERVAL 14 MONTH AS e, "
           "-INTERVAL 1 DAY + to_microseconds(5) AS f, to_microseconds(360000000000) AS g, "
           "-INTERVAL 12 MONTH AS h, INTERVAL 1 MONTH - to_microseconds(1) AS i")
    con = duckdb.connect()
    relation = con.sql(sql)
    texts = con.sql(f"SELECT COLUMNS(*)::VARCHAR FROM ({sql})").fetchall()[0]
    values = relation.to_arrow_table().to_pylist()[0].values()
    assert tuple(interval_text(v) for v in values) == texts


def test_sql_writes_an_interval_to_parquet_as_a_duration(store: Path, tmp_path: Path) -> None:
    """`SELECT * FROM runs --format parquet` (its duration an interval, which Parquet has
    no type for) writes the duration in microseconds; an interval of months, which has
    no fixed length, is an error naming the column, and no file is left."""
    out_file = tmp_path / "runs.parquet"
    code, out = invoke("sql", "SELECT * FROM runs ORDER BY run", "--root", str(store),
                       "--format", "parquet", "-o", str(out_file))
    assert code == 0, out
    table = pq.read_table(out_file)
    assert table.schema.field("duration").type == pa.duration("us")
    expected = tracklake.query("SELECT epoch_us(duration) AS us FROM runs ORDER BY run",
                               root=store).column("us").to_pylist()
    assert table.column("duration").cast(pa.int64()).to_pylist() == expected
    assert all(us > 0 for us in expected) and table.column("tags").to_pylist() == [[], []]
    months = tmp_path / "months.parquet"
    code, out = invoke("sql", "SELECT INTERVAL 2 MONTH AS span", "--root", str(store),
                       "--format", "parquet", "-o", str(months))
    assert code == 1 and "'span'" in out and "2 months" in out, out
    for sql, column in (("SELECT 1 AS a, union_value(k := 1) AS u", "'u'"),
                        ("SELECT [INTERVAL 1 DAY] AS spans", "'spans'")):
        code, out = invoke("sql", sql, "--root", str(store), "--format", "parquet",
                           "-o", str(months))
        assert code == 1 and f"column {column} cannot be written as Parquet" in out, out
    assert not list(tmp_path.glob("*months*"))


def test_sql_writes_parquet_outside_the_store(store: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "out.parquet"
    code, _ = invoke("sql", "SELECT * FROM metrics", "--root", str(store), "--format",
                     "parquet", "-o", str(out_file))
    assert code == 0
    assert pq.read_table(out_file).num_rows == 100


def test_sql_refuses_to_write_its_output_into_the_store(store: Path) -> None:
    code, out = invoke("sql", "SELECT 1", "--root", str(store), "--format", "csv", "-o",
                       str(store / "metrics" / "x.csv"))
    assert code == 1
    assert "refusing to write" in out
    assert not (store / "metrics" / "x.csv").exists()


def test_sql_that_would_modify_the_store_exits_1_with_a_clear_message(store: Path) -> None:
    code, out = invoke("sql", f"COPY metrics TO '{store}/m.csv'", "--root", str(store))
    assert code == 1
    assert "read-only" in out
    assert not (store / "m.csv").exists()


def test_compact_reports_what_it_did_and_dry_run_changes_nothing(store: Path) -> None:
    before = sorted(p.name for p in store.rglob("*.arrows"))
    code, out = invoke("compact", "--root", str(store), "--dry-run")
    assert code == 0 and "would compact" in out
    assert sorted(p.name for p in store.rglob("*.arrows")) == before
    code, out = invoke("compact", "--root", str(store))
    assert code == 0 and "compacted" in out
    assert not list(store.rglob("*.arrows"))
    assert list(store.rglob("*.parquet"))


def test_watch_once_prints_each_step_of_the_chosen_keys(store: Path) -> None:
    code, out = invoke("watch", "run-a", "--root", str(store), "--once", "--keys", "critic/*")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 21
    assert lines[0] == "step:0 - critic/score/mean:0"
    assert lines[-1] == "run p/run-a ended (rank 0: finished)"
    assert "actor/pg_loss" not in out


def test_watch_prints_texts_with_their_step_and_says_when_the_run_ended(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        run.log({"phase": "warmup"})
        for step in range(3):
            run.log({"loss": float(step), "phase": f"train {step}"}, step=step)
    code, out = invoke("watch", "r", "--root", str(root), "--once")
    assert code == 0
    assert out.splitlines() == [
        "step:0 - loss:0", "step:0 - phase: warmup", "step:0 - phase: train 0",
        "step:1 - loss:1", "step:1 - phase: train 1", "step:2 - loss:2",
        "step:2 - phase: train 2", "run p/r ended (rank 0: finished)"]


def test_watch_once_on_a_live_run_says_it_still_runs(root: Path) -> None:
    run = tracklake.init(project="p", run_id="live", root=root, capture_identity=False)
    try:
        run.log({"loss": 1.0}, step=0)
        run.flush()
        code, out = invoke("watch", "live", "--root", str(root), "--once")
    finally:
        run.finish()
    assert code == 0
    assert out.splitlines() == ["step:0 - loss:1", "run live is still running (--once: "
                                "stopped here)"]


def test_show_last_value_is_the_lowest_ranks_as_in_runs(root: Path) -> None:
    for rank, last in ((1, 0.7699), (0, 0.8146)):
        with tracklake.init(project="p", run_id="multi", root=root, rank=rank,
                            capture_identity=False) as run:
            run.log({"critic/score/mean": 0.5}, step=0)
            run.log({"critic/score/mean": last}, step=1)
            if rank == 1:
                run.log({"only/rank1": 3.0}, step=1)
    code, runs = invoke("runs", "--root", str(root), "--metric", "critic/*")
    assert code == 0 and "0.8146" in runs and "0.7699" not in runs
    code, show = invoke("show", "multi", "--root", str(root))
    assert code == 0
    row = next(line for line in show.splitlines() if "critic/score/mean" in line)
    assert "0.8146" in row and "0.7699" not in row
    assert "rank 0" in show
    only = next(line for line in show.splitlines() if "only/rank1" in line)
    assert "3 (rank 1)" in only


def test_runs_shows_the_shown_runs_values_not_those_of_a_namesake(root: Path) -> None:
    """The shown runs' summaries are narrowed by their names (as parameters, pushed down
    to the summaries' scan): a run of another project with the same name keeps its own
    values, whichever of the two is shown."""
    for project, run_id, last in (("a", "old", 9.75), ("a", "same", 1.25),
                                  ("b", "same", 7.5), ("a", "new", 3.5)):
        with tracklake.init(project=project, run_id=run_id, root=root,
                            capture_identity=False) as run:
            run.log({"critic/score/mean": last}, step=4)
    listed = invoke("runs", "--root", str(root), "--format", "json")[1].splitlines()
    assert len(listed) == 4
    code, out = invoke("runs", "--root", str(root), "--metric", "critic/*", "--limit", "2")
    assert code == 0 and "2 older runs not shown" in out, out
    newest = [line for line in out.splitlines() if "finished" in line]
    assert len(newest) == 2, out
    expected = {("a", "same"): "1.25", ("b", "same"): "7.5", ("a", "new"): "3.5",
                ("a", "old"): "9.75"}
    for line in newest:
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        key = (cells[0], cells[1])
        assert key in expected and expected[key] in line, (key, line)
        others = set(expected.values()) - {expected[key]}
        assert not any(v in line for v in others), line


@pytest.mark.parametrize("args", [
    ("runs", "--root", "{absent}"),
    ("show", "nope", "--root", "{store}"),
    ("sql", "DROP VIEW metrics", "--root", "{store}"),
    ("sql", "SELECT 1", "--root", "{store}", "--format", "parquet"),
    ("sql", "SELECT 1", "--root", "{store}", "--format", "bogus"),
    ("compact", "--root", "{absent}"),
    ("watch", "nope", "--root", "{store}", "--once"),
    ("export", "console", "--root", "{absent}", "--all"),
    ("export", "console", "--root", "{store}"),
    ("pack", "--root", "{store}", "-o", "{tmp}/x.tlpack"),
    ("runs", "--bogus-option"),
])
def test_every_error_has_one_form(store: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    values = {"store": str(store), "absent": str(tmp_path / "absent"), "tmp": str(tmp_path)}
    result = CliRunner().invoke(main, [a.format(**values) for a in args],
                                catch_exceptions=False)
    assert result.exit_code in (1, 2)
    errors = [line for line in result.stderr.splitlines() if "rror" in line]
    assert errors and all(line.startswith("tracklake: error: ") for line in errors), \
        result.stderr


@pytest.mark.parametrize("target", ["{tmp}/missing/dir/out.csv", "/proc/version/out.csv",
                                    "/dev/full"])
def test_sql_output_that_cannot_be_written_is_a_clear_error(store: Path, tmp_path: Path,
                                                            target: str) -> None:
    path = target.format(tmp=tmp_path)
    code, out = invoke("sql", "SELECT 1 AS x", "--root", str(store), "--format", "csv",
                       "-o", path)
    assert code == 1
    assert out.startswith(f"tracklake: error: cannot write {path}: ")


def test_unknown_run_and_missing_store_exit_1_naming_what_is_wrong(store: Path,
                                                                    tmp_path: Path) -> None:
    code, out = invoke("show", "nope", "--root", str(store))
    assert code == 1 and "no run 'nope'" in out
    code, out = invoke("runs", "--root", str(tmp_path / "absent"))
    assert code == 1 and "no tracklake store" in out


def test_demo_writes_a_multi_rank_run_compacts_it_and_prints_a_summary(root: Path) -> None:
    code, out = invoke("demo", "--root", str(root), "--ranks", "2", "--steps", "120")
    assert code == 0, out
    assert "status=finished" in out and "ranks=2" in out and "steps=120" in out
    counts = tracklake.query(
        "SELECT count(DISTINCT rank) AS ranks, count(*) FILTER (WHERE key = "
        "'critic/score/mean') AS scores, (SELECT count(*) FROM generations) AS gens, "
        "(SELECT count(*) FROM traces) AS spans FROM metrics", root=root).to_pylist()[0]
    assert counts == {"ranks": 2, "scores": 240, "gens": 8, "spans": 4}
    assert not list(root.rglob("*.arrows"))  # everything was compacted


def test_show_draws_each_keys_curve_beside_its_summary(root: Path) -> None:
    """A rising key rises left to right, a falling one falls, a flat one is flat; NaN is
    left out of the curve."""
    with tracklake.init(project="p", run_id="curves", root=root,
                        capture_identity=False) as run:
        for step in range(160):
            run.log({"up": float(step), "down": -float(step), "flat": 1.0,
                     "holes": float("nan") if step < 80 else float(step)}, step=step)
    code, out = invoke("show", "curves", "--root", str(root))
    assert code == 0 and "trend" in out
    levels = UNICODE_LEVELS if "█" in out else ASCII_LEVELS

    def curve(key: str) -> str:
        row = next(line for line in out.splitlines() if f" {key} " in line)
        cells = [c.strip() for c in row.split("│") if c.strip()]
        return cells[-1]

    up, down = curve("up"), curve("down")
    assert len(up) == WIDTH and up[0] == levels[0] and up[-1] == levels[-1]
    assert [levels.index(c) for c in up] == sorted(levels.index(c) for c in up)
    assert down == up[::-1]
    assert len(set(curve("flat"))) == 1
    holes = next(line for line in out.splitlines() if " holes " in line).rstrip(" │")
    drawn = holes[-WIDTH:]  # the NaN half draws nothing; the rest rises over its own range
    assert drawn[: WIDTH // 2].strip() == "" and drawn[WIDTH // 2] == levels[0]
    assert drawn[-1] == levels[-1]


def test_a_sparkline_falls_back_to_ascii_and_leaves_gaps() -> None:
    points = [(0, 0.0), (1, None), (2, 5.0), (3, 10.0)]
    assert sparkline(points, unicode=True) == "▁ ▅█"
    assert sparkline(points, unicode=False) == "_ =#"
    assert sparkline([], unicode=True) == ""
    assert sparkline([(0, -1e308), (1, 0.0), (2, 1e308)]) == "▁▅█"  # no overflow
    assert sparkline([(0, 5e-324), (1, 0.0)]) == "█▁"


@pytest.mark.parametrize(("args", "missing"), [(("show",), "'RUN'"),
                                               (("diff", "a"), "'RUN_B'"),
                                               (("report",), "'RUNS...'")])
def test_a_missing_argument_is_named_in_the_error(args: tuple[str, ...], missing: str) -> None:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 2
    assert f"tracklake: error: Missing argument {missing}." in result.stderr


def test_every_commands_help_names_the_default_root_it_uses() -> None:
    """The default root is ./tracklake-store wherever a --root option says one."""
    from tracklake._format.naming import DEFAULT_ROOT

    def commands(group: click.Group, prefix: tuple[str, ...] = ()
                 ) -> list[tuple[str, ...]]:
        found = []
        ctx = click.Context(group)
        for name in group.list_commands(ctx):  # commands load on first use
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                found += commands(command, (*prefix, name))
            else:
                found.append((*prefix, name))
        return found

    checked = 0
    for path in commands(main):
        result = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
        text = " ".join(result.output.split())
        if "--root" not in text or "else ./" not in text:
            continue
        checked += 1
        assert f"else ./{DEFAULT_ROOT})" in text or path == ("demo",), (path, text)
    assert checked >= 12


@pytest.mark.parametrize("command", ["compact", "demo"])
def test_commands_that_write_refuse_a_url_root_at_once(command: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(main, [command, "--root", "s3://bucket/store"])
    assert result.exit_code == 1
    assert "writes the store" in result.output and "s3://bucket/store" in result.output
    monkeypatch.setenv("TRACKLAKE_ROOT", "s3://bucket/store")
    result = CliRunner().invoke(main, [command])
    assert result.exit_code == 1 and "writes the store" in result.output
    assert "URL" not in CliRunner().invoke(main, [command, "--help"]).output


def test_a_directory_that_is_not_a_store_is_refused_by_readers_and_compaction(
        tmp_path: Path) -> None:
    """An empty or unmounted mount point is no store: before, `runs` said "no runs",
    `fsck` "clean", `compact` wrote `.cache/` into it and `query` answered 0."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    (mount / "lost+found").mkdir()
    for args in (["runs"], ["fsck"], ["compact"], ["sql", "SELECT count(*) FROM metrics"],
                 ["retain", "--keep-last", "1"]):
        code, out = invoke(*args, "--root", str(mount))
        assert code == 1, (args, out)
        assert "not a tracklake store" in out and str(mount) in out, (args, out)
    with pytest.raises(tracklake.StoreError, match="not a tracklake store"):
        tracklake.query("SELECT 1", root=mount)
    with pytest.raises(tracklake.StoreError, match="not a tracklake store"):
        tracklake.compact(root=mount)
    assert sorted(p.name for p in mount.iterdir()) == ["lost+found"]  # nothing written
    with tracklake.init(project="p", run_id="r", root=mount) as run:  # init makes one
        run.log({"x": 1.0}, step=0)
    code, out = invoke("runs", "--root", str(mount))
    assert code == 0 and "r" in out


def test_two_demo_runs_draw_two_curves(root: Path) -> None:
    """Seeded by run: the first comparison a user makes shows two curves, not one."""
    for _ in range(2):
        code, out = invoke("demo", "--root", str(root), "--ranks", "1", "--steps", "50")
        assert code == 0, out
    curves = tracklake.query(
        "SELECT run, list(value ORDER BY step) AS v FROM metrics "
        "WHERE key = 'critic/score/mean' GROUP BY run", root=root).to_pylist()
    assert len(curves) == 2 and curves[0]["v"] != curves[1]["v"]


def test_show_lists_at_most_max_keys_and_the_keys_a_glob_picks(root: Path) -> None:
    """A run of many keys: `show` lists the first --max-keys (in key order), says how
    many it left out and how to see them; --key narrows by glob, --max-keys 0 lists all."""
    with tracklake.init(project="p", run_id="wide", root=root, capture_identity=False) as run:
        for step in range(3):
            run.log({f"layer{k % 3}/k{k:02d}": float(k + step) for k in range(12)}, step=step)
    width = ["--root", str(root)]

    def listed(out: str) -> list[str]:
        return sorted(w for w in out.split() if "/k" in w)

    code, out = invoke("show", "wide", *width, "--max-keys", "4")
    assert code == 0
    assert listed(out) == ["layer0/k00", "layer0/k03", "layer0/k06", "layer0/k09"]
    assert "4 of 12 keys shown" in " ".join(out.split())
    code, out = invoke("show", "wide", *width, "--key", "layer1/*")
    assert listed(out) == ["layer1/k01", "layer1/k04", "layer1/k07", "layer1/k10"]
    assert "4 of 12 keys shown (4 match layer1/*)" in " ".join(out.split())
    code, out = invoke("show", "wide", *width, "--max-keys", "0")
    assert len(listed(out)) == 12 and "keys shown" not in out


@pytest.mark.parametrize(("command", "option", "what"), [
    (["runs"], "--project", "project"), (["compact"], "--project", "project"),
    (["compact"], "--run", "run"), (["pack", "-o", "x.tar"], "--project", "project"),
    (["show", "run-a"], "--project", "project"), (["pin", "run-a"], "--project", "project"),
    (["unpin", "run-a"], "--project", "project"),
    (["watch", "run-a", "--once"], "--project", "project"),
    (["plot", "run-a", "--key", "loss"], "--project", "project"),
    (["report", "run-a", "-o", "r.html"], "--project", "project"),
    (["backup", "BACKUP"], "--project", "project"), (["backup", "BACKUP"], "--run", "run")])
def test_an_empty_id_is_refused_not_read_as_every_one(
        store: Path, tmp_path: Path, command: list[str], option: str, what: str) -> None:
    """`--project "$P"` with P unset selects no project, not every one (nor, where a
    command finds a run by its id alone, whichever project holds it)."""
    before = sorted(p.name for p in store.rglob("*"))
    command = [str(tmp_path / "backup") if a == "BACKUP" else a for a in command]
    code, out = invoke(*command, "--root", str(store), option, "")
    assert code == 2 and f"an empty {what} id names no {what}" in out, out
    assert sorted(p.name for p in store.rglob("*")) == before


def test_max_rows_0_shows_every_row_and_a_negative_one_is_refused(store: Path) -> None:
    """`--max-rows 0` shows every row (as `show --max-keys 0` lists every key), where it
    printed an empty table and "(more rows…)"; -1 is a usage error."""
    code, out = invoke("sql", "SELECT * FROM range(150)", "--root", str(store),
                       "--max-rows", "0")
    assert code == 0 and "more rows" not in out
    shown = [line.strip("│ ") for line in out.splitlines() if line.startswith("│")]
    assert [int(x) for x in shown] == list(range(150))
    code, out = invoke("sql", "SELECT * FROM range(150)", "--root", str(store))
    assert "(more rows; raise --max-rows" in out
    code, out = invoke("sql", "SELECT 1", "--root", str(store), "--max-rows", "-1")
    assert code == 2 and "-1 is not in the range" in out
