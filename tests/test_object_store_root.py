"""A store copied to an object store (a real S3 server on loopback) answers `runs`, `show`,
`sql`, `tracklake.query` and `export tensorboard` exactly like the local store; a root
there that is missing or unreadable is an error naming it, and writing there is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _optional import optional
from _s3 import S3Server
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main

pytestmark = pytest.mark.filterwarnings("error")


def _store(root: Path) -> None:
    """Two runs: `a` compacted and then resumed (a second attempt logging steps again,
    live), `b` live only, with texts, a config and an artifact."""
    with tracklake.init(project="p", run_id="a", root=root, capture_identity=False,
                        config={"lr": 0.1}) as run:
        for step in range(20):
            run.log({"loss": 1.0 / (step + 1), "acc": step / 10}, step=step)
        run.log_text("notes", "first attempt", step=3)
    tracklake.compact(root=root)
    with tracklake.init(project="p", run_id="a", root=root, capture_identity=False,
                        config={"lr": 0.05}) as run:
        for step in range(15, 25):
            run.log({"loss": 10.0 + step, "acc": -1.0}, step=step)
    with tracklake.init(project="p", run_id="0042", root=root, capture_identity=False) as run:
        for step in range(7):
            run.log({"loss": float(step)}, step=step)
        run.log_artifact(b"weights", name="model.bin")


def _upload(local: Path, s3: S3Server, bucket: str) -> str:
    fs = optional("pyarrow.fs")
    fs.copy_files(str(local), f"{bucket}/lab/store",
                  destination_filesystem=s3.filesystem())
    return f"s3://{bucket}/lab/store"


@pytest.fixture
def stores(tmp_path: Path, s3_bucket: str, s3_env: S3Server) -> tuple[str, str]:
    local = tmp_path / "store"
    _store(local)
    return str(local), _upload(local, s3_env, s3_bucket)


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def _lines(text: str) -> list[str]:
    """The words of each line (a title naming a longer root is centred differently)."""
    return [" ".join(line.split()) for line in text.splitlines()]


QUESTIONS = [
    "SELECT run, count(*) AS n, sum(value) AS s FROM metrics GROUP BY run ORDER BY run",
    "SELECT project, run, rank, key, count, min, max, last_value FROM metric_summaries "
    "ORDER BY ALL",
    "SELECT run, status, attempts, ranks FROM runs ORDER BY run",
    "SELECT run, attempt, config FROM run_attempts ORDER BY ALL",
    "SELECT run, step, key, text FROM texts ORDER BY ALL",
    "SELECT run, name, digest, size FROM artifacts ORDER BY ALL",
    "SELECT count(*) AS n FROM metrics_all",
]


@pytest.mark.parametrize("sql", QUESTIONS)
def test_query_over_s3_answers_like_the_local_store(stores: tuple[str, str], sql: str) -> None:
    local, remote = stores
    expected = tracklake.query(sql, root=local)
    assert expected.num_rows > 0
    assert tracklake.query(sql, root=remote).equals(expected)


def test_connect_over_s3_reads_the_parts_through_pyarrow(stores: tuple[str, str]) -> None:
    local, remote = stores
    sql = "SELECT run, max(step) AS last FROM metrics GROUP BY run ORDER BY run"
    with tracklake.connect(remote) as con:
        assert con.sql(sql).fetchall() == [("0042", 6), ("a", 24)]
    assert tracklake.query(sql, root=local).to_pylist() == [
        {"run": "0042", "last": 6}, {"run": "a", "last": 24}]


def test_cli_runs_show_and_sql_over_s3_print_what_the_local_store_prints(
        stores: tuple[str, str]) -> None:
    local, remote = stores
    for args in (["runs"], ["show", "a"], ["show", "0042"],
                 ["sql", QUESTIONS[0], "--format", "json"]):
        here = _cli(*args, "--root", local)
        there = _cli(*args, "--root", remote)
        assert here[0] == 0 and there[0] == 0, (args, here, there)
        assert _lines(there[1].replace(remote, local)) == _lines(here[1]), args
    rows = [json.loads(line) for line in _cli("sql", QUESTIONS[0], "--root", remote,
                                              "--format", "json")[1].splitlines()]
    assert [r["run"] for r in rows] == ["0042", "a"] and rows[1]["n"] == 40 + 10


def test_export_tensorboard_from_s3_writes_what_the_local_export_writes(
        stores: tuple[str, str], tmp_path: Path) -> None:
    accumulator = optional("tensorboard.backend.event_processing.event_accumulator")
    local, remote = stores
    scalars = {}
    for name, root in (("local", local), ("remote", remote)):
        logdir = tmp_path / f"tb-{name}"
        code, _, err = _cli("export", "tensorboard", "--root", root, "--all",
                            "--logdir", str(logdir), "--state-dir", str(tmp_path / name))
        assert code == 0, err
        got = {}
        for run in ("a", "0042"):
            acc = accumulator.EventAccumulator(str(logdir / "p" / run),
                                               size_guidance={accumulator.SCALARS: 0})
            acc.Reload()
            got[run] = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
                        for tag in acc.Tags()["scalars"]}
        scalars[name] = got
    assert scalars["remote"] == scalars["local"]
    # attempt 2 logged steps 15-24 again: each step once, as the views show it
    steps = [s for s, _ in scalars["local"]["a"]["loss"]]
    assert sorted(steps) == list(range(25))


def test_export_from_s3_needs_a_state_dir(stores: tuple[str, str], tmp_path: Path) -> None:
    _, remote = stores
    code, _, err = _cli("export", "tensorboard", "--root", remote, "--all",
                        "--logdir", str(tmp_path / "tb"))
    assert code != 0 and "--state-dir" in err and remote in err


def test_a_missing_prefix_or_bucket_is_an_error_naming_it(s3_bucket: str) -> None:
    for root in (f"s3://{s3_bucket}/no/store/here", "s3://tl-no-such-bucket-anywhere/store"):
        with pytest.raises(tracklake.StoreError, match=root):
            tracklake.query("SELECT count(*) FROM metrics", root=root)
        code, _, err = _cli("runs", "--root", root)
        assert code == 1 and root in err


def test_unreadable_credentials_are_an_error_not_an_empty_answer(
        stores: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, remote = stores
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(tracklake.StoreError, match=remote):
        tracklake.query("SELECT count(*) FROM metrics", root=remote)


def test_writing_to_an_object_store_root_is_refused_naming_it(stores: tuple[str, str]
                                                               ) -> None:
    _, remote = stores
    with pytest.raises(tracklake.StoreError, match=f"{remote}.*read-only"):
        tracklake.init(project="p", run_id="c", root=remote, capture_identity=False)
    with pytest.raises(tracklake.StoreError, match=remote):
        tracklake.compact(root=remote)
    code, _, err = _cli("compact", "--root", remote)
    assert code == 1 and remote in err and "read-only" in err


def test_a_trailing_slash_and_a_file_url_name_the_same_stores(stores: tuple[str, str]) -> None:
    local, remote = stores
    sql = QUESTIONS[0]
    expected = tracklake.query(sql, root=local)
    assert tracklake.query(sql, root=remote + "/").equals(expected)
    assert tracklake.query(sql, root=f"file://{local}").equals(expected)


def test_blobs_of_a_store_in_s3_open_through_its_file_system(stores: tuple[str, str]) -> None:
    from tracklake.read import open_blob

    _, remote = stores
    digest = tracklake.query("SELECT digest FROM artifacts", root=remote).to_pylist()[0]
    with open_blob(remote, digest["digest"]) as f:
        assert f.read() == b"weights"
