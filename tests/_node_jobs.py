"""What the processes on the test bed's nodes (`_nodes.Node`) run: each a function called
as ``import _node_jobs; _node_jobs.<name>(...)``, reading and writing the store at
``$TRACKLAKE_ROOT`` (the node's mount) and printing what it saw as JSON lines."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tracklake

KEYS = ("loss", "reward", "kl")


def value(rank: int, step: int, key: str) -> float:
    return rank * 1000.0 + step + KEYS.index(key) / 10


def write_rank(run: str, rank: int, steps: int, pause: float, hang_at: int = -1,
               hold_finish: bool = False) -> None:
    """Rank `rank` of `run`: `steps` steps of `KEYS`, a flush every 25 steps, `pause`
    seconds between steps. From step `hang_at` on it prints the longest `log()` call
    (the test hangs this node's mount there). With `hold_finish`, it says "written" after
    the last step and finishes the run once a line comes on stdin."""
    longest = 0.0
    with tracklake.init(project="p", run_id=run, rank=rank,
                        capture_identity=False, system_metrics=False) as r:
        for step in range(steps):
            start = time.monotonic()
            r.log({k: value(rank, step, k) for k in KEYS}, step=step)
            if step >= hang_at >= 0:
                longest = max(longest, time.monotonic() - start)
            if step == hang_at:
                print("hang", flush=True)
                sys.stdin.readline()  # the test has hung the mount, and says when
            if step % 25 == 24:
                r.flush(timeout=0.5)
            time.sleep(pause)
        if hold_finish:
            print("written", flush=True)
            sys.stdin.readline()
    print(json.dumps({"longest_log": longest}), flush=True)


def watch(run: str, until: str, every: float, no_retention: str) -> None:
    """Until file `until` exists: count each rank's metric rows of `run`, compact, export
    to TensorBoard (``$EXPORT_DIR``, every rank), apply a retention deleting every run
    ended over 5 minutes ago (until file `no_retention` exists) and back up to
    ``$BACKUP_DIR``; print the counts, statuses and deleted runs of each pass (None: no
    retention)."""
    from tracklake.exporters import ExportOptions, Selection, export
    from tracklake.exporters.tensorboard.destination import TensorBoardDestination

    root = Path(os.environ["TRACKLAKE_ROOT"])
    while not Path(until).exists():
        counts = {str(r["rank"]): r["n"] for r in tracklake.query(
            "SELECT rank, count(*) AS n FROM metrics WHERE run = ? GROUP BY rank",
            params=[run]).to_pylist()}
        status = {str(r["rank"]): r["status"] for r in tracklake.query(
            "SELECT rank, status FROM run_attempts WHERE run = ?", params=[run]).to_pylist()}
        tracklake.compact(root=root)
        export(TensorBoardDestination(logdir=os.environ["EXPORT_DIR"]), root=root,
               selection=Selection(runs=(run,)), options=ExportOptions(ranks="all"),
               log=lambda _: None)
        retained = None if Path(no_retention).exists() else retain_old(root)
        backup_to(os.environ["BACKUP_DIR"])
        print(json.dumps({"counts": counts, "status": status, "retained": retained}),
              flush=True)
        time.sleep(every)


def retain_old(root: Path) -> list[str]:
    """Apply a retention that deletes every run ended over 5 minutes ago, exported or
    not; the runs it deleted."""
    from tracklake._ops.retention import Policy, apply_plan, make_plan

    runs = [r["run"] for r in tracklake.query("SELECT run FROM runs").to_pylist()]
    plan = make_plan(root, Policy(max_age=300.0), time.time(), force=runs)
    apply_plan(root, plan, time.time())
    return sorted(a.run for a in plan.actions if a.verb == "delete")


def counts(run: str) -> None:
    """Each rank's metric rows and values of `run`, and each rank's shown status."""
    rows = tracklake.query("SELECT rank, step, key, value FROM metrics WHERE run = ?",
                           params=[run]).to_pylist()
    wrong = [r for r in rows if r["value"] != value(r["rank"], r["step"], r["key"])]
    status = {str(r["rank"]): r["status"] for r in tracklake.query(
        "SELECT rank, status FROM run_attempts WHERE run = ?", params=[run]).to_pylist()}
    by_rank: dict[str, int] = {}
    for r in rows:
        by_rank[str(r["rank"])] = by_rank.get(str(r["rank"]), 0) + 1
    print(json.dumps({"counts": by_rank, "wrong": len(wrong), "status": status}))


def hold_claim(stream_dir: str, refresh: float) -> None:
    """Hold the compaction claim of a stream directory, refreshing it every `refresh`
    seconds as a compactor does, until stdin closes."""
    import threading

    from tracklake._ops.claims import hold_claim as hold

    root = Path(os.environ["TRACKLAKE_ROOT"])
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    with hold(root / stream_dir, root=root) as claim:
        assert claim is not None
        print("held", flush=True)
        while not done.wait(refresh):
            os.utime(claim)


def compact_until_taken(stream_dir: str, stale_after: float, passes: int,
                        every: float) -> None:
    """Compact the store `passes` times, `every` seconds apart, with claims stale after
    `stale_after` seconds; print whether each pass found the stream busy."""
    import tracklake._ops.claims as claims

    claims.CLAIM_STALE_SECONDS = stale_after
    root = Path(os.environ["TRACKLAKE_ROOT"])
    for _ in range(passes):
        report = tracklake.compact(root=root)
        busy = any(Path(d) == root / stream_dir for d in report.busy)
        print(json.dumps({"busy": busy}), flush=True)
        time.sleep(every)


def small_runs(count: int, steps: int, offset: float) -> None:
    """Runs ``r0`` ... of `steps` steps of ``x`` each (value: step + `offset`), finished;
    a run already there gets a new attempt."""
    for i in range(count):
        with tracklake.init(project="p", run_id=f"r{i}", capture_identity=False,
                            system_metrics=False, compact=False) as r:
            for step in range(steps):
                r.log({"x": step + offset}, step=step)


def bundled_answers() -> None:
    """What the store answers about run r0 (its values by step), and how many bundles
    it holds, after a compaction that bundles the settled runs."""
    report = tracklake.compact(root=Path(os.environ["TRACKLAKE_ROOT"]))
    bundles = len(report.bundles.written) if report.bundles is not None else 0
    rows = tracklake.query("SELECT step, value FROM metrics WHERE run = 'r0' ORDER BY step"
                           ).to_pylist()
    print(json.dumps({"bundles": bundles, "r0": [[r["step"], r["value"]] for r in rows]}))


def follow(run: str, logdir: str, state_dir: str) -> None:
    """`tracklake export tensorboard --follow` of `run`, every rank, polling twice a
    second (as a follower on another host must: no file events from other hosts); it
    ends once the run has finished."""
    from tracklake._cli.main import main

    main(["export", "tensorboard", "--follow", "--run", run, "--ranks", "all",
          "--poll-interval", "0.5", "--logdir", logdir, "--state-dir", state_dir, "-q"],
         standalone_mode=False)


def backup_to(dest: str) -> None:
    """Back the store up to `dest` (files it does not hold yet)."""
    from tracklake._ops.backup.backup import backup

    backup(Path(os.environ["TRACKLAKE_ROOT"]), dest)


def log_until_signal(run: str, hang_at: int) -> None:
    """Rank 0 of `run`: `KEYS` step after step, a flush every 25 steps printing "flushed S"
    once the steps up to S are written; at step `hang_at` it prints "hang" and waits for a
    line on stdin (the test hangs this node's mount there), once a shipping round has
    shipped what it flushed (in ship mode, with rounds an hour apart: no round is under
    way when the mount hangs). It ends only by a signal, finishing within
    $SIGTERM_FINISH seconds of a SIGTERM."""
    import tracklake._write.lifecycle as lifecycle

    lifecycle.SIGTERM_FINISH_SECONDS = float(os.environ["SIGTERM_FINISH"])
    r = tracklake.init(project="p", run_id=run, capture_identity=False, system_metrics=False)
    step = 0
    while True:
        r.log({k: value(0, step, k) for k in KEYS}, step=step)
        if step % 25 == 24 and r.flush(timeout=5):
            print(f"flushed {step}", flush=True)
        if step == hang_at:
            r.flush()
            assert r._shipping is not None and r._shipping._round()
            print("hang", flush=True)
            sys.stdin.readline()
        step += 1
        time.sleep(0.005)


def ship(local: str) -> None:
    """`tracklake ship --local LOCAL` on this node, into its store."""
    from tracklake._cli.main import main

    main(["ship", "--local", local], standalone_mode=False)
