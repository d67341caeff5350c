"""Exactly-once under fire: an exporter killed with SIGKILL at random moments (up to 20
times, at least 10; up to 8 and at least 3 for W&B and SwanLab, whose SDKs take seconds
to start) while 4 rank processes write a run for about 18 s; restarted each time, it
ends with the destination holding exactly the store's records — no gap, no duplicate."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _optional import optional

import tracklake

pytestmark = pytest.mark.slow

KILLS = 20
RANKS = 4
STEPS = 1500
WRITER = textwrap.dedent("""
    import sys, time, tracklake
    root, rank = sys.argv[1], int(sys.argv[2])
    run = tracklake.init(project="p", run_id="live", root=root, rank=rank,
                         capture_identity=False, flush_interval=0.05, segment_bytes=64 << 10)
    for step in range(STEPS):
        run.log({"loss": step * 0.5 + rank, "acc": step / 1000.0}, step=step)
        time.sleep(PAUSE)
    run.finish()
""").replace("STEPS", str(STEPS))


#: Each rank runs attempt 1 to step 899 and finishes; attempt 2 logs again from step 600
#: (other loss values): the views, and every destination, show attempt 2 from step 600.
#: Its own project: a destination shared by the module's tests holds `p/live` already.
RESUMED_WRITER = textwrap.dedent("""
    import sys, time, tracklake
    root, rank = sys.argv[1], int(sys.argv[2])
    for first, end in ((0, 900), (600, STEPS)):
        run = tracklake.init(project="resumed", run_id="live", root=root, rank=rank,
                             capture_identity=False, flush_interval=0.05,
                             segment_bytes=64 << 10)
        for step in range(first, end):
            run.log({"loss": step * 0.5 + rank + (1000 if first else 0),
                     "acc": step / 1000.0}, step=step)
            time.sleep(PAUSE)
        run.finish()
""").replace("STEPS", str(STEPS))


def _store_points(root: Path) -> Counter[tuple[int, str, float]]:
    rows = tracklake.query("SELECT step, key, value FROM metrics WHERE rank = 0",
                           root=root).to_pylist()
    return Counter((r["step"], r["key"], r["value"]) for r in rows)


def _export_under_fire(root: Path, tmp_path: Path, dest_args: list[str], *,
                       kills: int = KILLS, window: tuple[float, float] = (0.3, 1.5),
                       pause: float = 0.012, writer: str = WRITER) -> int:
    """Kill exporters until `kills` were killed or one finished the run by itself after
    the writers (`pause` seconds between steps) ended; then export once more. Returns
    how many were killed."""
    script = tmp_path / "writer.py"
    script.write_text(writer.replace("PAUSE", str(pause)))
    writers = [subprocess.Popen([sys.executable, str(script), str(root), str(rank)])
               for rank in range(RANKS)]
    once = [sys.executable, "-m", "tracklake._cli.main", "export", *dest_args, "--root",
            str(root), "--run", "live", "--batch-rows", "500"]
    command = [*once, "--follow", "--poll-interval", "0.2"]
    rng = random.Random(20261130)
    # a killed exporter leaves its temporary directories: in the test's, not /tmp
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = 0
    try:
        deadline = time.monotonic() + 30
        while not list(root.glob("runs/**/attempt=1.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        while killed < kills:
            exporter = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=env)
            time.sleep(rng.uniform(*window))
            if exporter.poll() is None:
                os.kill(exporter.pid, signal.SIGKILL)
                killed += 1
            if exporter.wait() == 0 and all(w.poll() is not None for w in writers):
                break  # the run is finished and exported: a kill now would test nothing
    finally:
        for w in writers:
            w.wait(timeout=120)
    assert all(w.returncode == 0 for w in writers)
    final = subprocess.run(once, capture_output=True, text=True, timeout=300, env=env)
    assert final.returncode == 0, final.stderr
    return killed


def _tensorboard_points(logdir: Path, project: str = "p") -> Counter[tuple[int, str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = logdir / project / "live"
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return Counter((e.step, tag, e.value) for tag in acc.Tags()["scalars"]
                   for e in acc.Scalars(tag))


def test_tensorboard_holds_exactly_the_store_after_kills(root: Path, tmp_path: Path
                                                             ) -> None:
    optional("tensorboard")
    logdir = tmp_path / "tb"
    assert _export_under_fire(root, tmp_path, ["tensorboard", "--logdir", str(logdir)]) >= 10
    # TensorBoard keeps scalars as float32 (its simple_value field)
    expected = Counter({(s, k, float(np.float32(v))): n
                        for (s, k, v), n in _store_points(root).items()})
    assert len(expected) == STEPS * 2
    got = _tensorboard_points(logdir)
    assert got == expected


def test_tensorboard_shows_the_views_of_a_resumed_run_after_kills(root: Path, tmp_path: Path
                                                                 ) -> None:
    """Kills while attempt 2 restarts each rank at step 600: the restart state survives
    them, and TensorBoard's reader shows each step once, attempt 2's from step 600."""
    optional("tensorboard")
    logdir = tmp_path / "tb"
    assert _export_under_fire(root, tmp_path, ["tensorboard", "--logdir", str(logdir)],
                              writer=RESUMED_WRITER, pause=0.008) >= 10
    expected = Counter({(s, k, float(np.float32(v))): n
                        for (s, k, v), n in _store_points(root).items()})
    assert len(expected) == STEPS * 2
    assert expected[(700, "loss", 700 * 0.5 + 1000)] == 1  # attempt 2's value
    assert _tensorboard_points(logdir, "resumed") == expected


def _mlflow_points(uri: str) -> Counter[tuple[int, str, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string="tags.`tracklake.run_id` = 'p/live'")
    assert len(runs) == 1
    points: Counter[tuple[int, str, float]] = Counter()
    for key in ("loss", "acc"):
        for m in client.get_metric_history(runs[0].info.run_id, key):
            points[(m.step, key, m.value)] += 1
    return points


def test_mlflow_holds_exactly_the_store_after_kills(root: Path, tmp_path: Path,
                                                       mlflow_server: str) -> None:
    assert _export_under_fire(root, tmp_path, ["mlflow", "--tracking-uri", mlflow_server]) >= 10
    expected = _store_points(root)
    got = _mlflow_points(mlflow_server)
    assert got == expected




def _loss_and_acc(history: list[tuple[int, dict[str, object]]]
                  ) -> Counter[tuple[int, str, float]]:
    return Counter((step, k, float(v)) for step, row in history  # type: ignore[arg-type]
                   for k, v in row.items() if k in ("loss", "acc"))


def test_wandb_holds_exactly_the_store_after_kills(root: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed sessions' .wandb files hold every point once; a session a kill cut
    short was set aside (.wandb.uncommitted) and its records sent again."""
    optional("wandb")
    import _wandb_log as wlog
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "wandb-out"
    killed = _export_under_fire(root, tmp_path, ["wandb", "--mode", "offline", "--dir",
                                                 str(out)], kills=8, window=(1.0, 4.0))
    assert killed >= 3
    files = sorted((out / "wandb").glob("offline-run-*/*.wandb"))
    assert _loss_and_acc(wlog.history(files)) == _store_points(root)


#: `tracklake.wandb` with two `define_metric` axes beside W&B's own step: eval behind it,
#: clock far ahead of it, twice a step: the second row of a step waits in the export state
#: until W&B's own step passes it.
AXES_WRITER = textwrap.dedent("""
    import os, sys, time
    os.environ["RANK"] = sys.argv[2]
    import tracklake.wandb as wandb
    rank = int(sys.argv[2])
    wandb.init(project="axes", id="live", root=sys.argv[1])
    wandb.define_metric("eval/step")
    wandb.define_metric("eval/*", step_metric="eval/step")
    wandb.define_metric("clock/*", step_metric="clock/sec")
    for step in range(STEPS):
        wandb.log({"loss": step * 0.5 + rank, "acc": step / 1000.0})
        if step % 25 == 24:
            wandb.log({"eval/acc": step / 1000.0 + rank, "eval/step": step // 25})
        for tick in range(2):  # two rows of one axis between two of W&B's steps
            wandb.log({"clock/sec": 1000 * step + tick, "clock/rate": step + tick / 4})
        time.sleep(PAUSE)
    wandb.finish()
""").replace("STEPS", str(STEPS // 3))


def test_wandb_axis_rows_held_in_the_export_state_survive_kills(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills while axis rows wait in the export state for W&B's own step to pass them:
    every value arrives once, at its own step or with its axis value in its row."""
    optional("wandb")
    import _wandb_log as wlog
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "wandb-out"
    killed = _export_under_fire(root, tmp_path, ["wandb", "--mode", "offline", "--dir",
                                                 str(out)], kills=6, window=(1.0, 3.0),
                                writer=AXES_WRITER, pause=0.02)
    assert killed >= 3
    rows = tracklake.query("SELECT step, key, value FROM metrics WHERE rank = 0",
                           root=root).to_pylist()
    expected = Counter((r["step"], r["key"], r["value"]) for r in rows
                       if r["key"] in ("loss", "acc", "eval/acc", "clock/rate"))
    assert sum(1 for s, k, _ in expected if k == "eval/acc") == STEPS // 3 // 25
    axis = {"eval/acc": "eval/step", "clock/rate": "clock/sec"}
    got: Counter[tuple[int, str, float]] = Counter()
    for step, values in wlog.history(sorted((out / "wandb").glob("offline-run-*/*.wandb"))):
        for key, value in values.items():
            if key in ("loss", "acc"):
                got[(step, key, float(value))] += 1
            elif key in axis:
                got[(int(values[axis[key]]), key, float(value))] += 1
    assert got == expected


def test_swanlab_holds_exactly_the_store_after_kills(root: Path, tmp_path: Path) -> None:
    optional("swanlab")
    import _swanlab_log as slog
    logdir = tmp_path / "swanlog"
    killed = _export_under_fire(root, tmp_path, ["swanlab", "--mode", "offline", "--logdir",
                                                 str(logdir)], kills=8, window=(1.0, 4.0))
    assert killed >= 3
    sessions = sorted(logdir.glob("run-*-tracklake[0-9]*"))
    assert Counter((s, k, float(v)) for s, k, v in slog.points(sessions).elements()
                   if k in ("loss", "acc")) == _store_points(root)


def test_mlflow_shows_the_views_of_a_resumed_run_after_kills(root: Path, tmp_path: Path,
                                                             mlflow_server: str) -> None:
    """Kills while attempt 2 restarts each rank at step 600: no MLflow run holds two values
    at one step, and reading each step from the latest attempt's run gives the views."""
    from mlflow.tracking import MlflowClient

    assert _export_under_fire(root, tmp_path, ["mlflow", "--tracking-uri", mlflow_server],
                              writer=RESUMED_WRITER, pause=0.008) >= 10
    client = MlflowClient(mlflow_server)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`tracklake.run_id` LIKE 'resumed/live%'")
    newest: dict[tuple[int, str], tuple[int, float]] = {}
    for found in runs:
        tag = found.data.tags["tracklake.run_id"]
        attempt = 1 if tag == "resumed/live" else int(
            tag.removeprefix("resumed/live (attempt ")[:-1])
        for key in ("loss", "acc"):
            steps: Counter[int] = Counter()
            for m in client.get_metric_history(found.info.run_id, key):
                steps[m.step] += 1
                if newest.get((m.step, key), (0, 0.0))[0] < attempt:
                    newest[(m.step, key)] = (attempt, m.value)
            assert max(steps.values()) == 1, (tag, key)  # one value per step in each run
    got = Counter((step, key, value) for (step, key), (_, value) in newest.items())
    assert got == _store_points(root)
    assert newest[(700, "loss")][1] == 700 * 0.5 + 1000
