"""System metrics: a daemon thread of the writer process samples this host, this process and
its NVIDIA GPUs every `interval` seconds and logs the values as metrics under ``system/``
at the rank's current step (docs/concepts.md, "System metrics").

Keys follow W&B's names: ``system/cpu`` (this process, percent of one core),
``system/cpu.host`` (every core, percent), ``system/memory_percent`` (host),
``system/proc.memory.rssMB``, ``system/proc.memory.availableMB``, ``system/disk.in`` /
``disk.out`` (MB read / written since the run started), ``system/network.sent`` /
``network.recv`` (bytes since the run started) and, per GPU *i*, ``system/gpu.i.gpu``
(utilisation, percent), ``gpu.i.memory`` (memory controller busy, percent),
``gpu.i.memoryAllocated`` (percent), ``gpu.i.memoryAllocatedBytes``,
``gpu.i.memoryTotalBytes``, ``gpu.i.temp`` (C), ``gpu.i.powerWatts``, ``gpu.i.smClock`` and
``gpu.i.memoryClock`` (MHz).

GPUs are read through NVML's official binding (`pynvml`, package nvidia-ml-py); without it,
or without a GPU, there are no GPU keys and the run's events say why, once. No call may
hold the loop: `log()` never waits on the sampler, and a sample that does not return within
`SAMPLE_TIMEOUT` (a hung driver) is abandoned with its source, said once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

#: The variable that turns system metrics off (0, false, no, off) or sets the interval (s).
ENV = "TRACKLAKE_SYSTEM_METRICS"
DEFAULT_INTERVAL = 10.0
#: A source whose sample takes longer is given up (its thread is left blocked, a daemon).
SAMPLE_TIMEOUT = 5.0
_OFF = frozenset({"0", "false", "no", "off"})
_MB = 1 << 20

#: log(values) records one sample; it returns False once the run no longer takes values.
Log = Callable[[dict[str, float]], bool]
#: say(title, text) records an event of the run (and says nothing else).
Say = Callable[[str, str], None]


def system_interval(explicit: bool | float | None) -> float | None:
    """Seconds between samples, or None for off: `init(system_metrics=...)` (True, False or
    seconds) if given, else $TRACKLAKE_SYSTEM_METRICS (off words, or seconds), else 10 s."""
    if explicit is None:
        given = os.environ.get(ENV, "").strip().lower()
        if given in _OFF:
            return None
        if not given or given in ("1", "true", "yes", "on"):
            return DEFAULT_INTERVAL
        try:
            explicit = float(given)
        except ValueError:
            raise ValueError(f"{ENV}={given!r} is not off, on or a number of seconds") from None
    if explicit is True:
        return DEFAULT_INTERVAL
    if explicit is False:
        return None
    if isinstance(explicit, (int, float)) and 0.1 <= explicit <= 86400:
        return float(explicit)
    raise ValueError(f"system_metrics must be True, False or seconds from 0.1 to 86400, "
                     f"not {explicit!r}")


class HostSource:
    """This process and this host, through psutil."""

    name = "host"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call starts the measurement
        psutil.cpu_percent(None)
        self._disk0 = self._disk()
        self._net0 = self._net()

    def _disk(self) -> tuple[int, int]:
        counters = self._psutil.disk_io_counters()
        return (0, 0) if counters is None else (counters.read_bytes, counters.write_bytes)

    def _net(self) -> tuple[int, int]:
        counters = self._psutil.net_io_counters()
        return (0, 0) if counters is None else (counters.bytes_sent, counters.bytes_recv)

    def sample(self) -> dict[str, float]:
        memory = self._psutil.virtual_memory()
        disk, net = self._disk(), self._net()
        return {
            "system/cpu": self._process.cpu_percent(None),
            "system/cpu.host": self._psutil.cpu_percent(None),
            "system/memory_percent": memory.percent,
            "system/proc.memory.rssMB": self._process.memory_info().rss / _MB,
            "system/proc.memory.availableMB": memory.available / _MB,
            "system/disk.in": (disk[0] - self._disk0[0]) / _MB,
            "system/disk.out": (disk[1] - self._disk0[1]) / _MB,
            "system/network.sent": float(net[0] - self._net0[0]),
            "system/network.recv": float(net[1] - self._net0[1]),
        }


class GpuSource:
    """NVIDIA GPUs, through NVML (pynvml); ImportError or pynvml.NVMLError if there are none."""

    name = "gpu"

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise LookupError("NVML sees no GPU")
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def sample(self) -> dict[str, float]:
        nvml = self._nvml
        out: dict[str, float] = {}
        for i, handle in enumerate(self._handles):
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            prefix = f"system/gpu.{i}."
            out[prefix + "gpu"] = float(util.gpu)
            out[prefix + "memory"] = float(util.memory)
            out[prefix + "memoryAllocated"] = 100.0 * memory.used / memory.total \
                if memory.total else 0.0
            out[prefix + "memoryAllocatedBytes"] = float(memory.used)
            out[prefix + "memoryTotalBytes"] = float(memory.total)
            out[prefix + "temp"] = float(nvml.nvmlDeviceGetTemperature(
                handle, nvml.NVML_TEMPERATURE_GPU))
            out[prefix + "powerWatts"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            out[prefix + "smClock"] = float(nvml.nvmlDeviceGetClockInfo(handle,
                                                                        nvml.NVML_CLOCK_SM))
            out[prefix + "memoryClock"] = float(nvml.nvmlDeviceGetClockInfo(
                handle, nvml.NVML_CLOCK_MEM))
        return out


def _within(call: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """(True, result or the exception it raised) if `call` returned within `timeout`
    seconds, else (False, None): it is left running in a daemon thread."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(call())
        except Exception as exc:  # handed to the caller, which says it once
            box.append(exc)

    thread = threading.Thread(target=target, name="tracklake-system-sample", daemon=True)
    thread.start()
    thread.join(timeout)
    return (False, None) if thread.is_alive() else (True, box[0])


class SystemMetrics:
    """The sampling thread of one run handle: `start()`, then `stop()` at finish."""

    def __init__(self, interval: float, log: Log, say: Say,
                 sources: tuple[Callable[[], Any], ...] = (HostSource, GpuSource),
                 timeout: float = SAMPLE_TIMEOUT) -> None:
        self.interval = interval
        self._log, self._say, self._factories, self._timeout = log, say, sources, timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracklake-system-metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; never waits for a sample in progress."""
        self._stop.set()

    def _open(self) -> list[Any]:
        sources = []
        for factory in self._factories:
            done, source = _within(factory, self._timeout)
            label = getattr(factory, "name", getattr(factory, "__name__", "source"))
            if not done:
                self._say(f"no {label} metrics", f"opening the {label} source did not return "
                          f"within {self._timeout:g} s (a hung driver?)")
            elif isinstance(source, Exception):
                self._say(f"no {label} metrics", f"{type(source).__name__}: {source}")
            else:
                sources.append(source)
        return sources

    def _run(self) -> None:
        sources = self._open()
        while sources and not self._stop.wait(self.interval):
            values: dict[str, float] = {}
            for source in list(sources):
                done, got = _within(source.sample, self._timeout)
                if done and not isinstance(got, Exception):
                    values.update(got)
                    continue
                sources.remove(source)
                why = f"{type(got).__name__}: {got}" if done else \
                    f"a sample did not return within {self._timeout:g} s (a hung driver?)"
                self._say(f"{source.name} metrics stopped", why)
            if values and not self._log(values):
                return  # the run finished
