#!/usr/bin/env python
"""Write-path benchmark: tracklake's `Run.log` against a plain-Python floor and its peers.

Every contender runs the same loop in this one process: N steps (``--steps``, default
2000) of 32 float metrics with verl-like keys, an explicit step, values drawn once from
``numpy.random.default_rng(SEED)`` and turned into plain Python floats in dicts *before*
any timing starts. Each contender writes into its own fresh temporary directory.

Contenders:

1. floor        plain list.append of (step, key, value) in a function, one Parquet file at
                the end (pyarrow) -- what "just buffer it" costs
2. tracklake    ``run.log(d, step=i)`` then ``run.finish()`` (default options: fsync on)
3. wandb        offline mode, ``wandb.log(d, step=i)``, ``wandb.finish()``
4. mlflow-sqlite``mlflow.log_metrics(d, step=i)`` against a sqlite tracking URI
5. mlflow-file  the same against a ``file://`` store (skipped if this mlflow refuses it)
6. tensorboard  ``tensorboard.summary.Writer`` (else tensorboardX), ``add_scalar`` per key
7. swanlab      offline mode, ``swanlab.log(d, step=i)``, ``swanlab.finish()``

A contender whose package is not installed is skipped with a printed reason.

Reported per contender: per-call median / p99 latency of the log call (perf_counter_ns
around each call; for TensorBoard one "call" is the 32 ``add_scalar`` calls of a step),
init time (not part of the total), loop time, finish/close time, total = loop + finish,
values/s = N*32 / total, and bytes on disk per value (every file in the contender's
directory after finish, divided by N*32). Then tracklake's median over each contender's
median and each contender's values/s over tracklake's, and a separate sustained-throughput
run of tracklake (``--sustained-steps`` x 32 values, default 40,000 x 32 = 1.28 M).

Usage (from the repository root)::

    python benchmarks/write_path.py --steps 2000 [--json results.json]
    python benchmarks/write_path.py --quick          # 300 steps, smoke test
    python benchmarks/write_path.py --media-bytes    # bytes per histogram/image vs TB, W&B

Peers install with ``pip install wandb mlflow tensorboard swanlab`` (``.[bench]``).
Nothing here touches the network: wandb and swanlab run offline, mlflow on local stores,
and their telemetry is switched off through the environment before they are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# -- keep every peer offline and quiet; must be set before any of them is imported ------
_QUIET_ENV = {
    "WANDB_SILENT": "true",
    "WANDB_MODE": "offline",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_CONSOLE": "off",
    "WANDB_X_DISABLE_STATS": "true",
    "WANDB__DISABLE_STATS": "true",
    "WANDB_X_DISABLE_META": "true",
    "WANDB__DISABLE_META": "true",
    "WANDB_DISABLE_JOB_CREATION": "true",
    "WANDB_ERROR_REPORTING": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ASYNC_LOGGING": "false",
    "DO_NOT_TRACK": "1",
    "SWANLAB_MODE": "offline",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}
for _k, _v in _QUIET_ENV.items():
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

SEED = 20240611
N_KEYS = 32

#: 32 distinct keys in the shape verl logs them (PPO/GRPO trainer metrics).
KEYS: tuple[str, ...] = (
    "actor/pg_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/grad_norm",
    "critic/lr",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/values/mean",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "timing_s/gen",
    "timing_s/update_actor",
    "perf/throughput",
)
assert len(KEYS) == N_KEYS and len(set(KEYS)) == N_KEYS


def make_steps(n: int, seed: int = SEED) -> list[dict[str, float]]:
    """N dicts of 32 plain Python floats (float64 draws), built before any timing."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((n, N_KEYS), dtype=np.float64)
    return [dict(zip(KEYS, row, strict=True)) for row in table.tolist()]


# -- results ----------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    status: str  # "ok", "skipped" or "error"
    reason: str | None = None
    version: str | None = None
    steps: int = 0
    values: int = 0
    init_s: float | None = None
    loop_s: float | None = None
    finish_s: float | None = None
    total_s: float | None = None  # loop + finish (init excluded)
    median_us: float | None = None
    p99_us: float | None = None
    mean_us: float | None = None
    max_us: float | None = None
    values_per_s: float | None = None
    bytes_on_disk: int | None = None
    bytes_per_value: float | None = None
    files: int | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class Skip(Exception):
    """A contender that cannot run here (not installed, refused by its version)."""


def dir_usage(path: Path) -> tuple[int, int]:
    """(sum of file sizes, number of files) under `path`."""
    total = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_size
                files += 1
    return total, files


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def percentile(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_ns:
        return float("nan")
    idx = min(len(sorted_ns) - 1, max(0, int(np.ceil(q / 100.0 * len(sorted_ns))) - 1))
    return float(sorted_ns[idx])


# A contender's setup gets its fresh directory and returns (log, finish, notes): `log` is
# called as log(d, step=i) in the timed loop, `finish` once after it (also timed).
Setup = Callable[[Path], tuple[Callable[..., Any], Callable[[], Any], list[str]]]
#: An untimed step run on a contender's directory and result after its finish.
Hook = Callable[[Path, Result], None]


def drive(name: str, version: str | None, setup: Setup, data: list[dict[str, float]],
          base: Path, *, settle: Hook | None = None, after: Hook | None = None) -> Result:
    """Time one contender. `settle` runs (untimed) before the disk is measured, `after`
    (untimed) after it."""
    n = len(data)
    res = Result(name=name, status="ok", version=version, steps=n, values=n * N_KEYS)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    gc.collect()
    pc = time.perf_counter_ns
    try:
        t0 = pc()
        log, finish, notes = setup(tmp)
        t1 = pc()
        res.notes.extend(notes)
        lat = [0] * n
        t2 = pc()
        for i, d in enumerate(data):
            s = pc()
            log(d, step=i)
            lat[i] = pc() - s
        t3 = pc()
        finish()
        t4 = pc()
    except Skip as exc:
        res.status, res.reason = "skipped", str(exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return res
    except Exception as exc:  # a peer's failure is reported, never fatal
        res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"
        shutil.rmtree(tmp, ignore_errors=True)
        return res
    lat.sort()
    res.init_s = (t1 - t0) / 1e9
    res.loop_s = (t3 - t2) / 1e9
    res.finish_s = (t4 - t3) / 1e9
    res.total_s = (t4 - t2) / 1e9
    res.median_us = percentile(lat, 50) / 1e3
    res.p99_us = percentile(lat, 99) / 1e3
    res.mean_us = sum(lat) / n / 1e3
    res.max_us = lat[-1] / 1e3
    res.values_per_s = res.values / res.total_s
    if settle is not None:
        try:
            settle(tmp, res)
        except Exception as exc:
            res.notes.append(f"settle step failed: {type(exc).__name__}: {exc}")
    size, files = dir_usage(tmp)  # before any compaction
    res.bytes_on_disk, res.files = size, files
    res.bytes_per_value = size / res.values
    if after is not None:
        try:
            after(tmp, res)
        except Exception as exc:
            res.notes.append(f"post-run step failed: {type(exc).__name__}: {exc}")
    shutil.rmtree(tmp, ignore_errors=True)
    return res


# -- contenders -------------------------------------------------------------------------


def setup_floor(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    steps: list[int] = []
    keys: list[str] = []
    values: list[float] = []
    s_append, k_append, v_append = steps.append, keys.append, values.append

    def log(d: Mapping[str, float], step: int) -> None:
        for k, v in d.items():
            s_append(step)
            k_append(k)
            v_append(v)

    def finish() -> None:
        table = pa.table({"step": pa.array(steps, pa.int64()),
                          "key": pa.array(keys, pa.string()),
                          "value": pa.array(values, pa.float64())})
        pq.write_table(table, tmp / "metrics.parquet")

    return log, finish, [f"pyarrow {pa.__version__}, Parquet with default (snappy) compression"]


def make_setup_tracklake(run_name: str, system_metrics: float | bool = False) -> Setup:
    """tracklake with its default options; system metrics off, or sampled every
    `system_metrics` seconds (the loop's cost of sampling, side by side)."""
    def setup(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
        import tracklake

        run = tracklake.init(project="bench", name=run_name, root=tmp, capture_identity=False,
                             system_metrics=system_metrics)
        report: dict[str, Any] = {}

        def finish() -> None:
            report["finish"] = run.finish()

        setup.report = report  # type: ignore[attr-defined]
        sampling = f"system metrics every {system_metrics:g} s" if system_metrics \
            else "system metrics off"
        return run.log, finish, ["default init options (fsync=True, flush_interval=0.5 s), "
                                 + sampling]

    return setup


def setup_wandb(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
    try:
        import wandb
    except ImportError as exc:
        raise Skip(f"wandb not importable ({exc})") from exc
    kwargs: dict[str, Any] = {}
    try:
        kwargs["settings"] = wandb.Settings(
            console="off", save_code=False, disable_git=True, x_disable_stats=True,
            x_disable_meta=True, disable_job_creation=True, silent=True)
    except Exception:  # older/newer wandb without some of these settings: env vars still apply
        kwargs = {}
    run = wandb.init(mode="offline", dir=str(tmp), project="tracklake-bench", **kwargs)

    def finish() -> None:
        run.finish()

    return run.log, finish, ["offline; system stats, git, code and metadata capture off"]


def _wandb_settle(tmp: Path, res: Result) -> None:
    import wandb

    # stop wandb-core now so it does not compete for the CPU with the next contender
    with contextlib.suppress(Exception):
        wandb.teardown()
    data = sum(p.stat().st_size for p in tmp.rglob("*.wandb"))
    res.extra["data_file_bytes_per_value"] = data / res.values


def _mlflow_setup(tmp: Path, uri: str) -> tuple[Callable[..., Any], Callable[[], Any]]:
    import mlflow

    mlflow.set_tracking_uri(uri)
    artifacts = (tmp / "artifacts").as_uri()
    exp = mlflow.create_experiment("tracklake-bench", artifact_location=artifacts)
    mlflow.start_run(experiment_id=exp)

    def finish() -> None:
        mlflow.end_run()

    return mlflow.log_metrics, finish


def setup_mlflow_sqlite(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
    try:
        import mlflow  # noqa: F401
    except ImportError as exc:
        raise Skip(f"mlflow not importable ({exc})") from exc
    log, finish = _mlflow_setup(tmp, f"sqlite:///{tmp / 'mlflow.db'}")
    return log, finish, ["synchronous log_metrics; init includes creating the schema"]


def setup_mlflow_file(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
    try:
        import mlflow
    except ImportError as exc:
        raise Skip(f"mlflow not importable ({exc})") from exc
    notes = []
    previous = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    try:
        log, finish = _mlflow_setup(tmp, (tmp / "mlruns").as_uri())
    except mlflow.exceptions.MlflowException as exc:
        if "MLFLOW_ALLOW_FILE_STORE" not in str(exc) or previous is not None:
            raise Skip(f"mlflow {mlflow.__version__} refuses the file store: "
                       f"{str(exc).splitlines()[0][:160]}") from exc
        # mlflow >= 3.x keeps the file store in maintenance mode behind an opt-in
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        notes.append("file store is deprecated in this mlflow; opted in with "
                     "MLFLOW_ALLOW_FILE_STORE=true")
        try:
            log, finish = _mlflow_setup(tmp, (tmp / "mlruns").as_uri())
        except mlflow.exceptions.MlflowException as exc2:
            raise Skip(f"mlflow {mlflow.__version__} file store unusable even with "
                       f"MLFLOW_ALLOW_FILE_STORE=true: {str(exc2).splitlines()[0][:160]}") from exc2
    return log, finish, notes


def setup_tensorboard(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
    try:
        from tensorboard.summary import Writer

        writer = Writer(str(tmp))
        note = "tensorboard.summary.Writer (no TensorFlow), add_scalar per key"
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise Skip("neither tensorboard.summary.Writer nor tensorboardX importable") from exc
        writer = SummaryWriter(logdir=str(tmp))
        note = "tensorboardX.SummaryWriter, add_scalar per key"
    add = writer.add_scalar

    def log(d: Mapping[str, float], step: int) -> None:
        for k, v in d.items():
            add(k, v, step)

    return log, writer.close, [note, "one 'call' = the 32 add_scalar calls of a step"]


def setup_swanlab(tmp: Path) -> tuple[Callable[..., Any], Callable[[], Any], list[str]]:
    try:
        import swanlab
    except ImportError as exc:
        raise Skip(f"swanlab not importable ({exc})") from exc
    notes = []
    kwargs: dict[str, Any] = {}
    try:
        probe = swanlab.Settings.Probe(monitor=False, hardware=False, runtime=False,
                                       requirements=False, conda=False, git=False)
        kwargs["settings"] = swanlab.Settings(probe=probe)
        notes.append("hardware monitor and environment probes off")
    except Exception:
        kwargs = {}
    with contextlib.redirect_stdout(sys.stderr):  # its banner would break the tables
        run = swanlab.init(mode="offline", log_dir=str(tmp), project="tracklake-bench", **kwargs)

    def finish() -> None:
        with contextlib.redirect_stdout(sys.stderr):
            swanlab.finish()

    log = getattr(run, "log", None) or swanlab.log
    return log, finish, ["offline mode", *notes]


# -- tracklake specifics ----------------------------------------------------------------


def count_tracklake_values(root: Path) -> tuple[int, int, list[str]]:
    """Rows found in the metric segments (read back and verified) and segment count."""
    problems: list[str] = []
    try:
        from tracklake._format.segment import read_segment
    except ImportError:
        read_segment = None
    rows = segs = 0
    for path in sorted((root / "metrics").rglob("*.arrows")):
        segs += 1
        if read_segment is not None:
            c = read_segment(path)
            rows += sum(b.num_rows for b in c.batches)
            if not c.sealed or c.torn_bytes or c.damaged:
                problems.append(f"{path.name}: sealed={c.sealed} torn={c.torn_bytes} "
                                f"damaged={c.damaged}")
        else:
            import pyarrow as pa

            with pa.ipc.open_stream(path.read_bytes()) as r:
                rows += sum(b.num_rows for b in r)
    return rows, segs, problems


def tracklake_after(setup: Setup) -> Hook:
    def after(tmp: Path, res: Result) -> None:
        import tracklake

        report = getattr(setup, "report", {}).get("finish")
        if report is not None:
            res.extra["finish_complete"] = report.complete
            if not report.complete:
                res.notes.append(f"finish() reported incomplete: {report}")
        rows, segs, problems = count_tracklake_values(tmp)
        res.extra["rows_read_back"] = rows
        res.extra["metric_segments"] = segs
        if rows != res.values:
            res.notes.append(f"read back {rows} metric rows, expected {res.values}")
        res.notes.extend(problems)
        data_bytes = sum(p.stat().st_size for p in (tmp / "metrics").rglob("*.arrows"))
        res.extra["data_file_bytes_per_value"] = data_bytes / res.values
        try:
            compact = tracklake.compact
        except AttributeError:
            res.extra["compaction"] = "compaction not available"
            print("  tracklake: compaction not available (no tracklake.compact)")
            return
        t = time.perf_counter()
        creport = compact(root=tmp)
        res.extra["compaction_s"] = time.perf_counter() - t
        size, files = dir_usage(tmp)
        res.extra["bytes_per_value_after_compaction"] = size / res.values
        res.extra["files_after_compaction"] = files
        for attr in ("parts_written", "segments_removed", "skipped", "torn"):
            value = getattr(creport, attr, None)
            if value is not None:
                res.extra[f"compaction_{attr}"] = len(value)
        import pyarrow.parquet as pq

        parquet_rows = sum(pq.ParquetFile(p).metadata.num_rows
                           for p in (tmp / "metrics").rglob("*.parquet"))
        res.extra["rows_in_parquet_after_compaction"] = parquet_rows
        if parquet_rows != res.values:
            res.notes.append(f"after compaction the metric parts hold {parquet_rows} rows, "
                             f"expected {res.values}")
        res.extra["compaction"] = "ok"

    return after


def sustained_tracklake(steps: int, base: Path, pool: list[dict[str, float]]) -> dict[str, Any]:
    """Log steps x 32 values as fast as possible; values/s including the final flush."""
    import tracklake

    tmp = Path(tempfile.mkdtemp(prefix="tracklake-sustained-", dir=base))
    m = len(pool)
    gc.collect()
    t0 = time.perf_counter()
    run = tracklake.init(project="bench", name="sustained", root=tmp, capture_identity=False)
    t1 = time.perf_counter()
    log = run.log
    lat = [0] * steps
    pc = time.perf_counter_ns
    for i in range(steps):
        s = pc()
        log(pool[i % m], step=i)
        lat[i] = pc() - s
    t2 = time.perf_counter()
    report = run.finish()
    t3 = time.perf_counter()
    values = steps * N_KEYS
    lat.sort()
    size, files = dir_usage(tmp)
    rows, segs, problems = count_tracklake_values(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "steps": steps, "values": values, "init_s": t1 - t0, "loop_s": t2 - t1,
        "finish_s": t3 - t2, "total_s": t3 - t1,
        "values_per_s": values / (t3 - t1),
        "values_per_s_loop_only": values / (t2 - t1),
        "median_us": percentile(lat, 50) / 1e3, "p99_us": percentile(lat, 99) / 1e3,
        "p999_us": percentile(lat, 99.9) / 1e3, "max_call_us": lat[-1] / 1e3,
        "bytes_per_value": size / values, "files": files,
        "finish_complete": report.complete, "rows_read_back": rows, "metric_segments": segs,
        "problems": problems,
    }
    return out


def warm_up_pyarrow(base: Path) -> None:
    """Pay pyarrow's one-time costs (Parquet writer, IPC writer, compute kernels) up front,
    so that neither the floor nor tracklake, which both write with pyarrow, is charged for
    them in its timed finish."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = Path(tempfile.mkdtemp(prefix="warmup-", dir=base))
    t = pa.table({"step": pa.array([0, 1], pa.int64()), "key": ["a", "b"],
                  "value": pa.array([0.5, 1.5], pa.float64())})
    pq.write_table(t, tmp / "w.parquet")
    with pa.ipc.new_stream(pa.BufferOutputStream(), t.schema) as w:
        w.write_table(t)
    shutil.rmtree(tmp, ignore_errors=True)


# -- output -----------------------------------------------------------------------------


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_results(results: list[Result], ratios: list[dict[str, Any]],
                  sustained: dict[str, Any] | None, meta: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain aligned text
        Console = None  # type: ignore[assignment,misc]

    cols = ["contender", "version", "init s", "median µs", "p99 µs", "max µs", "loop s",
            "finish s", "total s", "values/s", "B/value", "files"]
    rows = []
    for r in results:
        if r.status != "ok":
            continue
        rows.append([r.name, r.version or "-", _fmt(r.init_s, ".3f"), _fmt(r.median_us, ".2f"),
                     _fmt(r.p99_us, ".2f"), _fmt(r.max_us, ".0f"), _fmt(r.loop_s, ".3f"),
                     _fmt(r.finish_s, ".3f"), _fmt(r.total_s, ".3f"),
                     _fmt(r.values_per_s, ",.0f"), _fmt(r.bytes_per_value, ".2f"),
                     str(r.files)])
    rcols = ["contender", "tracklake median / its median", "its values/s / tracklake's"]
    rrows = [[x["name"], _fmt(x["median_ratio"], ".3f"), _fmt(x["values_per_s_ratio"], ".3f")]
             for x in ratios]
    title = (f"write path: {meta['steps']} steps x {N_KEYS} float metrics = "
             f"{meta['steps'] * N_KEYS:,} values per contender")

    if Console is not None:
        console = Console(width=max(140, shutil.get_terminal_size((140, 40)).columns))
        t = Table(title=title)
        for c in cols:
            t.add_column(c, justify="left" if c in ("contender", "version") else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)
        t2 = Table(title="ratios (tracklake = 1)")
        for c in rcols:
            t2.add_column(c, justify="left" if c == "contender" else "right")
        for row in rrows:
            t2.add_row(*row)
        console.print(t2)
    else:
        for heading, cs, rs in ((title, cols, rows), ("ratios (tracklake = 1)", rcols, rrows)):
            widths = [max(len(c), *(len(r[i]) for r in rs)) if rs else len(c)
                      for i, c in enumerate(cs)]
            print(heading)
            for line in (cs, *rs):
                print("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                for i, (v, w) in enumerate(zip(line, widths, strict=True))))
            print()

    for r in results:
        if r.status != "ok":
            print(f"{r.name}: {r.status.upper()} - {r.reason}")
    print("notes:")
    for r in results:
        if r.status == "ok":
            extra = ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in r.extra.items())
            print(f"  {r.name}: " + "; ".join(r.notes + ([extra] if extra else [])))
    if sustained is not None:
        s = sustained
        print(f"sustained tracklake: {s['values']:,} values ({s['steps']:,} steps x {N_KEYS}) "
              f"in {s['total_s']:.3f} s incl. finish ({s['loop_s']:.3f} s loop + "
              f"{s['finish_s']:.3f} s finish) = {s['values_per_s']:,.0f} values/s "
              f"({s['values_per_s_loop_only']:,.0f} values/s loop only); per call median "
              f"{s['median_us']:.2f} µs, p99 {s['p99_us']:.2f} µs, p99.9 {s['p999_us']:.0f} µs, "
              f"max {s['max_call_us']:,.0f} µs; {s['bytes_per_value']:.2f} B/value on disk in "
              f"{s['files']} files; finish complete={s['finish_complete']}, "
              f"rows read back={s['rows_read_back']:,} in {s['metric_segments']} segment(s)")
        for p in s["problems"]:
            print(f"  problem: {p}")


# -- main -------------------------------------------------------------------------------

CONTENDERS = ("floor", "tracklake", "tracklake-system", "wandb", "mlflow-sqlite", "mlflow-file",
              "tensorboard", "swanlab")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps per contender (default 2000)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 300 steps, 5,000 sustained steps")
    ap.add_argument("--sustained-steps", type=int, default=40_000,
                    help="steps of 32 values for the sustained tracklake run (0 to skip)")
    ap.add_argument("--only", default=",".join(CONTENDERS),
                    help=f"comma-separated subset of {','.join(CONTENDERS)}")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--media-bytes", action="store_true",
                    help="only the bytes per histogram and image against TensorBoard's and "
                         "W&B's files "
                         "(benchmarks/media_bytes.py)")
    args = ap.parse_args(argv)
    if args.media_bytes:
        from media_bytes import main as media_bytes

        measured = media_bytes(steps=50 if args.quick else 200)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {name: [asdict(m) for m in found] for name, found in measured.items()},
                indent=2))
        return 0
    if args.quick:
        args.steps = 300
        args.sustained_steps = min(args.sustained_steps, 5_000)
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(chosen) - set(CONTENDERS)
    if unknown:
        ap.error(f"unknown contenders: {', '.join(sorted(unknown))}")

    base = Path(tempfile.mkdtemp(prefix="tracklake-bench-"))
    aux = base / "aux"  # peers' caches and configs, outside every measured directory
    for sub in ("wandb-cache", "wandb-config", "wandb-data", "wandb-artifacts", "swanlab-root"):
        (aux / sub).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_CACHE_DIR", str(aux / "wandb-cache"))
    os.environ.setdefault("WANDB_CONFIG_DIR", str(aux / "wandb-config"))
    os.environ.setdefault("WANDB_DATA_DIR", str(aux / "wandb-data"))
    os.environ.setdefault("WANDB_ARTIFACT_DIR", str(aux / "wandb-artifacts"))
    os.environ.setdefault("SWANLAB_ROOT", str(aux / "swanlab-root"))

    versions = {d: version_of(d) for d in ("tracklake", "pyarrow", "numpy", "wandb", "mlflow",
                                           "mlflow-skinny", "tensorboard", "tensorboardX",
                                           "swanlab", "rich")}
    meta = {"steps": args.steps, "keys": N_KEYS, "seed": SEED, "python": sys.version.split()[0],
            "platform": platform.platform(), "cpus": os.cpu_count(), "versions": versions,
            "temp_base": str(base)}
    print(f"tracklake write-path benchmark: {args.steps} steps x {N_KEYS} keys, python "
          f"{meta['python']}, {meta['cpus']} CPUs, temp dirs under {base}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))

    data = make_steps(args.steps)
    warm_up_pyarrow(base)
    tl_setup = make_setup_tracklake("write-path")
    plan: dict[str, tuple[str, str | None, Setup, Hook | None, Hook | None]] = {
        "floor": ("floor (append+Parquet)", versions["pyarrow"], setup_floor, None, None),
        "tracklake": ("tracklake", versions["tracklake"], tl_setup, None,
                      tracklake_after(tl_setup)),
        # sampling 100 times as often as the default 10 s, so that its cost shows
        "tracklake-system": ("tracklake + system metrics (0.1 s)", versions["tracklake"],
                             make_setup_tracklake("write-path-system", 0.1), None, None),
        "wandb": ("wandb offline", versions["wandb"], setup_wandb, _wandb_settle, None),
        "mlflow-sqlite": ("mlflow sqlite", versions["mlflow"] or versions["mlflow-skinny"],
                          setup_mlflow_sqlite, None, None),
        "mlflow-file": ("mlflow file store", versions["mlflow"] or versions["mlflow-skinny"],
                        setup_mlflow_file, None, None),
        "tensorboard": ("tensorboard", versions["tensorboard"] or versions["tensorboardX"],
                        setup_tensorboard, None, None),
        "swanlab": ("swanlab offline", versions["swanlab"], setup_swanlab, None, None),
    }

    results: list[Result] = []
    try:
        for key in CONTENDERS:
            if key not in chosen:
                continue
            name, version, setup, settle, after = plan[key]
            print(f"- {name} ...", flush=True)
            r = drive(name, version, setup, data, base, settle=settle, after=after)
            results.append(r)
            if r.status == "ok":
                print(f"  median {r.median_us:.2f} µs, p99 {r.p99_us:.2f} µs, total "
                      f"{r.total_s:.3f} s, {r.values_per_s:,.0f} values/s, "
                      f"{r.bytes_per_value:.2f} B/value", flush=True)
            else:
                print(f"  {r.status}: {r.reason}", flush=True)

        sustained = None
        if "tracklake" in chosen and args.sustained_steps > 0:
            print(f"- tracklake sustained: {args.sustained_steps:,} steps x {N_KEYS} = "
                  f"{args.sustained_steps * N_KEYS:,} values ...", flush=True)
            pool = data if len(data) >= 1000 else make_steps(1000, SEED + 1)
            sustained = sustained_tracklake(args.sustained_steps, base, pool)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    tl = next((r for r in results if r.name == "tracklake" and r.status == "ok"), None)
    ratios = []
    if tl is not None:
        for r in results:
            if r.status == "ok" and r is not tl:
                ratios.append({
                    "name": r.name,
                    "median_ratio": (tl.median_us / r.median_us
                                     if tl.median_us and r.median_us else None),
                    "values_per_s_ratio": (r.values_per_s / tl.values_per_s
                                           if r.values_per_s and tl.values_per_s else None),
                })
    print()
    print_results(results, ratios, sustained, meta)

    if args.json:
        out = {"meta": meta, "results": [asdict(r) for r in results], "ratios": ratios,
               "sustained": sustained}
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
