"""Export throughput and latency, against each destination's own fastest bulk API.

    python benchmarks/export.py [--values 1000000] [--mlflow-values 200000]
        [--sdk-values 200000] [--destinations tensorboard,mlflow,wandb,swanlab] [--json PATH]

Throughput: one run of N metric values (32 keys per step) is written and compacted;
then, in the same process, the same values are written (a) straight with the
destination's bulk API from memory — TensorBoard's EventFileWriter with one Summary of
32 values per step; MLflow's MlflowClient.log_batch with 1,000 metrics per call into a
sqlite store; W&B and SwanLab offline: their SDK's `log(row, step=step)` with 32 values
per call, then `finish()` — and (b) by tracklake's exporter reading the store. The ratio is
tracklake's throughput over the direct one (target ≥ 0.9).

Latency: a writer process logs a step of 32 values every 20 ms with default settings;
an exporter in this process follows it into TensorBoard (file events on); for every
step, the time from log() (the record's timestamp) to the end of the destination's
write() is recorded; median and p99 are printed (target < 1 s).

Memory while following: a writer process logs 100,000 values/s (32 keys per step) for
60 s (--follow-seconds, --follow-rate) while `tracklake export tensorboard --follow`
runs as its own process; its resident memory (VmRSS) is sampled every second and the
peak of each 10 s window is printed, with the values exported (goal: peak <= 250 MiB,
flat after the first seconds). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import numpy as np
import pyarrow as pa

import tracklake
from tracklake.exporters import Exporter, ExportOptions, Selection, load

KEYS = [f"group{i // 8}/metric_{i}" for i in range(32)]


def build_store(root: Path, values: int) -> tuple[np.ndarray, np.ndarray, float]:
    steps = values // len(KEYS)
    data = np.random.default_rng(0).random((steps, len(KEYS)))
    with tracklake.init(project="bench", run_id="export", root=root, capture_identity=False,
                        fsync=False) as run:
        for step in range(steps):
            run.log(dict(zip(KEYS, data[step].tolist(), strict=True)), step=step)
    tracklake.compact(root=root)
    return np.arange(steps), data, time.time()


def direct_tensorboard(logdir: Path, steps: np.ndarray, data: np.ndarray, wall: float
                       ) -> float:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    started = time.perf_counter()
    writer = EventFileWriter(str(logdir))
    for step, row in zip(steps.tolist(), data.tolist(), strict=True):
        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=k, simple_value=v)
            for k, v in zip(KEYS, row, strict=True)])
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
    writer.close()
    return time.perf_counter() - started


def direct_mlflow(uri: str, steps: np.ndarray, data: np.ndarray, wall: float) -> float:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.create_experiment("direct")
    run_id = client.create_run(experiment).info.run_id
    ts = int(wall * 1000)
    started = time.perf_counter()
    batch: list[Metric] = []
    for step, row in zip(steps.tolist(), data.tolist(), strict=True):
        batch.extend(Metric(k, v, ts, step) for k, v in zip(KEYS, row, strict=True))
        if len(batch) >= 1000:
            client.log_batch(run_id, metrics=batch[:1000])
            batch = batch[1000:]
    if batch:
        client.log_batch(run_id, metrics=batch)
    return time.perf_counter() - started


def direct_wandb(directory: Path, steps: np.ndarray, data: np.ndarray, wall: float
                 ) -> float:
    import wandb

    from tracklake.exporters.wandb.session import QUIET

    started = time.perf_counter()  # with the exporter's settings: no system capture either
    run = wandb.init(project="direct", dir=str(directory), mode="offline",
                     settings=wandb.Settings(**QUIET))
    for step, row in zip(steps.tolist(), data.tolist(), strict=True):
        run.log(dict(zip(KEYS, row, strict=True)), step=step)
    run.finish()
    return time.perf_counter() - started


def direct_swanlab(directory: Path, steps: np.ndarray, data: np.ndarray, wall: float
                   ) -> float:
    import swanlab

    from tracklake.exporters.swanlab.session import quiet_settings

    started = time.perf_counter()  # with the exporter's settings: no probes either
    run = swanlab.init(project="direct", logdir=str(directory), mode="offline",
                       settings=quiet_settings("direct"))
    for step, row in zip(steps.tolist(), data.tolist(), strict=True):
        run.log(dict(zip(KEYS, row, strict=True)), step=step)
    run.finish()
    return time.perf_counter() - started


def via_tracklake(name: str, root: Path, **kwargs: Any) -> float:
    destination = load(name)(**kwargs)
    started = time.perf_counter()
    Exporter(destination, root=root, selection=Selection(all_runs=True),
             options=ExportOptions(state_dir=root.parent / f"state-{name}"),
             log=lambda m: None).run()
    destination.close()
    return time.perf_counter() - started


WRITER = textwrap.dedent("""
    import sys, time, tracklake
    run = tracklake.init(project="bench", run_id="live", root=sys.argv[1],
                         capture_identity=False)
    for step in range(int(sys.argv[2])):
        run.log({f"k{i}": float(step) for i in range(32)}, step=step)
        time.sleep(0.02)
    run.finish()
""")


def latency(tmp: Path, steps: int) -> dict[str, float]:
    root = tmp / "live-store"
    root.mkdir()
    base = load("tensorboard")
    arrivals: dict[int, float] = {}

    class Timed(base):  # type: ignore[misc, valid-type]
        def write(self, run: Any, kind: str, records: pa.Table) -> None:
            super().write(run, kind, records)
            now = time.time()
            if kind == "metrics":
                for step, t in zip(records.column("step").to_pylist(),
                                   records.column("time").cast(pa.int64()).to_pylist(),
                                   strict=True):
                    arrivals.setdefault(step, now - t / 1e6)

    script = tmp / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(root), str(steps)])
    while not list(root.glob("runs/**/attempt=1.json")):
        time.sleep(0.01)
    exporter = Exporter(Timed(logdir=tmp / "tb-live"), root=root,
                        selection=Selection(runs=("live",)),
                        options=ExportOptions(follow=True, poll_interval=2.0),
                        log=lambda m: None)
    thread = threading.Thread(target=exporter.run)
    thread.start()
    writer.wait()
    thread.join(timeout=120)
    lags = sorted(arrivals.values())
    return {"steps": len(lags), "median_s": statistics.median(lags),
            "p99_s": lags[int(len(lags) * 0.99) - 1], "max_s": lags[-1]}


PACED_WRITER = textwrap.dedent("""
    import sys, time, tracklake
    root, seconds, rate = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    keys = [f"group{i // 8}/metric_{i}" for i in range(32)]
    run = tracklake.init(project="bench", run_id="live", root=root, capture_identity=False)
    start, step = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        due = int((time.monotonic() - start) * rate / len(keys))
        while step < due:
            run.log({k: float(step) for k in keys}, step=step)
            step += 1
        time.sleep(0.01)
    run.finish()
    print(step * len(keys))
""")


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def follow_memory(tmp: Path, seconds: float, rate: int) -> dict[str, Any]:
    """Peak RSS of a followed TensorBoard export, per 10 s window, while a run is written
    at `rate` values/s for `seconds`."""
    root = tmp / "follow-store"
    script = tmp / "paced_writer.py"
    script.write_text(PACED_WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(root), str(seconds),
                               str(rate)], stdout=subprocess.PIPE, text=True)
    while not list(root.glob("runs/**/attempt=1.json")):
        time.sleep(0.01)
    tracklake_cli = Path(sys.executable).with_name("tracklake")
    exporter = subprocess.Popen([str(tracklake_cli), "export", "tensorboard", "--root",
                                 str(root), "--run", "live", "--follow", "--quiet",
                                 "--logdir", str(tmp / "tb-follow")])
    started = time.monotonic()
    samples: list[tuple[float, float]] = []
    while exporter.poll() is None:
        rss = _rss_mib(exporter.pid)
        if rss is not None:
            samples.append((time.monotonic() - started, rss))
        time.sleep(1.0)
    exporter_s = time.monotonic() - started
    written = int(writer.communicate()[0].strip() or 0)
    windows: dict[int, float] = {}
    for at, rss in samples:
        windows[int(at // 10) * 10] = max(windows.get(int(at // 10) * 10, 0.0), rss)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp / "tb-follow" / "bench" / "live"), size_guidance={
        "scalars": 0})
    acc.Reload()
    exported = sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"])
    peak = max(rss for _, rss in samples)
    after_first = [rss for at, rss in samples if at >= 10]
    return {"seconds": seconds, "rate": rate, "values_written": written,
            "values_exported": exported, "exporter_s": exporter_s,
            "peak_rss_mib": peak, "window_peaks_mib": windows,
            "growth_after_10s_mib": (max(after_first) - after_first[0]) if after_first
            else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", type=int, default=1_000_000)
    parser.add_argument("--mlflow-values", type=int, default=1_000_000)
    parser.add_argument("--latency-steps", type=int, default=250)
    parser.add_argument("--sdk-values", type=int, default=200_000,
                        help="values for W&B and SwanLab (their SDKs are slow)")
    parser.add_argument("--destinations", default="tensorboard,mlflow,wandb,swanlab")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--follow-seconds", type=float, default=60.0)
    parser.add_argument("--follow-rate", type=int, default=100_000, help="values/s written")
    parser.add_argument("--no-follow-memory", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tracklake-export-bench-") as tmp_name:
        tmp = Path(tmp_name)
        chosen = args.destinations.split(",")
        for dest, n in (("tensorboard", args.values), ("mlflow", args.mlflow_values),
                        ("wandb", args.sdk_values), ("swanlab", args.sdk_values)):
            if dest not in chosen:
                continue
            root = tmp / f"store-{dest}"
            steps, data, wall = build_store(root, n)
            values = steps.size * len(KEYS)
            if dest == "tensorboard":
                direct = direct_tensorboard(tmp / "tb-direct", steps, data, wall)
                ours = via_tracklake("tensorboard", root, logdir=tmp / "tb-tracklake")
            elif dest == "mlflow":
                direct = direct_mlflow(f"sqlite:///{tmp}/direct.db", steps, data, wall)
                ours = via_tracklake("mlflow", root, tracking_uri=f"sqlite:///{tmp}/tl.db")
            elif dest == "wandb":
                direct = direct_wandb(tmp / "wandb-direct", steps, data, wall)
                ours = via_tracklake("wandb", root, mode="offline", dir=str(tmp / "wandb-tl"))
            else:
                direct = direct_swanlab(tmp / "swanlab-direct", steps, data, wall)
                ours = via_tracklake("swanlab", root, mode="offline",
                                     logdir=str(tmp / "swanlab-tl"))
            results[dest] = {"values": values, "direct_s": direct, "tracklake_s": ours,
                             "direct_values_per_s": values / direct,
                             "tracklake_values_per_s": values / ours,
                             "ratio": direct / ours}
            r = results[dest]
            print(f"{dest:<12} {values:>10,} values: direct {r['direct_s']:7.2f} s "
                  f"({r['direct_values_per_s']:,.0f}/s), tracklake {r['tracklake_s']:7.2f} s "
                  f"({r['tracklake_values_per_s']:,.0f}/s), ratio {r['ratio']:.2f}", flush=True)
        if not args.no_latency:
            results["latency"] = lat = latency(tmp, args.latency_steps)
            print(f"latency log() -> TensorBoard with --follow: {lat['steps']} steps, median "
                  f"{lat['median_s']:.3f} s, p99 {lat['p99_s']:.3f} s, max {lat['max_s']:.3f} s")
        if not args.no_follow_memory:
            results["follow_memory"] = mem = follow_memory(tmp, args.follow_seconds,
                                                           args.follow_rate)
            print(f"export tensorboard --follow of a {mem['seconds']:.0f} s run at "
                  f"{mem['rate']:,} values/s: {mem['values_exported']:,} of "
                  f"{mem['values_written']:,} values exported in {mem['exporter_s']:.0f} s; "
                  f"peak RSS {mem['peak_rss_mib']:.0f} MiB ({mem['peak_rss_mib'] / 250:.2f}"
                  f" of the 250 MiB goal), growth after the first 10 s "
                  f"{mem['growth_after_10s_mib']:+.0f} MiB")
            print("  peak RSS per 10 s window (MiB): " + ", ".join(
                f"{at}s {rss:.0f}" for at, rss in sorted(mem["window_peaks_mib"].items())))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
