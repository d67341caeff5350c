"""Ctrl-C at any point of a long command: one line, exit status 130, no traceback, and
no partial output (a pack's file is whole or absent; no temporary file is left).
Before: a traceback ("RuntimeError: Query interrupted") or click's bare "Aborted!",
exit status 1.

The signal comes at a random point after the command line has been imported (its
handling starts there), not at a fixed time after the process starts: on a loaded
machine the imports alone can take longer than a quiet machine's whole command."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tracklake

# one pytest worker: the store that every command reads is written once (module fixture)
pytestmark = pytest.mark.xdist_group("interrupt")


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose pack and SQL take a second or more."""
    root = tmp_path_factory.mktemp("interrupt") / "store"
    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root,
                            capture_identity=False) as run:
            for step in range(4000):
                run.log({f"k{i}": float(step * i) for i in range(40)}, step=step)
    return root


#: `python -m tracklake._cli`, which also creates the file named by its first argument
#: once the command line is imported
_LAUNCH = ("import sys\n"
           "from tracklake._cli.main import run\n"
           "open(sys.argv.pop(1), 'x').close()\n"
           "sys.argv[0] = 'tracklake'\n"
           "run()\n")


def _start(ready: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", _LAUNCH, str(ready), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _wait_until_imported(ready: Path, proc: subprocess.Popen[str]) -> float:
    """Wait for the command's file saying it is imported; the time that took."""
    started = time.monotonic()
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < started + 120, "the command line was not imported in 120 s"
        time.sleep(0.01)
    return time.monotonic() - started


COMMANDS = {
    "pack": lambda root, out: ["pack", "--root", str(root), "--all", "-o", str(out / "x.pack")],
    # 30 M rows: 2-3 s of reading and writing here; more only repeats the same batches
    "sql": lambda root, out: ["sql", "--root", str(root), "--format", "csv", "-o",
                              str(out / "x.csv"),
                              "SELECT a.step, b.key FROM metrics a, metrics b LIMIT 30000000"],
    "fsck": lambda root, out: ["fsck", "--root", str(root)],
    "report": lambda root, out: ["report", "a", "b", "--root", str(root), "-o",
                                 str(out / "r.html")],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_ctrl_c_at_random_points_ends_the_command_cleanly(big_store: Path, tmp_path: Path,
                                                          command: str) -> None:
    rng = random.Random(command)
    (tmp_path / "whole").mkdir()
    whole = _start(tmp_path / "whole.ready", *COMMANDS[command](big_store, tmp_path / "whole"))
    _wait_until_imported(tmp_path / "whole.ready", whole)
    started = time.monotonic()
    whole.communicate(timeout=300)
    took = time.monotonic() - started  # how long the command takes once imported
    outcomes = []
    for attempt in range(4):
        out = tmp_path / f"out{attempt}"
        out.mkdir()
        ready = tmp_path / f"out{attempt}.ready"
        proc = _start(ready, *COMMANDS[command](big_store, out))
        _wait_until_imported(ready, proc)
        # during the command's own imports, reading, writing
        time.sleep(rng.uniform(0.05, max(0.1, took)))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        outcomes.append(proc.returncode)
        assert "Traceback" not in err and "Aborted!" not in err, err
        # -SIGINT: interrupted while Python started or shut down, which it ends by
        # SIGINT itself (a shell shows 130 for both)
        assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err)
        if proc.returncode == 130:
            assert err.strip().splitlines()[-1].startswith("tracklake: ") and (
                "interrupted" in err), err
        if proc.returncode != 0:
            left = [p.name for p in out.iterdir()]
            whole_output = [n for n in left if not n.startswith(".")]
            assert all(not n.startswith(".") for n in left), left  # no temporary
            assert len(whole_output) <= 1  # the output, if it was renamed into place
    if took > 1.5:
        assert 130 in outcomes, (outcomes, took)  # at least one try was interrupted


@pytest.mark.parametrize("at", ["write", "rename"])
def test_an_interrupted_atomic_write_leaves_no_temporary(tmp_path: Path, at: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Ctrl-C while a report, a chart or a catalog is written under its temporary name
    (its fsync takes a while) left that name behind: `report` at a random point, once."""
    from tracklake._format import files

    write_new = files.write_new

    def interrupted(path: Path, data: bytes, **kwargs: object) -> None:
        write_new(path, data)  # written, then interrupted in its fsync
        raise KeyboardInterrupt

    if at == "write":
        monkeypatch.setattr(files, "write_new", interrupted)
    else:
        monkeypatch.setattr(files, "os", _Interrupting(files.os))
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(tmp_path / "r.html", b"<html></html>")
    assert list(tmp_path.iterdir()) == []


class _Interrupting:
    """`os` whose `replace` is interrupted."""

    def __init__(self, real: object) -> None:
        self._real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def replace(self, *_: object) -> None:
        raise KeyboardInterrupt


def test_a_pack_interrupted_while_its_stage_is_removed_leaves_no_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C came once (CI57) while `pack` removed its staging directory, after the pack
    was renamed into place: `TemporaryDirectory` stopped half way and left
    `.tracklake-pack-*` beside the output. Now the removal finishes, then the interrupt
    ends the command; the pack is whole."""
    import shutil

    from tracklake._ops.pack.archive import read_manifest
    from tracklake._ops.pack.pack import pack

    root = tmp_path / "store"
    with tracklake.init(project="p", run_id="a", root=root, capture_identity=False) as run:
        for step in range(50):
            run.log({"loss": float(step)}, step=step)
    out = tmp_path / "out"
    out.mkdir()
    remove = shutil.rmtree
    calls = []

    def interrupted_once(path: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 1:
            victim = next(p for p in Path(path).rglob("*") if p.is_file())
            victim.unlink()  # part of the way through
            raise KeyboardInterrupt
        remove(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        pack(root=root, all_runs=True, output=out / "x.pack")
    assert len(calls) == 2
    assert [p.name for p in out.iterdir()] == ["x.pack"]  # no stage left
    assert read_manifest(out / "x.pack").streams
