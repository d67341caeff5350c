"""The air-gap loop end to end, through the commands a user runs: train on "cluster"
store A (two ranks; the first attempt is killed, a resumed attempt logs steps again),
`tracklake pack`, `tracklake unpack` into store B, export B to W&B and SwanLab offline
and to a real MLflow server; A logs more (a third attempt), `pack --since` the first pack, unpack,
export again. Every destination then holds exactly B's data, nothing twice, and B
answers like A."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from _optional import optional
from test_pack import views

import tracklake

optional("wandb")
optional("mlflow")
optional("swanlab")

import _swanlab_log as slog
import _wandb_log as wlog
from mlflow.tracking import MlflowClient

PROJECT, RUN = "airgap", "rl"  # MLflow experiment "airgap" on the shared server
CLI = str(Path(sys.executable).parent / "tracklake")

#: attempt 1 (killed after step 29), attempt 2 (resumed from step 20), attempt 3 (later)
ATTEMPTS = {1: range(0, 30), 2: range(20, 40), 3: range(40, 60)}


def _value(attempt: int, rank: int, step: int) -> float:
    return attempt * 1000.0 + rank * 100.0 + step


def _killed_attempt(root: Path) -> None:
    """Attempt 1 in a process of its own, SIGKILLed after flushing step 29."""
    code = textwrap.dedent(f"""
        import os, signal, tracklake
        runs = [tracklake.init(project={PROJECT!r}, run_id={RUN!r}, root={str(root)!r},
                               rank=r, capture_identity=False) for r in (0, 1)]
        for step in range(30):
            for r, run in enumerate(runs):
                run.log({{"loss": 1000.0 + r * 100.0 + step}}, step=step)
        for run in runs:
            run.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], check=False)
    assert done.returncode == -signal.SIGKILL


def _attempt(root: Path, attempt: int) -> None:
    runs = [tracklake.init(project=PROJECT, run_id=RUN, root=root, rank=r,
                           capture_identity=False, config={"lr": 0.001, "attempt": attempt})
            for r in (0, 1)]
    for step in ATTEMPTS[attempt]:
        for r, run in enumerate(runs):
            run.log({"loss": _value(attempt, r, step)}, step=step)
        if step % 10 == 0:
            runs[0].log_generations([("2+2?", f"4 (attempt {attempt}, step {step})", 1.0)],
                                    step=step, key="val")
    for run in runs:
        run.finish()


def _cli(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([CLI, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _export_all(b: Path, out: Path, mlflow_uri: str) -> None:
    _cli("export", "wandb", "--root", str(b), "--run", RUN, "--mode", "offline",
         "--dir", str(out / "wandb"), env={"WANDB_SILENT": "true"})
    _cli("export", "swanlab", "--root", str(b), "--run", RUN, "--mode", "offline",
         "--logdir", str(out / "swanlab"))
    _cli("export", "mlflow", "--root", str(b), "--run", RUN, "--tracking-uri", mlflow_uri)


def _store_points(root: Path) -> Counter[tuple[int, int, float]]:
    """(attempt, step, value) of every rank-0 loss record the store holds."""
    rows = tracklake.query("SELECT attempt, step, value FROM metrics_all WHERE rank = 0 "
                           "AND key = 'loss'", root=root).to_pylist()
    return Counter((r["attempt"], r["step"], r["value"]) for r in rows)


def _wandb_points(out: Path) -> dict[str, Counter[tuple[int, object]]]:
    """W&B run id -> (step, loss) of every history row in its committed session files."""
    by_run: dict[str, list[Path]] = {}
    for f in sorted((out / "wandb" / "wandb").glob("offline-run-*/*.wandb")):
        by_run.setdefault(f.name.removeprefix("run-").removesuffix(".wandb"), []).append(f)
    return {wid: Counter((step, wlog.same(row["loss"])) for step, row in wlog.history(files)
                         if "loss" in row) for wid, files in by_run.items()}


def _swanlab_points(out: Path) -> dict[str, Counter[tuple[int, object]]]:
    """SwanLab run id -> (step, loss) of every point in its committed session dirs."""
    by_run: dict[str, list[Path]] = {}
    for d in sorted((out / "swanlab").glob("run-*-tracklake[0-9]*")):
        by_run.setdefault(d.name.removeprefix("run-").rsplit("-tracklake", 1)[0], []).append(d)
    return {sid: Counter((step, value) for step, key, value in slog.points(dirs).elements()
                         if key == "loss") for sid, dirs in by_run.items()}


def _mlflow_points(uri: str, experiment: str) -> Counter[tuple[int, float]]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    (run,) = client.search_runs([exp.experiment_id],
                                filter_string=f"tags.`tracklake.run_id` = '{PROJECT}/{RUN}'")
    return Counter((m.step, m.value) for m in client.get_metric_history(run.info.run_id,
                                                                        "loss"))


def _view_points(root: Path) -> Counter[tuple[int, float]]:
    """(step, value) of rank 0's loss as the default views show it: attempt 2 logged the
    steps from 20 again, so those are its values."""
    rows = tracklake.query("SELECT step, value FROM metrics WHERE rank = 0 AND key = 'loss'",
                           root=root).to_pylist()
    return Counter((r["step"], r["value"]) for r in rows)


def _expected_runs(root: Path) -> dict[str, Counter[tuple[int, object]]]:
    """Destination run id -> (step, loss), for W&B and SwanLab alike: one run, as the
    views show it (the attempts were in the store before the export)."""
    from tracklake.exporters._protocol import RunInfo
    from tracklake.exporters.wandb.destination import wandb_run_id
    base = wandb_run_id(RunInfo(PROJECT, RUN, None, "finished", 1, (0,), (), None))
    return {base: Counter(_view_points(root))}


def test_train_pack_unpack_export_then_again_with_only_the_new_steps(
        tmp_path: Path, mlflow_server: str) -> None:
    a, b, out = tmp_path / "cluster", tmp_path / "laptop", tmp_path / "out"
    _killed_attempt(a)
    _attempt(a, 2)
    first = tmp_path / "rl-1.pack"
    _cli("pack", "--root", str(a), "--project", PROJECT, "-o", str(first))
    _cli("unpack", str(first), "--root", str(b))
    assert views(b) == views(a)
    _export_all(b, out, mlflow_server)

    assert _store_points(b) == Counter((att, s, _value(att, 0, s))
                                       for att in (1, 2) for s in ATTEMPTS[att])
    assert _wandb_points(out) == _expected_runs(b)
    assert _swanlab_points(out) == _expected_runs(b)
    experiment = PROJECT
    assert _mlflow_points(mlflow_server, experiment) == _view_points(b)

    _attempt(a, 3)  # the cluster goes on
    second = tmp_path / "rl-2.pack"
    _cli("pack", "--root", str(a), "--project", PROJECT, "-o", str(second),
         "--since", str(first))
    new_files = [n for n in _pack_members(second) if n.endswith((".parquet", ".json"))
                 and not n.startswith("manifest")]
    assert new_files and all("attempt=3" in n for n in new_files), new_files
    _cli("unpack", str(second), "--root", str(b))
    _cli("unpack", str(second), "--root", str(b))  # twice: changes nothing
    assert views(b) == views(a)
    _export_all(b, out, mlflow_server)
    _export_all(b, out, mlflow_server)  # nothing new: sends nothing

    assert _wandb_points(out) == _expected_runs(b)
    assert _swanlab_points(out) == _expected_runs(b)
    assert _mlflow_points(mlflow_server, experiment) == _view_points(b)
    status = _cli("export", "status", "--root", str(b))
    assert RUN in status



def _pack_members(pack: Path) -> list[str]:
    """The names of the files a pack holds."""
    with tarfile.open(pack) as tar:
        return tar.getnames()


@pytest.mark.parametrize("dest,options", [
    ("wandb", ["--mode", "offline", "--dir"]),
    ("swanlab", ["--mode", "offline", "--logdir"]),
])
def test_an_offline_export_connects_to_nothing(tmp_path: Path, dest: str,
                                               options: list[str]) -> None:
    """With HTTP(S)_PROXY pointing at a recording proxy, an offline export (in a fresh
    process, as a user runs it) makes no connection: wandb's own error reporting, which
    connects to W&B's servers in offline mode too, is off."""
    from _probe_proxy import ProbeProxy
    root = tmp_path / "store"
    with tracklake.init(project=PROJECT, run_id=RUN, root=root, capture_identity=False) as run:
        run.log({"loss": 1.0}, step=0)
    proxy = ProbeProxy()
    env = {name: proxy.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                                        "https_proxy")}
    try:
        _cli("export", dest, "--root", str(root), "--all", *options, str(tmp_path / "out"),
             env={**env, "HOME": str(tmp_path), "WANDB_API_KEY": "", "NO_PROXY": ""})
    finally:
        proxy.close()
    assert proxy.requests == []
    assert list((tmp_path / "out").rglob("*.wandb" if dest == "wandb" else "*.swanlab"))
