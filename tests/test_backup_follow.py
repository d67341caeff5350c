"""Selective backup and restore, `backup --follow` of a live run, and retention that
requires a backup: what each backup holds is recorded in the store, and data no backup
holds is not removed unless `--force` names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _backup_store import answers, log_run, make_store
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._ops.backup import (
    MANIFEST,
    BackupError,
    Selection,
    backup,
    backups,
    follow,
    read_manifest,
)
from tracklake._ops.retention import Policy, make_plan

#: How long a test waits for a child process before it calls it hung (not a timing
#: assertion: a healthy run takes a fraction of it).
HANG = 120.0


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = make_store(tmp_path / "store")
    log_run(root, "other", project="side")
    return root


def test_a_selected_backup_holds_only_those_runs_and_their_blobs(store: Path,
                                                                 tmp_path: Path) -> None:
    dest = tmp_path / "b"
    result = CliRunner().invoke(main, ["backup", str(dest), "--root", str(store),
                                       "--run", "bk/one"])
    assert result.exit_code == 0, result.output
    files = read_manifest(dest)["files"]
    runs = {rel.split("/")[2] for rel in files if "/run=" in rel}
    assert runs == {"run=one"}
    blobs = [rel for rel in files if rel.startswith("blobs/")]
    assert len(blobs) == 1 and files[blobs[0]]["runs"] == ["bk/one"]
    one = "SELECT * FROM metrics WHERE run = 'one' ORDER BY ALL"
    assert tracklake.query(one, root=dest).to_pylist() == tracklake.query(
        one, root=store).to_pylist()
    by_project = backup(store, tmp_path / "p", selection=Selection.of(projects=["side"]))
    assert by_project.copied and all("project=side" in r or r.startswith("blobs/")
                                     for r in by_project.copied)


def test_a_selected_restore_takes_one_run_out_of_a_full_backup(store: Path,
                                                               tmp_path: Path) -> None:
    dest = tmp_path / "b"
    backup(store, dest)
    target = tmp_path / "restored"
    result = CliRunner().invoke(main, ["restore", str(dest), "--root", str(target),
                                       "--project", "side"])
    assert result.exit_code == 0, result.output
    assert [r.run for r in tracklake.list_runs(target)] == ["other"]
    assert not any(target.rglob("*golden*"))
    assert len([p for p in (target / "blobs").rglob("*") if p.is_file()]) == 1  # its blob
    nothing = CliRunner().invoke(main, ["restore", str(dest), "--root", str(target),
                                        "--run", "nope"])
    assert nothing.exit_code == 1 and "nothing of the selected runs" in nothing.output


def test_a_file_url_is_a_directory(store: Path, tmp_path: Path) -> None:
    backup(store, f"file://{tmp_path / 'b'}")
    assert (tmp_path / "b" / MANIFEST).is_file()
    assert answers(tmp_path / "b") == answers(store)


LIVE_RUN = """
import sys, time
import tracklake
run = tracklake.init(project="live", run_id="r", root=sys.argv[1], capture_identity=False,
                     segment_bytes=1)
for step in range(5):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.flush()
print("logged", flush=True)
sys.stdin.readline()  # until the test says finish
for step in range(5, 8):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
run.finish()
"""


def _wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + HANG
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"hung waiting for {what}"
        time.sleep(0.1)


def _follow(store: Path, dest: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracklake._cli", "backup", str(dest), "--root", str(store),
         "--project", "live", "--follow", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _writer(store: Path) -> subprocess.Popen[str]:
    """A training process logging a live run (its segments sealed at each flush) that
    finishes when told on its stdin."""
    writer = subprocess.Popen([sys.executable, "-c", LIVE_RUN, str(store)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "logged"
    return writer


def _finish(writer: subprocess.Popen[str]) -> None:
    assert writer.stdin is not None
    writer.stdin.write("finish\n")
    writer.stdin.flush()
    assert writer.wait(timeout=HANG) == 0


def test_follow_backs_up_sealed_data_of_a_live_run_and_exits_when_it_ends(
        tmp_path: Path) -> None:
    store, dest = tmp_path / "store", tmp_path / "b"
    with _writer(store) as writer, _follow(store, dest) as follower:

        def sealed_segments_held() -> bool:
            files = read_manifest(dest)["files"]
            return sum(rel.endswith(".arrows") for rel in files) >= 4

        _wait_for(sealed_segments_held, "the sealed segments of the live run")
        assert follower.poll() is None  # the run is live: it keeps following
        held = read_manifest(dest)["files"]
        for rel in held:  # every segment it holds is whole: sealed, never a live tail
            if rel.endswith(".arrows"):
                assert (dest / rel).read_bytes()[-8:] == b"\xff\xff\xff\xff\x00\x00\x00\x00"
        _finish(writer)
        out, err = follower.communicate(timeout=HANG)
        assert follower.returncode == 0, err
        assert "backed up" in out
    query = "SELECT step, value FROM metrics WHERE project = 'live' ORDER BY step"
    assert tracklake.query(query, root=dest).to_pylist() == tracklake.query(
        query, root=store).to_pylist()
    assert len(tracklake.query(query, root=dest)) == 8


def test_follow_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    store, dest = tmp_path / "store", tmp_path / "b"
    with _writer(store) as writer, _follow(store, dest) as follower:
        _wait_for(lambda: (dest / MANIFEST).exists(), "the first pass")
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=HANG)
        assert follower.returncode == 0, err
        assert "backed up" in out
        assert read_manifest(dest)["files"]  # the manifest of the last pass is whole
        _finish(writer)


def test_follow_carries_on_when_a_pass_fails(store: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_bytes(b"")  # the destination cannot be written: each pass fails
    errors: list[BackupError] = []
    live = tmp_path / "live"
    with tracklake.init(project="live", run_id="r", root=live, capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
        assert run.flush()
        report = follow(live, blocked / "b", interval=0.0, on_error=errors.append,
                        should_stop=lambda: len(errors) >= 2)
    assert len(errors) == 2 and "run the backup again" in str(errors[0])
    assert report.copied == []


def test_retention_requiring_a_backup_removes_only_what_a_backup_holds(
        store: Path, tmp_path: Path) -> None:
    now = time.time() + 365 * 86400.0  # every run ended long ago
    policy = Policy(max_age=86400.0, require_backup=True)
    before = make_plan(store, policy, now)
    assert not before.actions
    assert {s.run for s in before.skipped} >= {"one", "other", "done"}
    assert all("no backup holds" in s.reason for s in before.skipped)

    backup(store, tmp_path / "b", selection=Selection.of(runs=["bk/one"]))
    assert [b["destination"] for b in backups(store)] == [str(tmp_path / "b")]
    after = make_plan(store, policy, now)
    assert [a.key for a in after.actions] == ["bk/one"]

    log_run(store, "one")  # resumed: a new attempt no backup holds yet
    assert not make_plan(store, policy, now).actions
    forced = make_plan(store, policy, now, force=["bk/one"])
    assert [a.key for a in forced.actions] == ["bk/one"] and forced.actions[0].forced

    cli = CliRunner().invoke(main, ["retain", "--root", str(store), "--keep-last", "0",
                                    "--require-backup"])
    assert cli.exit_code == 0, cli.output
    assert "no backup holds" in cli.output and "\n0 action(s)" in cli.output
    (store / "tracklake.toml").write_text("[retention]\nmax_age = \"1d\"\n"
                                          "require_backup = \"yes\"\n")
    bad = CliRunner().invoke(main, ["retain", "--root", str(store)])
    assert bad.exit_code == 1 and "require_backup: must be true or false" in bad.output
    os.remove(store / "tracklake.toml")


def test_a_damaged_artifacts_segment_does_not_stop_a_backup(store: Path,
                                                            tmp_path: Path) -> None:
    segment = next(p for p in (store / "artifacts").rglob("*.arrows") if "run=other" in str(p))
    data = bytearray(segment.read_bytes())
    data[0] ^= 0xFF  # a damaged header, which readers refuse: fsck's business
    segment.write_bytes(bytes(data))
    report = backup(store, tmp_path / "b")
    assert segment.relative_to(store).as_posix() in report.copied
    assert (tmp_path / "b" / segment.relative_to(store)).read_bytes() == bytes(data)
