"""System metrics: sampled on a thread of the writer process into `system/…` metrics at the
rank's current step; NVIDIA GPUs through the official NVML binding (pynvml), run here over a
stand-in libnvidia-ml.so.1 built from tests/fake_nvml/nvml.c; no GPU or no library is said
once as an event, never an error; a hung driver call never holds `log()` or `finish()`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _optional import optional

import tracklake

HOST_KEYS = {"system/cpu", "system/cpu.host", "system/memory_percent",
             "system/proc.memory.rssMB", "system/proc.memory.availableMB", "system/disk.in",
             "system/disk.out", "system/network.sent", "system/network.recv"}
GPU_FIELDS = {"gpu", "memory", "memoryAllocated", "memoryAllocatedBytes", "memoryTotalBytes",
              "temp", "powerWatts", "smClock", "memoryClock"}

CHILD = textwrap.dedent("""
    import json, sys, time, tracklake
    root, seconds = sys.argv[1], float(sys.argv[2])
    run = tracklake.init(project="p", run_id="sys", root=root, capture_identity=False,
                         system_metrics=0.2)
    start = time.monotonic()
    step = 0
    worst = 0.0
    while time.monotonic() - start < seconds:
        t = time.perf_counter()
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        worst = max(worst, time.perf_counter() - t)
        step += 1
        time.sleep(0.01)
    t = time.perf_counter()
    report = run.finish(timeout=10)
    print(json.dumps({"worst_log": worst, "finish": time.perf_counter() - t,
                      "status": report.status}))
""")


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding libnvidia-ml.so.1 built from the stand-in's source."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the stand-in NVML library")
    out = tmp_path_factory.mktemp("nvml")
    source = Path(__file__).parent / "fake_nvml" / "nvml.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libnvidia-ml.so.1"),
                    str(source)], check=True)
    return out


def _run_child(root: Path, seconds: float, **env: str) -> dict[str, float]:
    environ = {**os.environ, "TRACKLAKE_SYSTEM_METRICS": "", **env}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(seconds)],
                          capture_output=True, text=True, timeout=120, env=environ, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _keys(root: Path) -> dict[str, list[float]]:
    rows = tracklake.query("SELECT key, value FROM metrics WHERE key LIKE 'system/%' "
                           "ORDER BY seq", root=root).to_pylist()
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["key"], []).append(r["value"])
    return out


def _events(root: Path) -> list[str]:
    return [r["title"] for r in tracklake.query(
        "SELECT title FROM events WHERE kind = 'system_metrics'", root=root).to_pylist()]


def test_host_metrics_are_sampled_into_system_keys_and_no_gpu_is_said_once(
        root: Path) -> None:
    _run_child(root, 1.5, LD_LIBRARY_PATH="/nonexistent")
    keys = _keys(root)
    assert set(keys) >= HOST_KEYS
    assert not [k for k in keys if k.startswith("system/gpu")]
    assert len(keys["system/cpu"]) >= 3  # every 0.2 s for 1.5 s, on a loaded machine too
    assert all(0 <= v <= 100 for v in keys["system/memory_percent"])
    assert all(v > 10 for v in keys["system/proc.memory.rssMB"])  # a Python with pyarrow
    assert _events(root) == ["no gpu metrics"]  # said once, as an event of the run
    steps = tracklake.query("SELECT DISTINCT step FROM metrics WHERE key = 'system/cpu'",
                            root=root).column("step").to_pylist()
    loss_steps = set(tracklake.query("SELECT step FROM metrics WHERE key = 'loss'",
                                     root=root).column("step").to_pylist())
    assert set(steps) <= loss_steps | {0}  # at the rank's current step


def test_gpus_are_read_through_nvml_per_device(root: Path, fake_nvml: Path) -> None:
    optional("pynvml")
    _run_child(root, 1.5, LD_LIBRARY_PATH=str(fake_nvml), FAKE_NVML_GPUS="2")
    keys = _keys(root)
    for i in (0, 1):
        assert {f"system/gpu.{i}.{f}" for f in GPU_FIELDS} <= set(keys)
        assert set(keys[f"system/gpu.{i}.gpu"]) == {40.0 + i}
        assert set(keys[f"system/gpu.{i}.temp"]) == {60.0 + i}
    assert set(keys["system/gpu.0.memoryAllocated"]) == {12.5}
    assert set(keys["system/gpu.0.memoryTotalBytes"]) == {float(8 << 30)}
    assert set(keys["system/gpu.0.powerWatts"]) == {250.0}
    assert set(keys["system/gpu.0.smClock"]) == {1800.0}
    assert set(keys["system/gpu.0.memoryClock"]) == {9000.0}
    assert _events(root) == []


def test_a_hung_nvml_call_holds_neither_log_nor_finish(root: Path, fake_nvml: Path) -> None:
    optional("pynvml")
    result = _run_child(root, 8.0, LD_LIBRARY_PATH=str(fake_nvml), FAKE_NVML_HANG="1")
    # the hang lasts for ever: finish() returned (else the child's timeout fails the test),
    # and the loop went on logging while the sampler's NVML call hung
    assert result["status"] == "finished"
    steps = tracklake.query("SELECT count(*) AS n FROM metrics WHERE key = 'loss'", root=root)
    assert steps.to_pylist()[0]["n"] > 50  # 8 s of a loop that sleeps 10 ms a step
    keys = _keys(root)
    assert set(keys) >= HOST_KEYS and not [k for k in keys if k.startswith("system/gpu")]
    assert _events(root) == ["gpu metrics stopped"]


@pytest.mark.parametrize(("value", "on"), [("0", False), ("off", False), ("", True),
                                           ("0.2", True)])
def test_the_variable_turns_sampling_off_or_sets_its_interval(
        root: Path, monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("TRACKLAKE_SYSTEM_METRICS", value)
    run = tracklake.init(project="p", run_id="v", root=root, capture_identity=False)
    try:
        assert (run._system is not None) == on
        if value == "0.2":
            assert run._system.interval == 0.2
    finally:
        run.finish()


@pytest.mark.parametrize("bad", [0.0, -1.0, "often", 1e9])
def test_a_bad_interval_is_refused_before_anything_is_written(root: Path, bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="system_metrics"):
        tracklake.init(project="p", run_id="bad", root=root, capture_identity=False,
                       system_metrics=bad)  # type: ignore[arg-type]
    assert not (root / "runs").exists() or not list((root / "runs").rglob("*.json"))


def test_init_turns_sampling_off_and_the_argument_wins_over_the_variable(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKLAKE_SYSTEM_METRICS", "1")
    run = tracklake.init(project="p", run_id="off", root=root, capture_identity=False,
                         system_metrics=False)
    assert run._system is None
    run.finish()
    monkeypatch.setenv("TRACKLAKE_SYSTEM_METRICS", "sometimes")
    with pytest.raises(ValueError, match="TRACKLAKE_SYSTEM_METRICS='sometimes'"):
        tracklake.init(project="p", run_id="off", root=root, capture_identity=False)
