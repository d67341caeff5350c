"""Retention: policies from TOML and flags, the dry-run plan, every rule and how they
compose, live and unexported data left alone, pins, the audit log, and crash safety."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import tracklake
from tracklake._cli.main import main
from tracklake._format import SCHEMAS, blob_path
from tracklake._format.attempt import read_attempt, write_attempt
from tracklake._format.part import open_part, summary_rows
from tracklake._ops.retention import (
    AUDIT_STREAM,
    BestRule,
    Policy,
    PolicyError,
    apply_plan,
    audit_records,
    load_policy,
    make_plan,
    parse_duration,
    parse_size,
    pin,
)
from tracklake._ops.retention.apply import KILL_AT_ENV, _downsample_table
from tracklake.exporters import MemoryDestination, Selection, export

DAY = 86400.0
STEPS = 40


def now() -> float:
    return _dt.datetime.now(_dt.timezone.utc).timestamp()


def make_run(root: Path, run_id: str, *, project: str = "p", score: float = 0.0,
             tags: tuple[str, ...] = (), artifact: bytes | None = None,
             ended_days_ago: float = 0.0, finish: bool = True) -> tracklake.Run:
    """A one-rank run with metrics, a text, generations, a trace and an artifact, compacted
    and made to look as if it ended `ended_days_ago` days ago."""
    run = tracklake.init(project=project, run_id=run_id, root=root, tags=list(tags),
                         config={"lr": 1e-4, "seed": 1},
                         capture_identity=False)
    for step in range(STEPS):
        run.log({"loss": 1.0 / (step + 1), "score": score + step / 100}, step=step)
    run.log_text("note", f"{run_id} text", step=STEPS - 1)
    run.log_generations([{"input": "q", "output": "a", "score": 1.0}], step=STEPS - 1)
    with run.span("rollout", step=STEPS - 1):
        pass
    run.log_artifact(artifact if artifact is not None else run_id.encode() * 10,
                     name="ckpt.bin")
    if not finish:
        run.flush()
        return run
    run.finish()
    tracklake.compact(root=root, run=run_id)
    if ended_days_ago:
        age(root, project, run_id, ended_days_ago)
    return run


def age(root: Path, project: str, run_id: str, days: float) -> None:
    """Move a run's recorded times `days` into the past (its attempt files)."""
    for path in (root / "runs" / f"project={project}" / f"run={run_id}").rglob("*.json"):
        record = read_attempt(path)
        assert record is not None
        for key in ("started_at", "heartbeat_at", "finished_at"):
            if record.get(key):
                t = _dt.datetime.fromisoformat(record[key]) - _dt.timedelta(days=days)
                record[key] = t.isoformat()
        record.pop("format")
        write_attempt(path, record)


def counts(root: Path) -> dict[tuple[str, str], int]:
    """Rows per (run, kind) of the user projects, from one SQL query."""
    sql = " UNION ALL ".join(
        f"SELECT run, '{kind}' AS kind, count(*) AS n FROM {kind}_all "
        "WHERE project <> '_tracklake' GROUP BY run"
        for kind in ("metrics", "texts", "generations", "traces", "artifacts", "configs"))
    return {(r["run"], r["kind"]): r["n"] for r in tracklake.query(sql, root=root).to_pylist()}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


# -- policies ----------------------------------------------------------------------------

def test_policy_file_holds_every_rule(root: Path) -> None:
    (root / "tracklake.toml").write_text("""
[retention]
keep_last = 5
max_age = "90d"
max_size = "1.5GiB"
best = { metric = "critic/score/mean", mode = "max", k = 3 }
drop_after = "2w"
drop_kinds = ["traces", "generations"]
downsample_after = "12h"
downsample_every = 4
""")
    assert load_policy(root) == Policy(
        keep_last=5, max_age=90 * DAY, max_size=int(1.5 * 2**30),
        best=BestRule("critic/score/mean", "max", 3), drop_after=14 * DAY,
        drop_kinds=("traces", "generations"), downsample_after=12 * 3600,
        downsample_every=4)


@pytest.mark.parametrize(("text", "needle"), [
    ('max_agee = "1d"', "max_agee"),
    ('max_age = "soon"', "max_age"),
    ('drop_kinds = ["metrics"]', "drop_kinds"),
    ('best = { metric = "x", mode = "median" }', "best"),
    ("keep_last = -1", "keep_last"),
    ("keep_last = [", "not valid TOML"),
])
def test_a_bad_policy_file_names_the_key(root: Path, text: str, needle: str) -> None:
    (root / "tracklake.toml").write_text(f"[retention]\n{text}\n")
    with pytest.raises(PolicyError, match=needle) as info:
        load_policy(root)
    assert "tracklake.toml" in str(info.value)


def test_durations_and_sizes() -> None:
    assert parse_duration("30m", "x") == 1800
    assert parse_duration("1.5d", "x") == 1.5 * DAY
    assert parse_size("500GB", "x") == 500 * 10**9
    assert parse_size("2KiB", "x") == 2048
    assert parse_size("4096", "x") == 4096
    with pytest.raises(PolicyError, match="--max-size"):
        parse_size("lots", "--max-size")


# -- the plan and the rules ---------------------------------------------------------------

def test_a_dry_run_prints_the_plan_and_changes_nothing(root: Path) -> None:
    make_run(root, "old", ended_days_ago=100)
    make_run(root, "new")
    before = snapshot(root)
    result = CliRunner().invoke(main, ["retain", "--root", str(root), "--max-age", "30d"])
    assert result.exit_code == 0, result.output
    assert "delete" in result.output and "p/old" in result.output
    assert "rule=max_age" in result.output and "ended 100.0 d ago" in result.output
    assert "p/new" not in result.output
    assert snapshot(root) == before


def test_no_rule_at_all_is_an_error(root: Path) -> None:
    make_run(root, "a")
    result = CliRunner().invoke(main, ["retain", "--root", str(root)])
    assert result.exit_code == 1
    assert "no retention rule" in result.output


def test_every_rule_composes_in_the_documented_order(root: Path) -> None:
    """keep_last/max_age delete, best K and pins protect, drop and downsample thin what
    stays, max_size deletes the oldest of the rest; live runs are skipped."""
    make_run(root, "r1", score=0.9, ended_days_ago=60)  # best by score: kept, thinned
    make_run(root, "r2", ended_days_ago=50, tags=("keep",))  # pinned by tag
    make_run(root, "r3", ended_days_ago=40)  # max_age
    make_run(root, "r4", ended_days_ago=20)  # 5th newest: beyond keep_last
    make_run(root, "r5", ended_days_ago=10)  # dropped and downsampled, then max_size
    make_run(root, "r6", ended_days_ago=9)  # dropped and downsampled
    make_run(root, "r7", ended_days_ago=0.5)  # recent
    live = make_run(root, "r8", finish=False)
    pin(root, "p", "r7")
    policy = Policy(keep_last=4, max_age=35 * DAY, best=BestRule("score", "max", 1),
                    drop_after=7 * DAY, downsample_after=7 * DAY, downsample_every=5)
    policy_sized = Policy(**{**policy.__dict__,
                             "max_size": 10**12})  # generous: deletes nothing more
    plan = make_plan(root, policy_sized, now())
    got = {(a.verb, a.run, a.rule) for a in plan.actions}
    assert got == {("delete", "r3", "max_age"), ("delete", "r4", "keep_last"),
                   ("drop", "r1", "drop_after"), ("drop", "r5", "drop_after"),
                   ("drop", "r6", "drop_after"), ("downsample", "r1", "downsample_after"),
                   ("downsample", "r5", "downsample_after"),
                   ("downsample", "r6", "downsample_after")}
    assert [(s.run, s.reason.split(":")[0]) for s in plan.skipped] == [("r8", "live")]
    assert dict(plan.kept) == {"p/r1": pytest.approx(dict(plan.kept)["p/r1"]),
                               "p/r2": "pinned (`tracklake pin` or a `keep` tag)",
                               "p/r7": "pinned (`tracklake pin` or a `keep` tag)"}
    assert dict(plan.kept)["p/r1"].startswith("best: #1")
    # a size limit that r5 alone exceeds: the oldest deletable run goes (r1 is best)
    tight = Policy(**{**policy.__dict__, "max_size": plan.store_bytes - plan.freed - 1})
    plan = make_plan(root, tight, now())
    assert ("delete", "r5", "max_size") in {(a.verb, a.run, a.rule) for a in plan.actions}
    assert not [a for a in plan.actions if a.run == "r5" and a.verb != "delete"]

    report = apply_plan(root, plan, now())
    assert len(report.done) == len(plan.actions)
    left = counts(root)
    runs_left = {run for run, _ in left}
    assert runs_left == {"r1", "r2", "r6", "r7", "r8"}
    for run in ("r1", "r6"):
        assert (run, "traces") not in left and (run, "generations") not in left
        assert (run, "artifacts") not in left and (run, "texts") not in left
        assert left[(run, "metrics")] < 2 * STEPS  # thinned
        assert left[(run, "configs")] == left[("r2", "configs")]
    assert left[("r2", "metrics")] == left[("r7", "metrics")] == 2 * STEPS
    assert left[("r2", "traces")] == 1
    assert {r["run"] for r in tracklake.query("SELECT run FROM runs", root=root).to_pylist()} \
        == runs_left
    audit = audit_records(root)
    assert sorted((a["action"], a["run"], a["rule"]) for a in audit) == sorted(
        (a.verb, a.run, a.rule) for a in plan.actions)
    assert all(a["user"] and a["host"] and a["at"] for a in audit)
    live.finish()


def test_a_live_run_is_never_touched(root: Path) -> None:
    make_run(root, "done", ended_days_ago=3)
    live = make_run(root, "live", finish=False)
    plan = make_plan(root, Policy(keep_last=0, drop_after=0.0, downsample_after=0.0), now())
    assert {a.run for a in plan.actions} == {"done"}
    (skip,) = plan.skipped
    assert skip.run == "live" and "running (heartbeat" in skip.reason
    apply_plan(root, plan, now())
    assert counts(root)[("live", "metrics")] == 2 * STEPS
    live.finish()


def test_a_run_resumed_after_planning_is_left_alone(root: Path) -> None:
    make_run(root, "r", ended_days_ago=3)
    plan = make_plan(root, Policy(keep_last=0), now())
    assert [a.run for a in plan.actions] == ["r"]
    resumed = tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    report = apply_plan(root, plan, now())
    assert report.skipped and "became live" in report.skipped[0][1]
    assert not report.done
    resumed.finish()


def test_unexported_data_is_kept_unless_forced(root: Path) -> None:
    make_run(root, "sent", ended_days_ago=3)
    make_run(root, "behind", ended_days_ago=3)
    export(MemoryDestination(), root=root, selection=Selection(all_runs=True))
    # the run goes on in a new attempt the exporter has not seen
    with tracklake.init(project="p", run_id="behind", root=root,
                        capture_identity=False) as run:
        run.log({"loss": 0.0}, step=STEPS)
    age(root, "p", "behind", 3)
    plan = make_plan(root, Policy(keep_last=0), now())
    assert [a.run for a in plan.actions] == ["sent"]
    (skip,) = plan.skipped
    assert skip.run == "behind" and "not exported yet" in skip.reason
    assert "0/2/metrics" in skip.reason and "--force p/behind" in skip.reason
    # drops of kinds it has exported are allowed; metrics it has not are not thinned
    plan = make_plan(root, Policy(drop_after=DAY, downsample_after=DAY), now())
    assert {(a.verb, a.run) for a in plan.actions} == {
        ("drop", "sent"), ("drop", "behind"), ("downsample", "sent")}
    result = CliRunner().invoke(main, ["retain", "--root", str(root), "--keep-last", "0",
                                       "--apply", "--force", "p/behind"])
    assert result.exit_code == 0, result.output
    assert "[forced]" in result.output
    assert counts(root) == {}
    assert {a["run"]: a["forced"] for a in audit_records(root)} == {"sent": False,
                                                                    "behind": True}


def test_pin_and_unpin_from_the_cli(root: Path) -> None:
    make_run(root, "r", ended_days_ago=3)
    runner = CliRunner()
    assert runner.invoke(main, ["pin", "r", "--root", str(root)]).exit_code == 0
    assert not make_plan(root, Policy(keep_last=0, drop_after=0.0), now()).actions
    result = runner.invoke(main, ["unpin", "r", "--root", str(root)])
    assert result.exit_code == 0 and "unpinned p/r" in result.output
    assert make_plan(root, Policy(keep_last=0), now()).actions
    result = runner.invoke(main, ["pin", "nope", "--root", str(root)])
    assert result.exit_code == 1 and "no run 'nope'" in result.output


def test_blobs_go_with_their_last_run_only(root: Path) -> None:
    make_run(root, "a", artifact=b"shared weights", ended_days_ago=5)
    make_run(root, "b", artifact=b"shared weights", ended_days_ago=5)
    make_run(root, "c", artifact=b"own weights", ended_days_ago=5)
    shared = blob_path(root, hashlib.sha256(b"shared weights").hexdigest())
    own = blob_path(root, hashlib.sha256(b"own weights").hexdigest())
    plan = make_plan(root, Policy(drop_after=DAY, drop_kinds=("artifacts",)), now())
    plan.actions = [a for a in plan.actions if a.run in ("a", "c")]
    apply_plan(root, plan, now())
    assert shared.exists() and not own.exists()
    apply_plan(root, make_plan(root, Policy(keep_last=0), now()), now())
    assert not shared.exists()


def test_the_audit_log_is_in_sql_and_outlives_the_runs(root: Path) -> None:
    make_run(root, "gone", ended_days_ago=5)
    result = CliRunner().invoke(main, ["retain", "--root", str(root), "--max-age", "1d",
                                       "--apply"])
    assert result.exit_code == 0, result.output
    rows = tracklake.query(
        "SELECT title, json_extract_string(text, '$.rule') AS rule, "
        "CAST(json_extract(text, '$.bytes') AS BIGINT) AS bytes, "
        "json_extract_string(text, '$.user') AS who FROM events "
        f"WHERE project = '{AUDIT_STREAM.project}' AND kind = 'retention'",
        root=root).to_pylist()
    assert [(r["title"], r["rule"]) for r in rows] == [("delete p/gone", "max_age")]
    assert rows[0]["bytes"] > 0 and rows[0]["who"]
    assert tracklake.query("SELECT count(*) AS n FROM runs", root=root).column(0)[0].as_py() == 0
    result = CliRunner().invoke(main, ["retain", "--root", str(root), "--log"])
    assert "delete" in result.output and "p/gone" in result.output


# -- downsampling -------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                 st.just(math.nan)), min_size=1, max_size=60),
       every=st.integers(2, 7))
def test_downsampling_keeps_every_kth_step_and_each_keys_extremes(values: list[float],
                                                                   every: int) -> None:
    schema = SCHEMAS["metrics"]
    n = len(values)
    table = pa.table({"seq": list(range(2 * n)), "time": [0] * (2 * n),
                      "step": [i for i in range(n) for _ in (0, 1)],
                      "key": ["a", "b"] * n,
                      "value": [v for v in values for v in (v, -v)]},
                     schema=schema.remove_metadata())
    out = _downsample_table(table, every)
    rows = set(zip(*(out.column(c).to_pylist() for c in ("seq", "step", "key")), strict=True))
    original = set(zip(*(table.column(c).to_pylist() for c in ("seq", "step", "key")),
                       strict=True))
    assert rows <= original
    for key in ("a", "b"):
        mine = [r for r in table.to_pylist() if r["key"] == key]
        kept = {r[0] for r in rows if r[2] == key}
        assert mine[0]["seq"] in kept and mine[-1]["seq"] in kept
        assert {r["seq"] for r in mine if r["step"] % every == 0} <= kept
        finite = [r for r in mine if not math.isnan(r["value"])]
        if finite:
            top = max(r["value"] for r in finite)
            low = min(r["value"] for r in finite)
            assert any(r["value"] == top for r in finite if r["seq"] in kept)
            assert any(r["value"] == low for r in finite if r["seq"] in kept)


def test_downsampled_parts_are_marked_and_not_thinned_twice(root: Path) -> None:
    make_run(root, "r", ended_days_ago=3)
    policy = Policy(downsample_after=DAY, downsample_every=4)
    apply_plan(root, make_plan(root, policy, now()), now())
    (part,) = (root / "metrics").rglob("part-*.parquet")
    meta = pq.read_schema(part).metadata
    assert json.loads(meta[b"tracklake.downsampled"])["every"] == 4
    summary = summary_rows(open_part(part), part)  # stored, or from the rows of a small part
    assert {s["key"]: s["count"] for s in summary} == {"loss": 11, "score": 11}  # 0, 4, ..., 36, 39
    assert not make_plan(root, policy, now()).actions
    values = tracklake.query("SELECT step FROM metrics WHERE key = 'loss' ORDER BY step",
                             root=root).column(0).to_pylist()
    assert values == [*range(0, STEPS, 4), STEPS - 1]


# -- crash safety -------------------------------------------------------------------------

def _crash_store(root: Path) -> None:
    make_run(root, "del1", ended_days_ago=40)
    make_run(root, "del2", ended_days_ago=39)
    make_run(root, "thin", ended_days_ago=10)
    make_run(root, "keep", ended_days_ago=0.1)


_RETAIN = """
import datetime, sys
from pathlib import Path
from tracklake._ops.retention import Policy, apply_plan, make_plan
root = Path(sys.argv[1])
policy = Policy(max_age=30 * 86400.0, drop_after=5 * 86400.0, downsample_after=5 * 86400.0)
now = datetime.datetime.now(datetime.timezone.utc).timestamp()
apply_plan(root, make_plan(root, policy, now), now)
"""


def _retain(root: Path, kill_at: int | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    if kill_at is not None:
        env[KILL_AT_ENV] = str(kill_at)
    return subprocess.Popen([sys.executable, "-c", _RETAIN, str(root)], env=env)


def _reader(root: Path, proc: subprocess.Popen[bytes], before: dict[tuple[str, str], int],
            after: dict[tuple[str, str], int], problems: list[str]) -> None:
    """Query while `proc` runs; note every answer that is neither the old nor the new
    state of some run's kind."""
    while proc.poll() is None:
        try:
            seen = counts(root)
        except FileNotFoundError:
            continue  # a file the snapshot listed was moved before it was read: no answer
        except (tracklake.QueryError, duckdb.Error) as exc:
            # a file listed by the query's snapshot was moved before DuckDB opened it: the
            # query fails (it never returns a half-deleted run); a retry sees the new state
            if not any(m in str(exc) for m in ("No such file", "No files found")):
                problems.append(f"reader failed: {exc}")
            continue
        for key, n in before.items():
            if seen.get(key, 0) not in (n, after.get(key, 0)):
                problems.append(f"{key}: {seen.get(key, 0)} rows, expected {n} or "
                                f"{after.get(key, 0)}")


@dataclass
class CrashCase:
    template: Path
    before: dict[tuple[str, str], int]
    after: dict[tuple[str, str], int]


@pytest.fixture(scope="module")
def crash_case(tmp_path_factory: pytest.TempPathFactory) -> CrashCase:
    """A store with two runs to delete and one to thin, and the answers before and after a
    retain that nobody killed."""
    template = tmp_path_factory.mktemp("crash") / "template"
    template.mkdir()
    _crash_store(template)
    clean = template.parent / "clean"
    shutil.copytree(template, clean)
    assert _retain(clean, None).wait() == 0
    return CrashCase(template, counts(template), counts(clean))


def _kill_and_finish(case: CrashCase, root: Path, kill_at: int) -> int:
    """SIGKILL a retain at its `kill_at`-th step while a reader queries; every answer the
    reader got must be the old or the new state; a re-run must reach the clean result."""
    shutil.copytree(case.template, root)
    proc = _retain(root, kill_at)
    problems: list[str] = []
    reader = threading.Thread(target=_reader, args=(root, proc, case.before, case.after,
                                                    problems))
    reader.start()
    code = proc.wait()
    reader.join()
    assert not problems, problems
    assert _retain(root, None).wait() == 0
    assert counts(root) == case.after
    assert [p.name for p in (root / "trash").iterdir()] == []
    audit = audit_records(root)
    assert sorted((a["action"], a["run"]) for a in audit) == [
        ("delete", "del1"), ("delete", "del2"), ("downsample", "thin"), ("drop", "thin")]
    return code


@pytest.mark.slow
def test_killed_mid_apply_a_rerun_finishes_the_job(crash_case: CrashCase,
                                                   tmp_path: Path) -> None:
    assert _kill_and_finish(crash_case, tmp_path / "s", 7) == -signal.SIGKILL


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(kill_at=st.integers(1, 45))
def test_killed_at_random_steps_readers_see_old_or_new_and_a_rerun_finishes(
        crash_case: CrashCase, kill_at: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _kill_and_finish(crash_case, Path(tmp) / "s", kill_at)


def test_a_damaged_summary_never_picks_the_best_runs(root: Path) -> None:
    """Best-K reads the parts' metric summaries: one whose footer no longer verifies is an
    error naming the part, not a value that could protect the wrong run."""
    from tracklake._errors import FormatError
    from tracklake._ops.retention.inventory import metric_extreme

    make_run(root, "r", score=0.5)
    (part,) = (root / "metrics").rglob("*.parquet")
    data = bytearray(part.read_bytes())
    at = data.rfind(b"score")
    data[at] ^= 0x01  # the key's name in the footer (summary or statistics): another key
    part.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=str(part)):
        metric_extreme(root, "p", "r", "score", "max")
