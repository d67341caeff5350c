"""Sidecar exporters started by `init(..., export=[...])`: real exporter processes that
follow the run into TensorBoard (read back with TensorBoard's own reader), survive being
killed, drain and exit after the trainer, whether it finished or was SIGKILLed, and are
started by global rank 0 only. No process outlives a test (`_sidecar.trainer` checks the
pids)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from _env import child_env
from _optional import optional
from _sidecar import PATIENCE, alive, processes_following, trainer, wait_for
from test_import_boundary import FORBIDDEN

import tracklake
from tracklake.exporters import Exporter, ExportOptions, MemoryDestination, Selection

optional("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    SCALARS,
    EventAccumulator,
)


def _points(logdir: Path) -> Counter[tuple[str, int, float]]:
    """Every scalar point of run p/r1 under `logdir`, as TensorBoard reads it."""
    if not (logdir / "p" / "r1").is_dir():
        return Counter()  # not written yet
    acc = EventAccumulator(str(logdir / "p" / "r1"), size_guidance={SCALARS: 0})
    acc.Reload()
    return Counter((tag, e.step, e.value) for tag in acc.Tags()["scalars"]
                   for e in acc.Scalars(tag))


def _expected(steps: int) -> Counter[tuple[str, int, float]]:
    import numpy as np

    return Counter([("loss", s, float(np.float32(1.0 / (s + 1)))) for s in range(steps)]
                   + [("reward", s, float(s)) for s in range(steps)])


def test_a_sidecar_follows_the_run_into_tensorboard_and_exits_after_it(
        tmp_path: Path, root: Path) -> None:
    logdir = tmp_path / "tb"
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(logdir)}}) as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        t.wait_sidecars_exit()
        [(destination, _, log)] = t.sidecars()
        assert destination == "tensorboard" and log.is_file()
        assert str(logdir) in t.text()  # the start line says where the data goes
        assert "run p/r1 finished; sidecars export the rest" in t.text()  # the end line
        # the exporter's own summary, on the trainer's console, after the trainer ended
        assert "p/r1: 80 records, finished" in t.text()
    assert _points(logdir) == _expected(40)
    status = {s["run"]: s for s in _export_status(root)}
    assert status["p/r1"]["behind"] == 0 and status["p/r1"]["finished"]


def _export_status(root: Path) -> list[dict[str, object]]:
    from tracklake.exporters import export_status

    return export_status(root)


def test_a_run_that_ends_right_after_init_still_gets_its_sidecar(
        tmp_path: Path, root: Path) -> None:
    """An empty run whose process exits at once: the sidecar is started before the
    interpreter ends (its supervisor is a daemon thread) and finishes the run."""
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(tmp_path / "tb")}},
                 steps=0) as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        t.wait_sidecars_exit()
        assert len(t.sidecars()) == 1
        assert "p/r1: 0 records, finished" in t.text()
    [status] = _export_status(root)
    assert status["run"] == "p/r1" and status["finished"] and status["behind"] == 0


def test_a_sidecar_killed_mid_run_is_restarted_and_the_destination_ends_exact(
        tmp_path: Path, root: Path) -> None:
    logdir = tmp_path / "tb"
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(logdir)}}, mode="pause") as t:
        t.wait_line("logged")
        [(_, first, _)] = wait_for("the sidecar", t.sidecars)
        wait_for("the first half in TensorBoard", lambda: _points(logdir) == _expected(40))
        os.kill(first, signal.SIGKILL)
        wait_for("a restarted sidecar", lambda: len(t.sidecars()) == 2)
        assert "was killed by signal 9; restarting it in 1 s" in t.text()
        t.proceed()  # the second half is logged while the new exporter follows
        assert t.wait().splitlines() == ["finished True"]
        pids = t.wait_sidecars_exit()
        assert first in pids and len(set(pids)) == 2
        assert "tensorboard pid" in t.text() and "restarted 1×" in t.text()
    assert _points(logdir) == _expected(80)  # every point once: nothing lost, nothing twice


def test_the_trainer_sigkilled_leaves_sidecars_that_drain_and_exit(
        tmp_path: Path, root: Path) -> None:
    logdir = tmp_path / "tb"
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(logdir)}}, mode="hang") as t:
        t.wait_line("logged")
        [(_, sidecar, log)] = wait_for("the sidecar", t.sidecars)
        t.process.kill()  # SIGKILL: no finish(); the run's file still says "running"
        t.process.wait()
        t.wait_sidecars_exit()
        assert not processes_following(t.pid)
        text = t.text()
        # its process is known ended, so the run is crashed and ended at the destination
        assert "p/r1: 80 records, finished" in text, text
        assert "exited without finishing it" not in text
        assert str(sidecar) in text and log.is_file()
    assert _points(logdir) == _expected(40)  # everything the trainer stored was exported


def test_a_trainer_ended_by_sigterm_leaves_sidecars_that_finish_the_run(
        tmp_path: Path, root: Path) -> None:
    """SIGTERM (a scheduler's preemption) finishes the run as killed; the signal does not
    reach the sidecars (own session), which deliver everything and finish the run."""
    logdir = tmp_path / "tb"
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(logdir)}}, mode="hang") as t:
        t.wait_line("logged")
        wait_for("the sidecar", t.sidecars)
        t.process.send_signal(signal.SIGTERM)
        assert t.ended() == -signal.SIGTERM
        t.wait_sidecars_exit()
        assert "run p/r1 killed; sidecars export the rest" in t.text()
        assert "p/r1: 80 records, finished" in t.text()
    assert _points(logdir) == _expected(40)


def test_a_trainer_that_kills_its_children_on_exit_does_not_cut_the_export_short(
        tmp_path: Path, root: Path) -> None:
    """Ray kills a worker's direct children when the worker exits: the exporter is not one
    (a shell between them waits for it), so it still delivers the run and finishes it."""
    logdir = tmp_path / "tb"
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(logdir)}}, steps=2000,
                 mode="kill-children") as t:
        assert t.wait().splitlines() == ["logged", "finished True"]
        t.wait_sidecars_exit()
        assert "p/r1: 4000 records, finished" in t.text()
    assert _points(logdir) == _expected(2000)


def test_a_rank_other_than_zero_starts_no_sidecar(tmp_path: Path, root: Path) -> None:
    logdir = tmp_path / "tb"
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(logdir)}}, mode="hang",
                 env={"RANK": "1", "WORLD_SIZE": "2"}) as t:
        t.wait_line("logged")
        assert processes_following(t.pid) == []
        assert "sidecar" not in t.text()
        assert not (root / "exports").exists() and not logdir.exists()


@pytest.mark.parametrize(("export", "error", "match"), [
    ("tensorboard", TypeError, "list of destination names"),
    (["tensorboard", "tensorboard"], ValueError, "listed twice"),
    (["no-such-destination"], ValueError, r"no installed exporter for \['no-such"),
    ({"tensorboard": {"run": "other"}}, ValueError, r"\['run'\] of 'tensorboard' are set by"),
    ({"tensorboard": "dir"}, TypeError, "options of 'tensorboard' must be a mapping"),
    ([3], TypeError, "a destination name must be a non-empty str"),
])
def test_a_wrong_export_argument_is_refused_before_anything_is_written(
        root: Path, export: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        tracklake.init(project="p", run_id="r1", root=root, export=export,  # type: ignore[arg-type]
                       capture_identity=False)
    assert not any(p.is_file() for p in root.rglob("*"))


def test_an_exporter_that_cannot_use_its_options_is_not_restarted(
        tmp_path: Path, root: Path) -> None:
    """A usage error would repeat at every restart: it is reported once, with the command."""
    with trainer(tmp_path, root, {"tensorboard": {"logdir": str(tmp_path / "tb"),
                                                  "no_such_option": 1}}, mode="hang") as t:
        t.wait_line("logged")
        wait_for("the report", lambda: "not restarted: its options are wrong" in t.text())
        assert len(t.sidecars()) == 1
        assert "tracklake export tensorboard --root" in t.text()
        assert "No such option '--no-such-option'" in t.sidecars()[0][2].read_text()


def test_with_export_the_trainer_still_imports_nothing_of_the_read_side(root: Path) -> None:
    """The supervisor lives in the training process: it must stay off the read path."""
    code = ("import json, sys, time, tracklake\n"
            "run = tracklake.init(project='p', run_id='r1', root=sys.argv[1], "
            "export={'memory': None}, capture_identity=False)\n"
            "run.log({'loss': 1.0}, step=0)\n"
            "time.sleep(1.5)\n"  # the supervisor thread has started its process by now
            "run.finish()\n"
            "forbidden = tuple(sys.argv[2].split(','))\n"
            "print(json.dumps(sorted(m for m in sys.modules if any(m == f or "
            "m.startswith(f + '.') for f in forbidden))))\n")
    child = subprocess.run([sys.executable, "-c", code, str(root), ",".join(FORBIDDEN)],
                           capture_output=True, text=True, check=True, env=child_env())
    assert json.loads(child.stdout.splitlines()[-1]) == []
    pids = [int(p) for p in _pids(child.stderr)]
    assert pids
    wait_for("the memory sidecar to exit", lambda: not any(alive(p) for p in pids))


def _pids(text: str) -> list[str]:
    import re

    return re.findall(r"exporting run \S+ to .*: pid (\d+)", text)


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_supervisor_package_stays_on_the_write_side_of_the_boundary() -> None:
    """The boundary as written in the code: store/_sidecar imports only the standard
    library and itself (but for __main__, the exporter process's entry), and the write
    path imports it only inside `init()` (lazily), so that a run without ``export=`` does
    not load it."""
    store = Path(tracklake.__file__).parent
    for path in sorted((store / "_sidecar").glob("*.py")):
        if path.name == "__main__.py":
            continue  # runs in the exporter's process (`python -m tracklake._sidecar`)
        foreign = {m for m in _imports(path, top_level_only=False)
                   if m.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
                   and not m.startswith("tracklake._sidecar")}
        assert not foreign, f"{path.name} imports {sorted(foreign)}"
    for path in sorted((store / "_write").glob("*.py")):
        eager = {m for m in _imports(path, top_level_only=True) if "_sidecar" in m}
        assert not eager, f"{path.name} imports {sorted(eager)} at module level"
    assert any("tracklake._sidecar" in _imports(p, top_level_only=False)
               for p in (store / "_write").glob("*.py"))


def test_a_process_watched_by_pid_is_gone_once_it_exits_even_unreaped() -> None:
    from tracklake.exporters._loop.watched import WatchedProcess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watched = WatchedProcess(child.pid)
    assert watched.alive()
    child.kill()
    wait_for("the child to become a zombie", lambda: not alive(child.pid))
    assert not watched.alive()  # a zombie (not yet reaped by its parent) counts as gone
    child.wait()
    assert not watched.alive() and not WatchedProcess(child.pid).alive()
    with pytest.raises(ValueError, match="--while-pid must be a process id"):
        WatchedProcess(0)


def test_following_for_a_process_drains_and_stops_when_it_exits(root: Path) -> None:
    """The loop under a sidecar: the run is never finished (its writer is "killed"), the
    process it follows for exits, and the exporter delivers everything and stops, naming
    the run it leaves unfinished."""
    run = tracklake.init(project="p", run_id="r1", root=root, capture_identity=False)
    for step in range(30):
        run.log({"loss": float(step)}, step=step)
    assert run.flush()
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    destination = MemoryDestination()
    exporter = Exporter(destination, root=root, selection=Selection(runs=("r1",)),
                        options=ExportOptions(follow=True, poll_interval=0.1,
                                              while_pid=trainer.pid))
    thread = threading.Thread(target=exporter.run, daemon=True)
    thread.start()
    wait_for("the first delivery", lambda: "p/r1" in destination.runs
             and destination.runs["p/r1"].table("metrics") is not None)
    for step in range(30, 60):  # written while the exporter follows
        run.log({"loss": float(step)}, step=step)
    assert run.flush()
    trainer.kill()
    trainer.wait()
    thread.join(PATIENCE)
    assert not thread.is_alive()
    metrics = destination.runs["p/r1"].table("metrics")
    assert metrics is not None and metrics.column("step").to_pylist() == list(range(60))
    assert destination.runs["p/r1"].finished_status is None  # the run never ended
    assert exporter.summary.abandoned == ["p/r1"]
    run.finish()


def test_while_pid_without_follow_is_a_usage_error(root: Path) -> None:
    from click.testing import CliRunner

    from tracklake._cli.main import main

    result = CliRunner().invoke(main, ["export", "memory", "--root", str(root), "--run", "r1",
                                      "--while-pid", str(os.getpid())])
    assert result.exit_code == 2 and "add --follow" in result.output


def test_tracklake_tracking_serves_tensorboard_with_a_sidecar(tmp_path: Path,
                                                               root: Path) -> None:
    """The drop-in `tracklake.Tracking` (no verl): ``tensorboard`` in the backends is a
    sidecar exporter writing under $TENSORBOARD_DIR, as verl's variable says."""
    logdir = tmp_path / "tb"
    code = ("import sys, tracklake\n"
            "t = tracklake.Tracking('p', 'exp', ['console', 'tensorboard'], root=sys.argv[1],\n"
            "                       run_id='r1', capture_identity=False)\n"
            "for s in range(40):\n"
            "    t.log({'loss': 1.0 / (s + 1), 'reward': float(s)}, step=s)\n"
            "t.finish(exit_code=0)\n")
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                          text=True, timeout=PATIENCE, check=False, cwd=tmp_path,
                          env=child_env() | {"TENSORBOARD_DIR": str(logdir)})
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in _pids(done.stderr)]
    assert len(pids) == 1 and str(logdir) in done.stderr
    wait_for("the sidecar to exit", lambda: not any(alive(p) for p in pids))
    assert _points(logdir) == _expected(40)
