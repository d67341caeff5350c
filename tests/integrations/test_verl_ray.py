"""verl's logging inside real Ray actors (a local one-CPU Ray, shut down after the test):
the plugin is active in an actor whose code imports only verl, verl's `Tracking` writes
the store and starts the TensorBoard sidecar from inside the actor, the sidecar outlives
the actor (Ray SIGKILLs it) and the event files end exact, an agent-loop worker's span
lands at its documented rank, and no process is left behind."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _optional import optional
from _sidecar import alive, processes_following, wait_for

import tracklake

ray = optional("ray")
optional("verl")
optional("tensorboard")
import _verl_actors  # noqa: E402
import numpy as np  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    SCALARS,
    EventAccumulator,
)

from tracklake.integrations import verl as integration  # noqa: E402

# one pytest worker: one local Ray cluster at a time on the machine
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
STEPS = 30
#: verl's agent-loop worker 3, as verl names the actor (``agent_loop_worker_<i>_<hex>``)
AGENT_LOOP_ACTOR = "agent_loop_worker_3_5e1f"


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (Ray's own carry its temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


@pytest.fixture
def local_ray(tmp_path_factory: pytest.TempPathFactory, root: Path, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A local Ray of one CPU whose workers see the store and the actor module; on exit
    it is shut down and every process it started (head, raylet, workers) has ended.

    Ray's temp dir sits in pytest's base temp, not in `tmp_path`: Ray puts Unix sockets
    under it, and their paths must stay within 107 bytes."""
    ray_dir = tmp_path_factory.mktemp("ray")
    logdir = tmp_path / "tb"
    # Ray's workers inherit the driver's environment (ray.init starts the raylet)
    monkeypatch.setenv("TRACKLAKE_ROOT", str(root))
    monkeypatch.setenv("TENSORBOARD_DIR", str(logdir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(_verl_actors.__file__).parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ray's own deprecation notices at start
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=str(ray_dir),
                 object_store_memory=80 << 20, log_to_driver=False, configure_logging=False)
    ray_pids = _processes_mentioning(str(ray_dir))
    try:
        assert ray_pids, "no Ray process found by its temp dir"
        yield logdir
    finally:
        with warnings.catch_warnings():
            # Ray drops its Popen handles while its processes are still ending
            # (ResourceWarning once garbage-collected): they are waited for below
            warnings.simplefilter("ignore")
            ray.shutdown()
            left = set(ray_pids) | set(_processes_mentioning(str(ray_dir)))
            try:
                wait_for(f"Ray's processes {sorted(left)} to end",
                         lambda: not any(alive(p) for p in left))
            finally:
                for pid in left:
                    if alive(pid):
                        os.kill(pid, signal.SIGKILL)
                gc.collect()


def _actor(cls: type, **options: Any) -> Any:
    return ray.remote(num_cpus=0)(cls).options(**options).remote()


def test_verl_in_a_ray_actor_writes_the_store_and_its_sidecar_outlives_the_actor(
        local_ray: Path, root: Path) -> None:
    runner = _actor(_verl_actors.TaskRunner, name="TaskRunner")
    started = ray.get(runner.start.remote("proj", "exp", STEPS), timeout=300)
    actor_pid = started["pid"]
    sidecars: list[int] = []
    try:
        assert started["before"] == []  # the actor had imported nothing of tracklake ...
        assert "tracklake._integrations.verl.plugin" in started["after"]  # ... until verl
        assert started["tracking"] == "tracklake._integrations.verl.tracking.Tracking"
        # the sidecar (the exporter and the shell that restarts it) follows the run
        sidecars = wait_for("the tensorboard sidecar of the actor",
                            lambda: processes_following(actor_pid))
        ray.get(runner.finish.remote(), timeout=300)
        ray.kill(runner)  # Ray ends the actor's process with SIGKILL
        wait_for(f"actor process {actor_pid} to end", lambda: not alive(actor_pid))
        # the shell and the exporter it started, looked for again: Ray ends the shell with
        # the actor, and the exporter may have started after the shell was first seen
        wait_for("the sidecar to drain and exit", lambda: not (
            processes_following(actor_pid) or any(alive(p) for p in sidecars)))
    finally:
        for pid in {*sidecars, *processes_following(actor_pid)}:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

    run = integration.run_id_for("proj", "exp")
    assert tracklake.query("select run, status from runs", root=root).to_pylist() == [
        {"run": run, "status": "finished"}]
    assert tracklake.query("select count(*) as n from metrics", root=root).to_pylist() == [
        {"n": 2 * STEPS}]
    acc = EventAccumulator(str(local_ray / "proj" / run), size_guidance={SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("critic/score/mean")] == [
        (s, float(np.float32(s / 10))) for s in range(1, STEPS + 1)]
    assert [(e.step, e.value) for e in acc.Scalars("timing_s/step")] == [
        (s, 0.5) for s in range(1, STEPS + 1)]


def test_a_span_of_verls_agent_loop_worker_actor_lands_at_its_documented_rank(
        local_ray: Path, root: Path) -> None:
    worker = _actor(_verl_actors.AgentLoopWorker, name=AGENT_LOOP_ACTOR)
    done = ray.get(worker.rollout.remote("proj", "exp", 12), timeout=300)
    assert done["before"] == [] and done["output"] == "HELLO"
    # spans are written by the run's flush thread; Ray SIGKILLs the actor at shutdown
    rank = (1 << 20) + 3  # docs/verl.md: agent-loop worker i records at 2^20 + i

    def spans() -> list[dict[str, Any]]:
        return tracklake.query("select rank, step, name, parent_id is null as top "
                               "from traces order by top desc", root=root).to_pylist()

    rows = wait_for("the agent loop's two spans", lambda: len(spans()) == 2 and spans())
    assert rows == [{"rank": rank, "step": 12, "name": "agent_loop", "top": True},
                    {"rank": rank, "step": 12, "top": False,
                     "name": "AgentLoopWorker.rollout.<locals>.LLMClient.generate"}]
